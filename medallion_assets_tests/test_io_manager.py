"""The Delta IO manager through real Dagster runs on real Delta tables."""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import AssetIn, AssetKey, MetadataValue, MonthlyPartitionsDefinition, asset, materialize
from pyspark.sql import functions as F

from medallion_assets.io_manager import DeltaIOManager, delta_table
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.client import DeltaTableClient
from medallion_assets.storage.writers import WriterLimits

pytestmark = pytest.mark.both_engines


def _resources(tmp_path, **io_manager_settings):
    lake = LakeResource(root=str(tmp_path / "lake"))
    spark = SparkResource(master="local[2]")
    return {"spark": spark, "lake": lake, "io_manager": DeltaIOManager(spark=spark, lake=lake, **io_manager_settings)}


def _route(merged_by: str) -> dict:
    """The IO manager setting that sends a small MERGE to deltalake (``"deltalake"``) or to the session's engine."""
    return {"arrow_write_max_rows": 0 if merged_by == "engine" else 100}


def _assert_merged_by(result, node: str, merged_by: str, delta_engine: str) -> None:
    """The write's metadata names the route that committed it (on the delta-rs engine both are delta-rs' commits)."""
    from medallion_assets.io_manager.metadata import ENGINE_NAME

    by_deltalake = merged_by == "deltalake" and delta_engine == "delta-spark"
    written = result.asset_materializations_for_node(node)[0].metadata
    assert written["delta/engine"].value == (ENGINE_NAME if by_deltalake else delta_engine)


def test_merge_with_sequence_and_deletes_keeps_newest(spark, tmp_path):
    batches = [
        [(1, 10, "a", False), (2, 10, "b", False), (3, 10, "c", True)],  # 3: delete before its insert
        [(1, 5, "old", False), (2, 20, None, True), (3, 5, "late", False), (4, 1, "d", False)],
    ]
    state = {"batch": 0}

    @asset(
        key=["silver", "things"],
        metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq", delete_column="_deleted"),
    )
    def things():
        rows = batches[state["batch"]]
        return spark.createDataFrame(rows, "id long, seq long, name string, _deleted boolean")

    resources = _resources(tmp_path)
    for batch in range(2):
        state["batch"] = batch
        result = materialize([things], resources=resources)
        assert result.success
    path = resources["lake"].table_path(["silver", "things"])
    rows = sorted(tuple(r) for r in DeltaTableClient(spark).read(path).collect())
    # 1 keeps its newer version, 2 is deleted, 3 is not resurrected by an older upsert.
    assert rows == [(1, 10, "a"), (4, 1, "d")]
    metadata = result.asset_materializations_for_node("silver__things")[0].metadata
    assert metadata["dagster/row_count"].value == 2
    assert "dagster/column_schema" in metadata
    assert metadata["delta/operation"].value == "MERGE"
    assert metadata["dagster/table_name"].value == "spark_catalog.silver.things"
    # The deleted keys are a Delta table of their own, named in the metadata.
    tombstones = metadata["delta/tombstones"].value
    assert tombstones == DeltaTableClient.tombstone_path(path)
    assert sorted(tuple(r) for r in DeltaTableClient(spark).read(tombstones).collect()) == [(2, 20), (3, 10)]


@pytest.mark.parametrize("merged_by", ["deltalake", "engine"])
def test_a_groups_newest_change_replaces_its_stored_rows_and_older_changes_are_ignored(
    spark, tmp_path, delta_engine, merged_by
):
    """Both routes of a group MERGE: deltalake for a small source, the session's engine past ``arrow_write_max_rows``."""
    import deltalake

    from medallion_assets_tests.delta.readers import read_with_deltalake

    # (order, line, seq, price, deleted): each batch restates whole orders.
    batches = [
        [
            (1, 1, 10, 1.0, False),
            (1, 2, 10, 2.0, False),
            (1, 3, 10, 3.0, False),
            (2, 1, 10, 4.0, False),
            (3, 0, 10, None, True),
        ],  # 3: deleted before it was ever stored
        [
            (1, 1, 20, 1.5, False),
            (1, 2, 20, 2.5, False),  # 1 restated without its line 3
            (2, 1, 5, 9.0, False),
            (2, 2, 5, 9.0, False),  # older than 2's stored rows
            (3, 1, 5, 9.0, False),  # older than 3's delete
            (4, 1, 1, 7.0, False),
        ],
        [(4, 0, 2, None, True), (1, 0, 15, None, True)],  # 1's delete is older than its restatement
        # Nothing newer than what is stored, and 3 deleted again while it has no rows.
        [(1, 1, 1, 9.0, False), (2, 1, 9, 9.0, False), (3, 0, 12, None, True)],
        [(3, 1, 11, 9.0, False)],  # newer than 3's first delete, older than its second
    ]
    state = {"batch": 0}

    @asset(
        key=["silver", "lines"],
        metadata=delta_table(
            write_mode="merge",
            merge_keys=["order", "line"],
            sequence_column="seq",
            delete_column="_deleted",
            replace_group="order",
        ),
    )
    def lines():
        return spark.createDataFrame(
            batches[state["batch"]], "order long, line long, seq long, price double, _deleted boolean"
        )

    resources = _resources(tmp_path, **_route(merged_by))
    path = resources["lake"].table_path(["silver", "lines"])
    stored_after = []
    for batch in range(len(batches)):
        state["batch"] = batch
        result = materialize([lines], resources=resources)
        assert result.success
        stored_after.append(sorted(tuple(row.values()) for row in read_with_deltalake(path).to_pylist()))
        if batch == 1:
            # One MERGE replaced order 1's rows (its line 3 gone) and inserted order 4's.
            assert deltalake.DeltaTable(path).history(1)[0]["operation"] == "MERGE"
            _assert_merged_by(result, "silver__lines", merged_by, delta_engine)
    assert stored_after[0] == [(1, 1, 10, 1.0), (1, 2, 10, 2.0), (1, 3, 10, 3.0), (2, 1, 10, 4.0)]
    assert stored_after[1] == [(1, 1, 20, 1.5), (1, 2, 20, 2.5), (2, 1, 10, 4.0), (4, 1, 1, 7.0)]
    assert stored_after[2] == [(1, 1, 20, 1.5), (1, 2, 20, 2.5), (2, 1, 10, 4.0)]
    assert stored_after[3] == stored_after[4] == stored_after[2]
    metadata = result.asset_materializations_for_node("silver__lines")[0].metadata
    assert metadata["delta/skipped"].value == "every change is older than the stored state"
    # Every delete is remembered, an outdated one too (1's, older than its stored rows, bars nothing newer).
    tombstones = read_with_deltalake(DeltaTableClient.tombstone_path(path)).to_pylist()
    assert sorted(tuple(row.values()) for row in tombstones) == [(1, 15), (3, 10), (3, 12), (4, 2)]


@pytest.mark.parametrize("merged_by", ["deltalake", "engine"])
def test_replace_keys_replaces_every_stored_row_of_the_keys_written_and_keeps_the_others(
    spark, tmp_path, delta_engine, merged_by
):
    """``replace_keys``: one MERGE per write; a key's rows are what the write holds for it, whatever it stored."""
    import deltalake
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets_tests.delta.readers import read_with_duckdb

    schema = "key long, since long, v string"
    # (key, since, v): each write holds every row of the keys it names.
    writes = [
        [(1, 1, "a"), (1, 2, "b"), (1, 3, "c"), (2, 1, "d")],
        [(1, 1, "a"), (1, 3, "c2"), (3, 1, "e")],  # 1 loses a row and changes one; 3 is new; 2 is kept
        [],  # nothing to replace: nothing is written
    ]
    state = {"write": 0}

    @asset(key=["silver", "versions"], metadata=delta_table(write_mode="replace_keys", merge_keys=["key"]))
    def versions():
        return spark.createDataFrame(writes[state["write"]], schema)

    resources = _resources(tmp_path, **_route(merged_by))
    path = resources["lake"].table_path(["silver", "versions"])
    for write, expected in enumerate([writes[0], [(1, 1, "a"), (1, 3, "c2"), (2, 1, "d"), (3, 1, "e")]]):
        state["write"] = write
        result = materialize([versions], resources=resources)
        assert result.success
        assertDataFrameEqual(
            spark.createDataFrame(read_with_duckdb(path).to_pylist(), schema), spark.createDataFrame(expected, schema)
        )
    [merge] = deltalake.DeltaTable(path).history(1)
    assert merge["operation"] == "MERGE" and merge["version"] == 2  # created, appended, merged
    _assert_merged_by(result, "silver__versions", merged_by, delta_engine)
    state["write"] = 2
    assert materialize([versions], resources=resources).success
    assert deltalake.DeltaTable(path).version() == 2


def test_replace_keys_needs_the_keys_it_replaces():
    with pytest.raises(ValueError, match="'replace_keys' needs merge_keys"):
        delta_table(write_mode="replace_keys")


def test_a_merge_tables_first_write_appends_what_a_merge_would_insert_and_keeps_its_deletes(spark, tmp_path):
    import deltalake

    from medallion_assets.io_manager.spec import WriteSpec
    from medallion_assets_tests.delta.readers import read_with_deltalake

    client = DeltaTableClient(spark)
    spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted")

    def write(path, rows, batch):
        frame = spark.createDataFrame(rows, "id long, seq long, name string, _deleted boolean")
        return client.write(frame, path, spec, commit_metadata={"batch": str(batch)}, empty_commit=("test", batch))

    def stored(path):
        return sorted(tuple(row.values()) for row in read_with_deltalake(path).to_pylist())

    def last_operation(path):
        return deltalake.DeltaTable(path).history(1)[0]["operation"]

    # A new table: its first write appends the changes that insert (3 deletes itself first).
    path = str(tmp_path / "things")
    first = write(path, [(1, 10, "a", False), (2, 10, "b", False), (3, 10, None, True)], 1)
    assert first.skipped_reason is None and last_operation(path) == "WRITE"
    assert stored(path) == [(1, 10, "a"), (2, 10, "b")]
    # From then on a MERGE: 3's older insert stays deleted, 2's newer change applies.
    write(path, [(3, 5, "late", False), (2, 20, "b2", False), (1, 5, "old", False)], 2)
    assert last_operation(path) == "MERGE"
    assert stored(path) == [(1, 10, "a"), (2, 20, "b2")]
    assert stored(DeltaTableClient.tombstone_path(path)) == [(3, 10)]

    # A new table whose first changes all delete: no rows, but the deletes and the batch are recorded.
    deleted_first = str(tmp_path / "deleted_first")
    skipped = write(deleted_first, [(7, 10, None, True)], 1)
    assert skipped.skipped_reason.startswith("no change inserts a row")
    assert stored(deleted_first) == []
    assert client.last_commit_info(deleted_first)["batch"] == "1"
    write(deleted_first, [(7, 9, "older", False), (8, 1, "h", False)], 2)
    assert stored(deleted_first) == [(8, 1, "h")]


def test_a_merge_table_with_deletion_vectors_marks_replaced_rows_on_delta_spark_and_is_refused_on_delta_rs(
    spark, tmp_path, delta_engine
):
    """delta-spark's MERGE marks the rows it replaces and rewrites no file (DuckDB reads the result); the
    delta-rs engine, which could not read such a table back, refuses it before creating anything."""
    from medallion_assets.io_manager import DELETION_VECTORS
    from medallion_assets.io_manager.spec import WriteSpec
    from medallion_assets_tests.delta.readers import read_with_duckdb

    client = DeltaTableClient(spark)
    path = str(tmp_path / "silver" / "things")
    spec = WriteSpec(
        mode="merge",
        merge_keys=("id",),
        sequence_column="seq",
        delete_column="_deleted",
        table_properties={DELETION_VECTORS: "true"},
    )

    def changes(rows):
        return spark.createDataFrame(rows, "id long, seq long, name string, _deleted boolean").repartition(1)

    first = changes([(i, 1, f"n{i}", False) for i in range(100)])
    if delta_engine != "delta-spark":
        with pytest.raises(
            ValueError, match=r"deletion vectors \(delta.enableDeletionVectors=true\) on the delta-rs engine"
        ):
            client.write(first, path, spec)
        assert not client.exists(path)
        return
    client.write(first, path, spec)
    client.write(changes([(3, 2, "changed", False), (5, 2, None, True), (200, 2, "new", False)]), path, spec)
    metrics = client.last_commit_info(path)["operationMetrics"]
    assert metrics["numTargetFilesRemoved"] == "0" and int(metrics["numTargetDeletionVectorsAdded"]) >= 1
    stored = {row["id"]: row["name"] for row in read_with_duckdb(path).to_pylist()}
    assert stored == {**{i: f"n{i}" for i in range(100) if i != 5}, 3: "changed", 200: "new"}


def test_merge_with_schema_mode_merge_adds_new_columns_and_nulls_absent_ones(spark, tmp_path):
    from medallion_assets_tests.delta.readers import read_with_deltalake

    # The second batch grows only the struct, and id 2's change is stale; the third adds a column.
    batches = [
        ("id long, seq long, name string, info struct<a: long>", [(1, 1, "a", (1,)), (2, 1, "b", (2,))]),
        (
            "id long, seq long, name string, info struct<a: long, b: string>",
            [(1, 2, "a2", (10, "x")), (2, 0, "stale", (20, "y"))],
        ),
        ("id long, seq long, tier string", [(1, 3, "gold"), (3, 3, "silver")]),
    ]
    state = {"batch": 0}

    @asset(
        key=["silver", "evolving"],
        metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq", schema_mode="merge"),
    )
    def evolving():
        schema, rows = batches[state["batch"]]
        return spark.createDataFrame(rows, schema)

    resources = _resources(tmp_path)
    for batch in range(3):
        state["batch"] = batch
        assert materialize([evolving], resources=resources).success
    table = read_with_deltalake(resources["lake"].table_path(["silver", "evolving"]))
    assert table.column_names == ["id", "seq", "name", "info", "tier"]
    # A merged row replaces the stored one: 1 loses its name and info, which its last change lacks.
    # The stale change leaves 2 as stored, its struct's new field null.
    assert sorted(tuple(row.values()) for row in table.to_pylist()) == [
        (1, 3, None, None, "gold"),
        (2, 1, "b", {"a": 2, "b": None}, None),
        (3, 3, None, None, "silver"),
    ]


def test_merge_growing_the_structs_of_a_map_works_on_delta_spark_and_is_refused_on_delta_rs(
    spark, tmp_path, delta_engine
):
    from medallion_assets_tests.delta.readers import read_with_deltalake

    tags = "id long, seq long, tags map<string, struct<n: long{}>>"
    batches = [
        (tags.format(""), [(1, 1, {"k": (1,)}), (2, 1, {"k": (2,)})]),
        (tags.format(", w: double"), [(1, 2, {"k": (10, 0.5)})]),
        # Small: deltalake's MERGE, which cannot cast the values of 2's file, written before; the engine merges.
        (tags.format(", w: double"), [(2, 3, {"m": (20, 1.5)})]),
    ]
    state = {"batch": 0}

    @asset(
        key=["silver", "tagged"],
        metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq", schema_mode="merge"),
    )
    def tagged():
        schema, rows = batches[state["batch"]]
        return spark.createDataFrame(rows, schema)

    resources = _resources(tmp_path)
    path = resources["lake"].table_path(["silver", "tagged"])
    assert materialize([tagged], resources=resources).success
    first_load = DeltaTableClient(spark).latest_version(path)
    state["batch"] = 1
    if delta_engine == "delta-rs":
        with pytest.raises(Exception, match=r"'tags' gains struct fields inside the values of map 'tags'"):
            materialize([tagged], resources=resources)
        assert DeltaTableClient(spark).latest_version(path) == first_load
        return
    assert materialize([tagged], resources=resources).success
    state["batch"] = 2
    result = materialize([tagged], resources=resources)
    _assert_merged_by(result, "silver__tagged", "engine", delta_engine)
    assert sorted(read_with_deltalake(path).to_pylist(), key=lambda row: row["id"]) == [
        {"id": 1, "seq": 2, "tags": [("k", {"n": 10, "w": 0.5})]},
        {"id": 2, "seq": 3, "tags": [("m", {"n": 20, "w": 1.5})]},
    ]


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
    from medallion_assets_tests.delta.readers import read_with_duckdb

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

    from medallion_assets_tests.delta.readers import read_with_deltalake

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
    from medallion_assets_tests.delta.readers import read_with_duckdb

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


def test_a_small_merge_is_committed_by_deltalake_and_a_larger_one_by_the_engine(
    spark, tmp_path, delta_engine, monkeypatch, caplog
):
    import datetime as dt
    import logging
    from decimal import Decimal

    import deltalake
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.io_manager.metadata import ENGINE_NAME
    from medallion_assets.resources import io_manager_settings
    from medallion_assets_tests.delta.readers import read_with_duckdb

    schema = "id long, seq long, amount decimal(15,2), at timestamp, _deleted boolean"
    stored_schema = "id long, seq long, amount decimal(15,2), at timestamp"
    delivery = {"rows": []}
    expected: dict[int, tuple] = {}

    @asset(
        key=["silver", "payments"],
        metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq", delete_column="_deleted"),
    )
    def payments():
        return spark.createDataFrame(delivery["rows"], schema)

    lake = LakeResource(root=str(tmp_path / "lake"))
    session = SparkResource(master="local[2]")
    path = lake.table_path(["silver", "payments"])

    def merge(rows, *, bound: int = 3, **limits):
        delivery["rows"] = rows
        for key, seq, amount, at, deleted in rows:  # the merge's rule, applied in Python
            if key not in expected or seq > expected[key][1]:
                expected[key] = (key, seq, amount, at, deleted)
        io_manager = DeltaIOManager(spark=session, lake=lake, arrow_write_max_rows=bound, **limits)
        result = materialize([payments], resources={"spark": session, "lake": lake, "io_manager": io_manager})
        [materialization] = result.asset_materializations_for_node("silver__payments")
        kept = [row[:4] for row in expected.values() if not row[4]]
        # Whoever merged, Spark and DuckDB read the rows the merge rule keeps, decimals and timestamps included.
        assertDataFrameEqual(DeltaTableClient(spark).read(path), spark.createDataFrame(kept, stored_schema))
        assert sorted(read_with_duckdb(path).column("id").to_pylist()) == sorted(
            expected_key for expected_key, *_ in kept
        )
        return materialization.metadata, deltalake.DeltaTable(path).history(1)[0]

    def at(day):
        return dt.datetime(1995, 3, day, 12, 30)

    # The first write creates the table: the engine writes it.
    metadata, _ = merge(
        [
            (1, 1, Decimal("10.50"), at(1), False),
            (2, 1, Decimal("3.00"), at(1), False),
            (3, 1, Decimal("7.25"), at(1), False),
        ]
    )
    assert metadata["delta/engine"].value == delta_engine
    # At most 3 source rows into the existing table: deltalake merges them (an update, a stale
    # change, a delete, an insert), and delta-rs describes the version it wrote.
    metadata, commit = merge(
        [(1, 2, Decimal("11.00"), at(2), False), (2, 0, Decimal("0.01"), at(2), False), (3, 2, None, None, True)]
    )
    assert commit["operation"] == "MERGE" and commit["engineInfo"].startswith("delta-rs")
    # The stale change is kept as it was by the last matched clause, which delta-rs counts as an update.
    metrics = commit["operationMetrics"]
    assert (metrics["num_target_rows_updated"], metrics["num_target_rows_deleted"]) == (2, 1)
    if delta_engine == "delta-spark":
        assert metadata["delta/engine"].value == ENGINE_NAME
        assert int(metadata["delta/version"].value) == commit["version"]
        assert [(c.name, c.type) for c in metadata["dagster/column_schema"].schema.columns] == [
            ("id", "bigint"),
            ("seq", "bigint"),
            ("amount", "decimal(15,2)"),
            ("at", "timestamp"),
        ]
    assert metadata["dagster/row_count"].value == 2
    # One row past the bound, or no bound: the engine merges.
    metadata, commit = merge(
        [
            (4, 1, Decimal("1.00"), at(3), False),
            (5, 1, Decimal("2.00"), at(3), False),
            (1, 3, Decimal("12.00"), at(3), False),
            (2, 3, None, None, True),
        ]
    )
    assert metadata["delta/engine"].value == delta_engine
    metadata, commit = merge([(6, 1, Decimal("6.00"), at(4), False), (4, 0, Decimal("0.02"), at(4), False)], bound=0)
    assert metadata["delta/engine"].value == delta_engine and commit["operation"] == "MERGE"
    # The stale change of id 4: delta-spark copies it, delta-rs' MERGE keeps it by a last matched clause.
    metrics = commit["operationMetrics"]
    if delta_engine == "delta-spark":
        assert not commit["engineInfo"].startswith("delta-rs")
        assert (int(metrics["numTargetRowsUpdated"]), int(metrics["numTargetRowsInserted"])) == (0, 1)
    else:
        assert (metrics["num_target_rows_updated"], metrics["num_target_rows_inserted"]) == (1, 1)
    # A small source, but no table is small enough for deltalake to rewrite, set as a deployment sets
    # it (the variable, read by Dagster when the run starts): the engine merges, and the log says why.
    monkeypatch.setenv("MEDALLION_ARROW_MERGE_MAX_TABLE_MB", "0")
    caplog.set_level(logging.INFO, logger="medallion_assets.storage")
    metadata, commit = merge([(7, 1, Decimal("7.00"), at(5), False)], **io_manager_settings())
    assert metadata["delta/engine"].value == delta_engine and commit["operation"] == "MERGE"
    assert "more than the 0 deltalake may rewrite" in caplog.text
    if delta_engine == "delta-spark":
        assert not commit["engineInfo"].startswith("delta-rs")


def test_a_small_merge_into_a_table_deltalake_cannot_write_is_merged_by_delta_spark(spark, tmp_path, delta_engine):
    if delta_engine != "delta-spark":
        pytest.skip("deletion vectors are delta-spark's: the delta-rs engine writes no such table")
    import deltalake

    from medallion_assets.io_manager.spec import WriteSpec

    client = DeltaTableClient(spark, writer_limits=WriterLimits(max_rows=10))
    spec = WriteSpec(
        mode="merge",
        merge_keys=("id",),
        sequence_column="seq",
        table_properties={"delta.enableDeletionVectors": "true"},
    )
    path = str(tmp_path / "with_vectors")
    schema = "id long, seq long, name string"
    client.write(spark.createDataFrame([(i, 1, f"v{i}") for i in range(6)], schema), path, spec)
    before = deltalake.DeltaTable(path).version()
    result = client.write(spark.createDataFrame([(2, 2, "changed")], schema), path, spec)
    # deltalake refused the table and committed nothing; delta-spark's MERGE is the one new version.
    assert not result.by_deltalake and result.version == before + 1
    assert client.last_commit_info(path)["operation"] == "MERGE"
    rows = sorted(tuple(row) for row in client.read(path).collect())
    assert rows == [(i, 2 if i == 2 else 1, "changed" if i == 2 else f"v{i}") for i in range(6)]


def test_a_small_merge_into_a_table_past_the_size_deltalake_rewrites_is_merged_by_the_engine(
    spark, tmp_path, delta_engine, caplog
):
    import logging

    import deltalake

    from medallion_assets.io_manager.spec import WriteSpec

    caplog.set_level(logging.INFO, logger="medallion_assets.storage")
    spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq")
    path = tmp_path / "things"
    schema = "id long, seq long, name string"
    DeltaTableClient(spark).write(spark.createDataFrame([(i, 1, f"v{i}") for i in range(6)], schema), str(path), spec)
    # The table's size as the file system has it: one version, so every data file is in it.
    table_bytes = sum(file.stat().st_size for file in path.glob("*.parquet"))
    assert table_bytes > 0

    def merged_by_deltalake(max_table_bytes: int, changes: list[tuple]) -> bool:
        caplog.clear()
        client = DeltaTableClient(spark, writer_limits=WriterLimits(max_rows=10, max_merge_table_bytes=max_table_bytes))
        before = deltalake.DeltaTable(str(path)).version()
        result = client.write(spark.createDataFrame(changes, schema), str(path), spec)
        assert result.version == before + 1 and client.last_commit_info(str(path))["operation"] == "MERGE"
        routed_away = f"more than the {max_table_bytes} deltalake may rewrite" in caplog.text
        # On the delta-rs engine both routes commit by delta-rs: only the log tells them apart.
        if delta_engine == "delta-spark":
            assert result.by_deltalake is not routed_away
        return not routed_away

    # One byte short: the engine merges, and the log says why.
    assert not merged_by_deltalake(table_bytes - 1, [(2, 2, "changed"), (7, 2, "new")])
    expected = sorted([(i, 2 if i == 2 else 1, "changed" if i == 2 else f"v{i}") for i in range(6)] + [(7, 2, "new")])
    assert sorted(tuple(row) for row in DeltaTableClient(spark).read(str(path)).collect()) == expected
    # A bound the (now larger) table fits in: deltalake merges.
    assert merged_by_deltalake(10 * table_bytes, [(3, 2, "changed too")])
    expected = sorted([*(row for row in expected if row[0] != 3), (3, 2, "changed too")])
    assert sorted(tuple(row) for row in DeltaTableClient(spark).read(str(path)).collect()) == expected


def test_a_merges_small_tombstone_append_and_empty_commit_are_committed_by_deltalake(spark, tmp_path, delta_engine):
    import deltalake

    from medallion_assets.io_manager.spec import WriteSpec
    from medallion_assets_tests.delta.readers import read_with_deltalake

    client = DeltaTableClient(spark, writer_limits=WriterLimits(max_rows=10))
    spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted")
    path = str(tmp_path / "things")

    def write(rows, batch):
        frame = spark.createDataFrame(rows, "id long, seq long, name string, _deleted boolean")
        return client.write(frame, path, spec, commit_metadata={"batch": str(batch)}, empty_commit=("test", batch))

    def stored(table):
        return sorted(tuple(row.values()) for row in read_with_deltalake(table).to_pylist())

    write([(1, 10, "a", False), (2, 10, "b", False), (3, 10, None, True)], 1)
    # The second batch's delete is remembered by a deltalake append to the existing tombstones.
    write([(2, 20, None, True), (4, 20, "d", False)], 2)
    tombstones = DeltaTableClient.tombstone_path(path)
    assert stored(path) == [(1, 10, "a"), (4, 20, "d")]
    assert stored(tombstones) == [(2, 20), (3, 10)]
    if delta_engine == "delta-spark":
        assert deltalake.DeltaTable(tombstones).history(1)[0]["engineInfo"].startswith("delta-rs")
    # A batch without rows: deltalake's empty commit records it, once however often it is retried.
    empty = write([], 3)
    assert empty.by_deltalake and empty.skipped_reason.startswith("no new rows")
    assert client.last_commit_info(path)["batch"] == "3"
    assert deltalake.DeltaTable(path).transaction_version("test") == 3
    assert not write([], 3).by_deltalake and deltalake.DeltaTable(path).version() == empty.version
    assert stored(path) == [(1, 10, "a"), (4, 20, "d")]


def test_output_metadata_rows_files_and_bytes_are_those_an_independent_reader_sees(spark, tmp_path, delta_engine):
    """Rows, files and bytes come from the Delta log now: they must still be the table's."""
    import deltalake
    import pyarrow as pa

    from medallion_assets.io_manager import WriteSpec, table_metadata
    from medallion_assets.storage.engines import DeltaSparkSqlEngine
    from medallion_assets_tests.delta.readers import read_with_duckdb

    client = DeltaTableClient(spark)
    path = str(tmp_path / "silver" / "counted")
    schema = "id long, part string, seq long, _deleted boolean"
    merge = WriteSpec(
        mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted", partition_columns=("part",)
    )

    def write(rows, spec):
        frame = spark.createDataFrame(rows, schema).repartition(3)
        if spec.mode != "merge":
            frame = frame.drop("_deleted")
        return client.write(frame, path, spec)

    def added_by(version):
        """Files, rows and bytes commit ``version`` added, from delta-rs's snapshots at it and before it."""

        def files(at):
            if at < 0:
                return {}
            actions = pa.table(deltalake.DeltaTable(path, version=at).get_add_actions(flatten=True)).to_pylist()
            return {a["path"]: (a["num_records"], a["size_bytes"]) for a in actions}

        before = files(version - 1)
        added = [stats for name, stats in files(version).items() if name not in before]
        return {
            "numFiles": len(added),
            "numOutputRows": sum(r for r, _ in added),
            "numOutputBytes": sum(b for _, b in added),
        }

    def check(result, expected_rows):
        metadata = table_metadata(client, path, commit=result.commit, key_columns=["id"])
        table = deltalake.DeltaTable(path)
        actions = pa.table(table.get_add_actions(flatten=True))
        # Text, not a number Dagster would plot on the asset's Plots tab; it reads back with int().
        assert metadata["delta/version"] == MetadataValue.text(str(table.version()))
        assert int(metadata["delta/version"].value) == result.version == table.version()
        assert metadata["dagster/row_count"] == expected_rows
        assert read_with_duckdb(path).num_rows == expected_rows
        assert table.to_pyarrow_table().num_rows == expected_rows
        assert metadata["delta/num_files"] == actions.num_rows
        assert metadata["delta/size_bytes"] == sum(actions.column("size_bytes").to_pylist())
        assert metadata["delta/partition_columns"].value == ["part"]
        assert [c.name for c in metadata["dagster/column_schema"].columns] == ["id", "part", "seq"]
        preview = metadata["preview"].value
        assert "| id | part | seq |" in preview
        # The first five rows by key, of a table small enough to sort.
        smallest = sorted(table.to_pyarrow_table().column("id").to_pylist())[:5]
        assert [int(line.split("|")[1]) for line in preview.splitlines()[2:7]] == smallest
        assert f"The first 5 of {expected_rows} rows by `id`." in preview
        if result.commit.operation != "MERGE":
            # A write's metrics are its commit's (delta-spark's DeltaTable.history, the delta-rs
            # engine's commitInfo): files, rows and bytes it added, as delta-rs sees that commit.
            metrics = metadata["delta/operation_metrics"].value
            assert {name: metrics[name] for name in ("numFiles", "numOutputRows", "numOutputBytes")} == added_by(
                result.version
            )
        if delta_engine == "delta-spark":
            # The Spark Connect route (DESCRIBE DETAIL and a count) describes the same version alike.
            state = DeltaSparkSqlEngine().table_state(spark, path, result.version)
            assert (state.num_files, state.size_bytes) == (actions.num_rows, metadata["delta/size_bytes"])
            assert state.frame.count() == expected_rows

    first = [(i, f"p{i % 3}", 1, False) for i in range(100)]
    check(write(first, WriteSpec(mode="overwrite", partition_columns=("part",))), 100)
    # Deletes 10 keys, updates 10, inserts 5: files are removed and added.
    changes = (
        [(i, f"p{i % 3}", 2, True) for i in range(10)]
        + [(i, f"p{i % 3}", 2, False) for i in range(10, 20)]
        + [(i, f"p{i % 3}", 2, False) for i in range(100, 105)]
    )
    merged = write(changes, merge)
    assert merged.commit.operation == "MERGE"
    check(merged, 95)
    check(write([(i, "p9", 3, False) for i in range(200, 207)], WriteSpec(mode="append")), 102)
    check(write([(i, f"p{i % 2}", 4, False) for i in range(40)], WriteSpec(mode="overwrite")), 40)
    if delta_engine == "delta-spark":
        # A checksum without the add actions (delta-spark keeps them there for small tables
        # only): the rows then come from one job over the version's add actions.
        spark.conf.set("spark.databricks.delta.allFilesInCrc.enabled", "false")
        try:
            check(write(first, WriteSpec(mode="overwrite")), 100)
        finally:
            spark.conf.unset("spark.databricks.delta.allFilesInCrc.enabled")


def _column_mapped_table(spark, path: str) -> None:
    """Three rows in a column-mapped table, written by delta-spark (reader version 2: no reader feature named)."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (k BIGINT, v STRING) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    written = spark.range(3).select(F.col("id").alias("k"), F.concat(F.lit("v"), F.col("id").cast("string")).alias("v"))
    written.write.format("delta").mode("append").save(path)


def test_a_column_mapped_table_is_previewed_by_spark_with_its_values(spark, tmp_path, delta_engine):
    """delta-rs opens a column-mapped table but reads its renamed columns as nulls: Spark previews it."""
    if delta_engine != "delta-spark":
        pytest.skip("only delta-spark writes column-mapped tables; the delta-rs engine refuses them")
    from medallion_assets.io_manager import table_metadata

    path = str(tmp_path / "mapped")
    _column_mapped_table(spark, path)

    preview = table_metadata(DeltaTableClient(spark), path, key_columns=["k"])["preview"].value
    shown = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in preview.splitlines()[2:]
        if line.startswith("| ")
    ]
    assert shown == [["0", "v0"], ["1", "v1"], ["2", "v2"]]


def test_a_column_mapped_table_is_refused_as_an_arrow_input_naming_it(spark, tmp_path, delta_engine):
    """An Arrow input of a column-mapped table fails, naming the input and the fix, instead of reading nulls."""
    if delta_engine != "delta-spark":
        pytest.skip("only delta-spark writes column-mapped tables; the delta-rs engine refuses them")
    from dagster import AssetSpec

    from medallion_assets.delta.errors import UnsupportedFeatureError

    resources = _resources(tmp_path)
    _column_mapped_table(spark, str(tmp_path / "lake" / "silver" / "mapped"))
    read = []

    @asset(key=["gold", "from_mapped"], ins={"mapped": AssetIn(key=["silver", "mapped"])})
    def from_mapped(mapped: pa.Table) -> None:
        read.append(mapped.to_pylist())  # delta-rs alone reads [{'k': None, 'v': None}, ...]

    with pytest.raises(UnsupportedFeatureError) as refused:
        materialize([AssetSpec(["silver", "mapped"]), from_mapped], selection=[from_mapped], resources=resources)
    assert read == []
    message = str(refused.value)
    for part in (
        "input silver/mapped of gold__from_mapped",
        "columnMapping",
        "as Table",
        "annotate the input as a Spark DataFrame",
    ):
        assert part in message

    # The same rows as a Spark input: Spark reads the mapped columns.
    @asset(key=["gold", "counted"], ins={"mapped": AssetIn(key=["silver", "mapped"])})
    def counted(mapped) -> None:
        assert sorted(mapped.collect()) == [(0, "v0"), (1, "v1"), (2, "v2")]

    assert materialize([AssetSpec(["silver", "mapped"]), counted], selection=[counted], resources=resources).success


def test_the_kept_statistics_still_skip_files_for_filters_and_merges_on_delta_spark(spark, tmp_path, delta_engine):
    """Statistics on a merge table's keys and dates only: a filter on a date skips files, a MERGE
    rewrites only the files holding its keys. (The delta-rs engine's pushed filters: ``delta/test_predicate.py``.)"""
    if delta_engine != "delta-spark":
        pytest.skip("data skipping of delta-spark's scan; the delta-rs engine's is tested in delta/test_predicate.py")
    from delta.tables import DeltaTable
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.io_manager import WriteSpec

    client = DeltaTableClient(spark)
    path = str(tmp_path / "silver" / "events")
    spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted")
    # Eight files, each one range of days (and so of ids): what a date filter can skip.
    events = spark.range(4000, numPartitions=1).select(
        "id",
        (F.col("id") % 5).alias("seq"),
        F.expr("date_add(DATE'2024-01-01', CAST(id DIV 100 AS INT))").alias("day"),
        F.lit(False).alias("_deleted"),
        F.concat(F.lit("payload "), F.col("id").cast("string")).alias("payload"),
    )
    client.write(events.repartitionByRange(8, "day"), path, spec)
    table = spark.read.format("delta").load(path)
    assert len(table.inputFiles()) == 8

    first_days = table.where(F.col("day") <= F.lit("2024-01-05").cast("date"))
    assert len(first_days.inputFiles()) == 1  # by the statistics on `day`: the other seven files are skipped
    assertDataFrameEqual(first_days, events.drop("_deleted").where(F.col("id") < 500))
    assert len(table.where(F.col("payload") == "payload 7").inputFiles()) == 8  # no statistics kept on payload

    changes = (
        events.where(F.col("id") < 10).withColumn("seq", F.lit(9).cast("long")).withColumn("payload", F.lit("changed"))
    )
    client.write(changes, path, spec)
    [merge] = DeltaTable.forPath(spark, path).history(1).select("operation", "operationMetrics").collect()
    assert merge.operation == "MERGE"
    assert (merge.operationMetrics["numTargetFilesRemoved"], merge.operationMetrics["numTargetRowsUpdated"]) == (
        "1",
        "10",
    )
    assert spark.read.format("delta").load(path).where(F.col("payload") == "changed").count() == 10


def test_merge_tables_keep_statistics_on_what_readers_filter_and_merge_on(spark, tmp_path, delta_engine):
    """A new merge table keeps per-file min/max on its keys and dates only (not its sequence), as delta-rs reads its log."""
    import deltalake
    import pyarrow as pa

    from medallion_assets.io_manager import WriteSpec

    client = DeltaTableClient(spark)
    path = str(tmp_path / "silver" / "events")
    spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted")
    rows = [(i, i % 7, f"payload {i}", f"2024-01-{1 + i % 28:02d}", False) for i in range(200)]
    frame = spark.createDataFrame(rows, "id long, seq long, payload string, day string, _deleted boolean")
    client.write(frame.withColumn("day", F.to_date("day")), path, spec)

    table = deltalake.DeltaTable(path)
    assert table.metadata().configuration["delta.dataSkippingStatsColumns"] == "id,day"
    actions = pa.table(table.get_add_actions(flatten=True))
    kept = {name.split(".", 1)[1] for name in actions.column_names if name.startswith("min.")}
    if delta_engine == "delta-spark":
        assert kept == {"id", "day"}
    else:
        # The delta-rs engine commits Spark's Parquet files with the statistics of their footers.
        assert {"id", "day"} <= kept
    for column in ("id", "day"):
        assert all(value is not None for value in actions.column(f"min.{column}").to_pylist())
    assert pa.table(table.to_pyarrow_table()).num_rows == 200


def test_declared_filters_choose_the_statistics_and_a_replace_group_stands_for_its_keys():
    """``filtered_by`` replaces the every-date default; a group-replaced table keeps its group, not its other keys."""
    from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType

    from medallion_assets.storage.write_spec import WriteSpec, table_properties_for

    schema = StructType(
        [
            StructField(name, kind)
            for name, kind in [
                ("order", LongType()),
                ("line", LongType()),
                ("seq", StringType()),
                ("shipped", DateType()),
                ("received", DateType()),
                ("note", StringType()),
            ]
        ]
    )
    grouped = dict(
        mode="merge",
        merge_keys=("order", "line"),
        sequence_column="seq",
        delete_column="_deleted",
        replace_group="order",
    )
    stats = lambda **spec: table_properties_for(WriteSpec(**spec), schema)["delta.dataSkippingStatsColumns"]  # noqa: E731
    assert stats(**grouped) == "order,shipped,received"
    assert stats(**grouped, filtered_by=("shipped",)) == "order,shipped"
    assert stats(**grouped, filtered_by=()) == "order"
    assert stats(mode="merge", merge_keys=("order", "line"), filtered_by=("note",)) == "order,line,note"
    with pytest.raises(ValueError, match=r"filtered_by names column\(s\) \['shiped'\].*leave filtered_by out"):
        table_properties_for(WriteSpec(**grouped, filtered_by=("shiped",)), schema)


def test_a_misspelt_filter_column_fails_the_write_naming_the_table_and_creates_nothing(spark, tmp_path):
    from medallion_assets.io_manager import delta_table, write_spec_from_metadata

    path = str(tmp_path / "silver" / "events")
    spec = write_spec_from_metadata(delta_table(write_mode="merge", merge_keys=["id"], filtered_by=["dya"]))
    frame = spark.createDataFrame([(1, "2024-01-01")], "id long, day string").withColumn("day", F.to_date("day"))
    with pytest.raises(ValueError, match=r"table .*events: filtered_by names column\(s\) \['dya'\]"):
        DeltaTableClient(spark).write(frame, path, spec)
    assert not (tmp_path / "silver" / "events").exists()
