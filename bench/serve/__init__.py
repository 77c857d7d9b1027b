"""moa-cpp serve measured and shown."""
