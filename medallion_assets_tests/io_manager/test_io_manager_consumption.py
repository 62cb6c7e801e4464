"""What a step consumed of an upstream's changes: kept in its tables' Delta logs, not in the IO manager.

The input table is written by delta-rs (``write_deltalake``), not by the engine
under test. The step under test splits new events into a silver table and a
quarantine table (both appends, so a re-read would show up as duplicates).
Runs go through Dagster's multiprocess executor (each step in its own process,
with its own SparkSession) and through fresh Dagster instances (a wiped
instance must not make a step read again what its tables already took in).
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import (
    AssetIn,
    AssetKey,
    AssetOut,
    AssetSpec,
    DagsterInstance,
    Definitions,
    Output,
    asset,
    define_asset_job,
    execute_job,
    materialize,
    multi_asset,
    multiprocess_executor,
    reconstructable,
)
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from medallion_assets.io_manager import DeltaIOManager, delta_table
from medallion_assets.resources import LakeResource, lake_resource, spark_resource
from medallion_assets_tests.support.readers import read_with_deltalake

pytestmark = pytest.mark.both_engines

EVENTS = AssetKey(["bronze", "events"])
GOOD = AssetKey(["silver", "events"])
BAD = AssetKey(["quarantine", "events"])
TOTAL = AssetKey(["gold", "event_total"])


@multi_asset(
    outs={
        "good": AssetOut(key=GOOD, metadata=delta_table(write_mode="append")),
        "bad": AssetOut(key=BAD, metadata=delta_table(write_mode="append")),
    },
    ins={"events": AssetIn(key=EVENTS, metadata={"delta/read": "changes"})},
)
def split_events(events: DataFrame):
    """Events with a positive amount go to silver, the others to quarantine."""
    yield Output(events.where(F.col("amount") > 0).select("id", "amount"), output_name="good")
    yield Output(events.where(F.col("amount") <= 0).select("id", "amount"), output_name="bad")


@asset(key=TOTAL, ins={"events": AssetIn(key=GOOD)})
def event_total(events: DataFrame) -> DataFrame:
    """Sum of the good amounts: a whole-table input read in a process of its own."""
    return events.groupBy().agg(F.sum("amount").alias("total"))


def _assets():
    return [AssetSpec(EVENTS), split_events, event_total]


def _resources(lake: LakeResource) -> dict:
    spark = spark_resource("local")
    return {"spark": spark, "lake": lake, "io_manager": DeltaIOManager(spark=spark, lake=lake)}


def consumption_job():
    """The graph as a job on the multiprocess executor, rebuilt in each step's process.

    Its lake is ``MEDALLION_LAKE_ROOT``, which the step processes inherit.
    """
    definitions = Definitions(
        assets=_assets(),
        jobs=[define_asset_job("consumption", selection=[GOOD, BAD, TOTAL])],
        resources=_resources(lake_resource()),
        executor=multiprocess_executor.configured({"max_concurrent": 1}),
    )
    return definitions.resolve_job_def("consumption")


def _land(path: str, rows: list[tuple[int, int]], *, create: bool = False) -> None:
    table = pa.table(
        {"id": pa.array([r[0] for r in rows], pa.int64()), "amount": pa.array([r[1] for r in rows], pa.int64())}
    )
    write_deltalake(
        path,
        table,
        mode="append",
        configuration={"delta.enableChangeDataFeed": "true"} if create else None,
    )


def _instance(folder) -> DagsterInstance:
    """A Dagster instance of its own, on disk, as the multiprocess executor needs."""
    folder.mkdir()
    return DagsterInstance.local_temp(str(folder))


def _version(path: str) -> int:
    return DeltaTable(path).version()


def _ids(path: str) -> list[int]:
    return sorted(row["id"] for row in read_with_deltalake(path).to_pylist())


@pytest.mark.slow
def test_a_step_reads_each_upstream_commit_once_across_executors_and_instances(spark, tmp_path, monkeypatch):
    lake = LakeResource(root=str(tmp_path / "lake"))
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", lake.root)
    events, good, bad = (lake.table_path(key.path) for key in (EVENTS, GOOD, BAD))

    # Run 1, multiprocess executor: good and bad rows.
    _land(events, [(1, 10), (2, -1), (3, 30)], create=True)
    with _instance(tmp_path / "dagster_1") as instance:
        result = execute_job(reconstructable(consumption_job), instance=instance, raise_on_error=True)
        assert result.success
        total = result.asset_materializations_for_node("gold__event_total")
    assert _ids(good) == [1, 3]
    assert _ids(bad) == [2]
    assert [row["total"] for row in read_with_deltalake(lake.table_path(TOTAL.path)).to_pylist()] == [40]
    assert total, "the gold step ran in its own process and stored its table"

    # Run 2, a new instance (the first one's event log is gone): only good rows land.
    # The quarantine gets no row, and an empty commit records that it took version 1 in.
    _land(events, [(4, 40), (5, 50)])
    result = materialize(_assets(), resources=_resources(lake))
    assert result.success
    assert _ids(good) == [1, 3, 4, 5]
    assert _ids(bad) == [2]
    # Each output names what the step read: the changes after version 0 (run 1's), up to version 1.
    read = {
        m.asset_key: m.metadata["medallion/inputs"].value
        for m in result.asset_materializations_for_node("split_events")
    }
    assert read == {key: {"bronze/events": {"changes_after_version": 0, "version": 1}} for key in (GOOD, BAD)}

    # Run 3, a new instance again: only a bad row lands.
    _land(events, [(6, 0)])
    assert materialize(_assets(), resources=_resources(lake)).success
    assert _ids(good) == [1, 3, 4, 5]
    assert _ids(bad) == [2, 6]

    # Run 4, nothing new: nothing is read again, and no table gains a commit.
    versions = {path: _version(path) for path in (good, bad)}
    assert materialize(_assets(), resources=_resources(lake)).success
    assert _ids(good) == [1, 3, 4, 5]
    assert _ids(bad) == [2, 6]
    assert {path: _version(path) for path in (good, bad)} == versions
