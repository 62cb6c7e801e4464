"""Tests of medallion_assets.io_manager."""
