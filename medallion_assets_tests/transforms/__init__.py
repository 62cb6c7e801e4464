"""Tests of the pure transforms, one module per layer."""
