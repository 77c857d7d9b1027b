"""what each piece of speculative decoding costs."""
