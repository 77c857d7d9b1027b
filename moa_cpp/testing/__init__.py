"""Test and benchmark helpers that are not part of the product: the oracle proposer."""
