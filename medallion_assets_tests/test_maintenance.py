"""The weekly maintenance job: OPTIMIZE and VACUUM of every table, within Delta's retention rules."""

from __future__ import annotations

import os

import deltalake
import pytest
from dagster import DagsterInstance

from medallion_assets.jobs import table_maintenance
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets_tests.support.readers import read_with_duckdb

pytestmark = pytest.mark.both_engines


def _small_files_table(spark, path: str, appends: int) -> None:
    for i in range(appends):
        spark.range(i * 10, i * 10 + 10).write.format("delta").mode("append").save(path)


def test_maintenance_compacts_every_table_and_keeps_recent_files(spark, tmp_path):
    lake = LakeResource(root=str(tmp_path / "lake"))
    silver = os.path.join(lake.root, "silver", "orders")
    gold = os.path.join(lake.root, "gold", "pricing_summary")
    _small_files_table(spark, silver, 4)
    _small_files_table(spark, gold, 3)
    os.makedirs(os.path.join(lake.root, "silver", "not_a_table"))

    result = table_maintenance.execute_in_process(
        resources={"spark": SparkResource(), "lake": lake},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    for path, rows in ((silver, 40), (gold, 30)):
        table = deltalake.DeltaTable(path)
        assert len(table.file_uris()) == 1, "small files are compacted into one"
        assert table.history(1)[0]["operation"] in ("OPTIMIZE", "VACUUM END")
        assert sorted(read_with_duckdb(path).column("id").to_pylist()) == list(range(rows))
        # VACUUM keeps 7 days: the files OPTIMIZE replaced are still there for time travel.
        assert deltalake.DeltaTable(path, version=0).to_pyarrow_table().num_rows == 10


def test_maintenance_refuses_a_retention_below_seven_days(spark, tmp_path):
    lake = LakeResource(root=str(tmp_path / "lake"))
    with pytest.raises(Exception, match="168"):
        table_maintenance.execute_in_process(
            resources={"spark": SparkResource(), "lake": lake},
            run_config={"ops": {"optimize_and_vacuum": {"config": {"retention_hours": 1}}}},
            instance=DagsterInstance.ephemeral(),
        )
