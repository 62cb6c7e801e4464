"""The Delta IO manager's merges through real Dagster runs on real Delta tables.

What a merge keeps and deletes, and which writer commits it: deltalake for a small one,
the session's engine past the bound or where deltalake cannot write the table.
"""

from __future__ import annotations

import pytest
from dagster import asset, materialize

from medallion_assets.io_manager import DeltaIOManager, delta_table
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.client import DeltaTableClient
from medallion_assets.storage.writers import WriterLimits
from medallion_assets_tests.support.resources import io_manager_resources as _resources

pytestmark = pytest.mark.both_engines


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
    """Both routes of a group MERGE.

    deltalake for a small source, the session's engine past ``arrow_write_max_rows``.
    """
    import deltalake

    from medallion_assets_tests.support.readers import read_with_deltalake

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

    from medallion_assets_tests.support.readers import read_with_duckdb

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
    from medallion_assets_tests.support.readers import read_with_deltalake

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
    from medallion_assets_tests.support.readers import read_with_duckdb

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
    from medallion_assets_tests.support.readers import read_with_deltalake

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
    from medallion_assets_tests.support.readers import read_with_deltalake

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
    from medallion_assets_tests.support.readers import read_with_duckdb

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
    from medallion_assets_tests.support.readers import read_with_deltalake

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
