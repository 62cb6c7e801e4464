"""Resources: validated at construction, lazy, paths resolved when used."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from medallion_assets.resources import LakeResource, SparkResource


def test_lake_layout(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    assert lake.table_path(["silver", "orders"]) == str(tmp_path / "silver" / "orders")
    assert lake.checkpoint_dir("orders_raw") == str(tmp_path / "_checkpoints" / "orders_raw")
    assert lake.landing_folder("customers_cdc") == str(tmp_path / "landing" / "customers")
    with pytest.raises(ValueError):
        lake.table_path(["orders"])


def test_lake_lists_table_folders(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    assert lake.table_paths("gold") == []  # no layer folder yet
    for name in ("orders", "lineitem"):
        (tmp_path / "silver" / name / "_delta_log").mkdir(parents=True)
    (tmp_path / "silver" / "README").write_text("not a table")
    assert lake.table_paths("silver") == [str(tmp_path / "silver" / "lineitem"), str(tmp_path / "silver" / "orders")]


def test_lake_root_must_not_be_blank():
    with pytest.raises(ValidationError):
        LakeResource(root="  ")


def test_spark_needs_master_or_remote():
    with pytest.raises(ValidationError):
        SparkResource(master=None, remote=None)


def test_spark_session_is_shared_and_delta_enabled(spark):
    resource = SparkResource(master="local[2]")
    assert resource.spark_session is spark  # getOrCreate: one JVM for the test session
