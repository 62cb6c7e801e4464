"""Helpers of the tests: not tests themselves (processes the tests start, independent readers, fixtures' parts)."""
