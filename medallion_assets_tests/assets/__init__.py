"""Tests of medallion_assets.assets."""
