"""The Delta IO manager's overwrites, partitioned writes and appends through real Dagster runs on real Delta tables.

Which writer commits them: deltalake for a small one, Spark past the bound or where deltalake cannot.
"""

from __future__ import annotations

import pytest
from dagster import AssetIn, AssetKey, MonthlyPartitionsDefinition, asset, materialize
from pyspark.sql import functions as F

from medallion_assets.io_manager import DeltaIOManager, delta_table
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.client import DeltaTableClient
from medallion_assets_tests.support.resources import io_manager_resources as _resources

pytestmark = pytest.mark.both_engines


def test_overwrite_pinned_read_columns_and_unchanged_skip(spark, tmp_path):
    @asset(key=["bronze", "numbers"])
    def numbers():
        return spark.range(10).withColumnRenamed("id", "n")

    @asset(
        key=["gold", "total"], ins={"numbers": AssetIn(key=["bronze", "numbers"], metadata={"delta/columns": ["n"]})}
    )
    def total(numbers):
        return numbers.groupBy().agg(F.sum("n").alias("total"))

    resources = _resources(tmp_path)
    first = materialize([numbers, total], resources=resources)
    assert first.success
    client = DeltaTableClient(spark)
    gold_path = resources["lake"].table_path(["gold", "total"])
    version = client.latest_version(gold_path)
    # What each step read: nothing (no entry), or the upstream and the version it read.
    numbers_version = client.latest_version(resources["lake"].table_path(["bronze", "numbers"]))
    assert "medallion/inputs" not in first.asset_materializations_for_node("bronze__numbers")[0].metadata
    read = first.asset_materializations_for_node("gold__total")[0].metadata["medallion/inputs"].value
    assert read == {"bronze/numbers": {"version": numbers_version}}
    # A new Dagster instance: what the table was computed from is in its own Delta log.
    result = materialize(
        [total, numbers.to_source_asset()], resources=resources, selection=[AssetKey(["gold", "total"])]
    )
    assert result.success
    assert client.latest_version(gold_path) == version  # inputs unchanged -> no new commit
    meta = result.asset_materializations_for_node("gold__total")[0].metadata
    assert "delta/skipped" in meta
    assert meta["medallion/inputs"].value == {"bronze/numbers": {"version": numbers_version}}
    commit = client.last_commit_info(gold_path)
    assert commit.get("dagster_run_id") == first.run_id  # the last commit is still the first run's


def _daily_totals(spark, days: int):
    """A gold-like aggregate of ``days`` rows: a sum, a count Spark knows is never null, a date, a timestamp, a null."""
    import datetime as dt
    from decimal import Decimal

    lines = spark.createDataFrame(
        [
            (day, Decimal(f"{day}.25"), dt.date(1995, 1, 1) + dt.timedelta(days=day), None if day == 0 else f"d{day}")
            for day in range(days)
            for _ in range(2)
        ],
        "day long, amount decimal(12,2), on date, label string",
    )
    return lines.groupBy("day", "on", "label").agg(
        F.sum("amount").alias("total"),
        F.count(F.lit(1)).alias("lines"),
        F.max(F.col("on").cast("timestamp")).alias("at"),
    )


def test_a_small_overwrite_is_committed_by_deltalake_and_a_larger_one_by_spark(spark, tmp_path, delta_engine):
    import deltalake
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.io_manager.metadata import ENGINE_NAME
    from medallion_assets_tests.support.readers import read_with_duckdb

    days = {"n": 0}

    @asset(key=["gold", "daily_totals"])
    def daily_totals():
        return _daily_totals(spark, days["n"])

    lake = LakeResource(root=str(tmp_path / "lake"))
    session = SparkResource(master="local[2]")
    path = lake.table_path(["gold", "daily_totals"])

    def materialize_days(n: int, *, bound: int = 5):
        days["n"] = n
        io_manager = DeltaIOManager(spark=session, lake=lake, arrow_write_max_rows=bound)
        result = materialize([daily_totals], resources={"spark": session, "lake": lake, "io_manager": io_manager})
        [materialization] = result.asset_materializations_for_node("gold__daily_totals")
        # Whoever wrote it, Spark and DuckDB read the rows the asset returned.
        assertDataFrameEqual(DeltaTableClient(spark).read(path), _daily_totals(spark, n))
        assert read_with_duckdb(path).num_rows == n
        return materialization.metadata

    # At most 5 rows: deltalake commits them. The metadata names Spark's types, as the Spark
    # route's would, and the table's columns are nullable, as delta-spark stores a frame's.
    small = materialize_days(4)
    assert (small["delta/engine"].value, small["dagster/row_count"].value) == (ENGINE_NAME, 4)
    assert [(c.name, c.type) for c in small["dagster/column_schema"].schema.columns] == [
        (f.name, f.dataType.simpleString()) for f in _daily_totals(spark, 1).schema.fields
    ]
    assert all(field.nullable for field in deltalake.DeltaTable(path).schema().fields)
    # One row past the bound: Spark writes the output.
    assert materialize_days(6)["delta/engine"].value == delta_engine
    # A table above the bound predicts a large output: Spark, without collecting first.
    assert materialize_days(3)["delta/engine"].value == delta_engine
    assert materialize_days(2)["delta/engine"].value == ENGINE_NAME
    assert materialize_days(2, bound=0)["delta/engine"].value == delta_engine


def test_an_unchanged_small_overwrite_reuses_its_description_without_reading_the_table(spark, tmp_path, monkeypatch):
    from dagster import DagsterInstance

    from medallion_assets.io_manager.metadata import ENGINE_NAME

    @asset(key=["bronze", "numbers"])
    def numbers():
        return spark.range(10).withColumnRenamed("id", "n")

    @asset(key=["gold", "total"], ins={"numbers": AssetIn(key=["bronze", "numbers"])})
    def total(numbers):
        return numbers.groupBy().agg(F.sum("n").alias("total"))

    resources = _resources(tmp_path)
    instance = DagsterInstance.ephemeral()
    first = materialize([numbers, total], resources=resources, instance=instance)
    written = first.asset_materializations_for_node("gold__total")[0].metadata
    assert written["delta/engine"].value == ENGINE_NAME
    described = []
    describe = DeltaTableClient.describe
    monkeypatch.setattr(
        DeltaTableClient,
        "describe",
        lambda client, path, **kwargs: described.append(path) or describe(client, path, **kwargs),
    )
    again = materialize(
        [total, numbers.to_source_asset()],
        resources=resources,
        instance=instance,
        selection=[AssetKey(["gold", "total"])],
    )
    skipped = again.asset_materializations_for_node("gold__total")[0].metadata
    # Inputs unchanged: not written, and described by the earlier materialization of the same version.
    assert "delta/skipped" in skipped and described == []
    for key in ("delta/engine", "delta/version", "dagster/row_count", "preview", "dagster/column_schema"):
        assert skipped[key] == written[key], key


def test_a_small_overwrite_deltalake_cannot_commit_is_written_by_spark(spark, tmp_path, delta_engine):
    if delta_engine != "delta-spark":
        pytest.skip("a table with row tracking, which deltalake does not write, is made here by delta-spark")
    import deltalake
    from pyspark.testing import assertDataFrameEqual

    resources = _resources(tmp_path)
    path = resources["lake"].table_path(["gold", "tracked"])
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, v STRING) USING delta "
        "TBLPROPERTIES ('delta.enableRowTracking' = 'true')"
    )

    @asset(key=["gold", "tracked"])
    def tracked():
        return spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string")

    result = materialize([tracked], resources=resources)
    [materialization] = result.asset_materializations_for_node("gold__tracked")
    assert materialization.metadata["delta/engine"].value == "delta-spark"
    assertDataFrameEqual(DeltaTableClient(spark).read(path), tracked())
    # The table's creation and Spark's overwrite: deltalake's attempt committed nothing.
    assert [entry["operation"] for entry in deltalake.DeltaTable(path).history()] == ["WRITE", "CREATE TABLE"]


def test_time_window_partition_replaces_only_its_month(spark, tmp_path):
    months = MonthlyPartitionsDefinition(start_date="1995-01-01", end_date="1995-04-01")

    @asset(key=["gold", "daily"], partitions_def=months, metadata=delta_table(partition_expr="day"))
    def daily(context):
        start = context.partition_time_window.start.date()
        return spark.createDataFrame([(start, 1.0)], "day date, amount double")

    resources = _resources(tmp_path)
    for key in ("1995-01-01", "1995-02-01", "1995-01-01"):
        assert materialize([daily], resources=resources, partition_key=key).success
    rows = DeltaTableClient(spark).read(resources["lake"].table_path(["gold", "daily"])).collect()
    assert sorted(str(r.day) for r in rows) == ["1995-01-01", "1995-02-01"]


def test_column_names_delta_cannot_store_are_refused_before_writing(spark, tmp_path):
    @asset(key=["gold", "sums"])
    def sums():
        return spark.range(3).groupBy().sum("id")  # column "sum(id)"

    resources = _resources(tmp_path)
    result = materialize([sums], resources=resources, raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.is_step_failure]
    message = (
        failure.step_failure_data.error.cause.message
        if failure.step_failure_data.error.cause
        else failure.step_failure_data.error.message
    )
    assert "sum(id)" in message and "alias" in message
    assert not DeltaTableClient(spark).exists(resources["lake"].table_path(["gold", "sums"]))


def test_append_retried_after_its_commit_lands_once(spark, tmp_path):
    from dagster import Output, RetryPolicy

    from medallion_assets_tests.support.readers import read_with_deltalake

    attempts = {"n": 0}

    @asset(
        key=["quarantine", "rejects"],
        metadata=delta_table(write_mode="append"),
        retry_policy=RetryPolicy(max_retries=1),
    )
    def rejects():
        attempts["n"] += 1
        yield Output(spark.createDataFrame([(1, "bad"), (2, "worse")], "id long, reason string"))
        if attempts["n"] == 1:
            raise RuntimeError("the step fails after its output was written, so the retry policy reruns it")

    resources = _resources(tmp_path)
    assert materialize([rejects], resources=resources, raise_on_error=False).success
    assert attempts["n"] == 2
    table = read_with_deltalake(resources["lake"].table_path(["quarantine", "rejects"]))
    assert sorted(tuple(row.values()) for row in table.to_pylist()) == [(1, "bad"), (2, "worse")]

    # A new run appends: the transaction belongs to a run, not to the table.
    assert materialize([rejects], resources=resources).success
    table = read_with_deltalake(resources["lake"].table_path(["quarantine", "rejects"]))
    assert sorted(tuple(row.values()) for row in table.to_pylist()) == [
        (1, "bad"),
        (1, "bad"),
        (2, "worse"),
        (2, "worse"),
    ]


def test_a_small_append_to_an_existing_table_is_committed_by_deltalake_and_a_larger_one_by_spark(
    spark, tmp_path, delta_engine
):
    import datetime as dt

    import deltalake
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.io_manager.metadata import ENGINE_NAME
    from medallion_assets_tests.support.readers import read_with_duckdb

    schema = "id long, reason string, at timestamp"
    landed: list[tuple] = []
    delivery = {"rows": []}

    @asset(key=["quarantine", "rejects"], metadata=delta_table(write_mode="append"))
    def rejects():
        return spark.createDataFrame(delivery["rows"], schema)

    lake = LakeResource(root=str(tmp_path / "lake"))
    session = SparkResource(master="local[2]")
    path = lake.table_path(["quarantine", "rejects"])

    def append(count: int, *, bound: int = 3):
        first = len(landed)
        delivery["rows"] = [(i, f"bad {i}", dt.datetime(1995, 3, 1 + i, 12, 30)) for i in range(first, first + count)]
        landed.extend(delivery["rows"])
        io_manager = DeltaIOManager(spark=session, lake=lake, arrow_write_max_rows=bound)
        result = materialize([rejects], resources={"spark": session, "lake": lake, "io_manager": io_manager})
        [materialization] = result.asset_materializations_for_node("quarantine__rejects")
        # Whoever committed, Spark and DuckDB read every row appended so far, timestamps included.
        assertDataFrameEqual(DeltaTableClient(spark).read(path), spark.createDataFrame(landed, schema))
        assert read_with_duckdb(path).num_rows == len(landed)
        return materialization.metadata, deltalake.DeltaTable(path).history(1)[0]

    # The first append creates the table: the session's engine writes it.
    metadata, _ = append(1)
    assert metadata["delta/engine"].value == delta_engine
    # At most 3 rows to an existing table: deltalake commits them, and the metadata
    # describes the version it wrote, its columns named by Spark's types.
    metadata, commit = append(3)
    assert (metadata["delta/engine"].value, metadata["dagster/row_count"].value) == (ENGINE_NAME, 4)
    assert (
        int(metadata["delta/version"].value) == commit["version"] and commit["operationMetrics"]["num_added_rows"] == 3
    )
    assert [(c.name, c.type) for c in metadata["dagster/column_schema"].schema.columns] == [
        ("id", "bigint"),
        ("reason", "string"),
        ("at", "timestamp"),
    ]
    # One row past the bound, or no bound: the engine writes.
    assert append(4)[0]["delta/engine"].value == delta_engine
    assert append(1, bound=0)[0]["delta/engine"].value == delta_engine
