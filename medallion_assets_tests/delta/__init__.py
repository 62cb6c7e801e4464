"""Tests of medallion_assets.delta."""
