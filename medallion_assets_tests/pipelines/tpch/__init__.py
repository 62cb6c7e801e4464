"""Tests of medallion_assets.pipelines.tpch."""
