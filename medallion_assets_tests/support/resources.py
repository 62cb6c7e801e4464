"""The resources of a Dagster run on a lake of its own: Spark, the lake, the Delta IO manager."""

from __future__ import annotations

from medallion_assets.io_manager import DeltaIOManager
from medallion_assets.resources import LakeResource, SparkResource


def io_manager_resources(tmp_path, **io_manager_settings) -> dict:
    """``spark``, ``lake`` (rooted at ``tmp_path / "lake"``) and ``io_manager`` with ``io_manager_settings``."""
    lake = LakeResource(root=str(tmp_path / "lake"))
    spark = SparkResource(master="local[2]")
    return {"spark": spark, "lake": lake, "io_manager": DeltaIOManager(spark=spark, lake=lake, **io_manager_settings)}
