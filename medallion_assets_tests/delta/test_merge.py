"""DeltaTable.merge: delta-spark's merge builder, executed by delta-rs on the driver.

Expected table states are computed in plain Python from the same inputs.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from medallion_assets.delta import ConcurrentWriteError, DeltaError, DeltaOptionError, SchemaMismatchError
from medallion_assets.delta import tables as tables_module
from medallion_assets.delta._sql import to_sql
from medallion_assets.delta.tables import DeltaTable
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb, rows, seed_map_of_structs

UTC = dt.UTC
TARGET_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64()),
        pa.field("seq", pa.int64()),
        pa.field("name", pa.string()),
        pa.field("price", pa.decimal128(10, 2)),
        pa.field("day", pa.date32()),
        pa.field("updated_at", pa.timestamp("us", tz="UTC")),
    ]
)
SOURCE_DDL = "id int, seq int, name string, price decimal(10,2), day date, updated_at timestamp, op string"

TARGET = [
    {
        "id": 1,
        "seq": 5,
        "name": "one",
        "price": Decimal("1.00"),
        "day": dt.date(2024, 1, 1),
        "updated_at": dt.datetime(2024, 1, 1, tzinfo=UTC),
    },
    {
        "id": 2,
        "seq": 5,
        "name": "two",
        "price": Decimal("2.00"),
        "day": dt.date(2024, 1, 1),
        "updated_at": dt.datetime(2024, 1, 1, tzinfo=UTC),
    },
    {"id": 3, "seq": 5, "name": None, "price": None, "day": dt.date(2024, 1, 2), "updated_at": None},
    {
        "id": 4,
        "seq": 5,
        "name": "four",
        "price": Decimal("4.00"),
        "day": dt.date(2024, 1, 2),
        "updated_at": dt.datetime(2024, 1, 2, tzinfo=UTC),
    },
]

# Changes: an older change (seq 3) for id 1 must not overwrite; a newer one for id 2 must;
# id 3 is deleted; id 9 is new; id 10 is a delete of a row that does not exist.
CHANGES = [
    (1, 3, "one-OLD", Decimal("100.00"), dt.date(2023, 1, 1), dt.datetime(2023, 1, 1), "U"),
    (2, 7, "two-new", Decimal("22.50"), dt.date(2024, 2, 1), dt.datetime(2024, 2, 1, 12), "U"),
    (3, 6, None, None, None, None, "D"),
    (9, 1, "nine", Decimal("-9.99"), dt.date(2024, 3, 1), None, "I"),
    (10, 1, "ten", None, None, None, "D"),
]


def _target(spark, path, partitioned=False):
    builder = (
        DeltaTable.create(spark)
        .location(str(path))
        .addColumns(
            spark.createDataFrame(
                [], "id bigint, seq bigint, name string, price decimal(10,2), day date, updated_at timestamp"
            ).schema
        )
    )
    if partitioned:
        builder = builder.partitionedBy("day")
    table = builder.execute()
    write_deltalake(str(path), pa.Table.from_pylist(TARGET, schema=TARGET_SCHEMA), mode="append")
    return table


def _expected_upsert(target, changes):
    """Apply CDC changes by sequence, in plain Python."""
    state = {r["id"]: dict(r) for r in target}
    for cid, seq, name, price, day, ts, op in changes:
        current = state.get(cid)
        if current is not None:
            if op == "D":
                del state[cid]
            elif seq > current["seq"]:
                state[cid] = {
                    "id": cid,
                    "seq": seq,
                    "name": name,
                    "price": price,
                    "day": day,
                    "updated_at": ts.replace(tzinfo=UTC) if ts else None,
                }
        elif op != "D":
            state[cid] = {
                "id": cid,
                "seq": seq,
                "name": name,
                "price": price,
                "day": day,
                "updated_at": ts.replace(tzinfo=UTC) if ts else None,
            }
    return sorted(state.values(), key=lambda r: r["id"])


def _both(path):
    return rows(read_with_deltalake(path), sort_by="id"), rows(read_with_duckdb(path), sort_by="id")


@pytest.mark.parametrize("partitioned", [False, True])
def test_cdc_upsert_with_sequence_and_deletes(spark, tmp_path, partitioned):
    path = tmp_path / "t"
    table = _target(spark, path, partitioned)
    source = spark.createDataFrame(CHANGES, SOURCE_DDL)
    metrics = (
        table.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete(condition="s.op = 'D'")
        .whenMatchedUpdate(
            condition="s.seq > t.seq",
            set={"seq": "s.seq", "name": "s.name", "price": "s.price", "day": "s.day", "updated_at": "s.updated_at"},
        )
        .whenNotMatchedInsertAll(condition="s.op <> 'D'")
        .execute()
    )
    expected = _expected_upsert(TARGET, CHANGES)
    a, b = _both(path)
    assert a == expected
    assert b == expected
    assertDataFrameEqual(
        metrics,
        spark.createDataFrame(
            [(3, 1, 1, 1)],
            "num_affected_rows long, num_updated_rows long, num_deleted_rows long, num_inserted_rows long",
        ),
    )
    assert table.lastOperationMetrics["num_target_rows_inserted"] == 1
    assert table.history(1).first().operation == "MERGE"


def test_update_all_insert_all_with_column_conditions_and_casts(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    changes = [c[:-1] for c in CHANGES if c[-1] != "D"]
    source = spark.createDataFrame(changes, SOURCE_DDL.rsplit(",", 1)[0])  # int ids/seqs: cast to bigint
    out = (
        table.alias("t")
        .merge(source.alias("s"), F.col("t.id") == F.col("s.id"))
        .whenMatchedUpdateAll(condition=F.col("s.seq") > F.col("t.seq"))
        .whenNotMatchedInsertAll()
        .execute()
    )
    expected = _expected_upsert(TARGET, [c + ("U",) for c in changes])
    a, b = _both(path)
    assert a == expected and b == expected
    assert out.first().num_inserted_rows == 1 and out.first().num_updated_rows == 1


def test_default_aliases_case_coalesce_and_insert_values(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    source = spark.createDataFrame(
        [(1, None, "x"), (3, "named", "y"), (7, None, "z")], "id long, name string, tag string"
    )
    (
        table.merge(source, "target.id = source.id")
        .whenMatchedUpdate(
            set={
                "name": "coalesce(source.name, target.name)",
                "seq": "CASE WHEN source.tag = 'x' THEN target.seq + 100 ELSE target.seq END",
            }
        )
        .whenNotMatchedInsert(
            values={"id": "source.id", "seq": F.lit(0), "name": F.coalesce(F.col("source.name"), F.lit("unnamed"))}
        )
        .execute()
    )
    by_id = {r["id"]: dict(r) for r in TARGET}
    by_id[1]["seq"] += 100
    by_id[3]["name"] = "named"
    by_id[7] = {"id": 7, "seq": 0, "name": "unnamed", "price": None, "day": None, "updated_at": None}
    expected = [by_id[k] for k in sorted(by_id)]
    a, b = _both(path)
    assert a == expected and b == expected


def test_not_matched_by_source(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    source = spark.createDataFrame([(1,), (2,)], "id long")
    (
        table.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenNotMatchedBySourceUpdate(condition="t.id = 3", set={"name": "'orphan'"})
        .whenNotMatchedBySourceDelete()
        .execute()
    )
    expected = [dict(r) for r in TARGET if r["id"] in (1, 2, 3)]
    expected[2]["name"] = "orphan"
    a, b = _both(path)
    assert a == expected and b == expected


def test_empty_source_changes_nothing_but_by_source_delete(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    empty = spark.createDataFrame([], SOURCE_DDL)
    out = (
        table.alias("t")
        .merge(empty.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll()
        .whenNotMatchedInsertAll()
        .execute()
    )
    assert out.first().num_affected_rows == 0
    a, b = _both(path)
    assert a == TARGET and b == TARGET
    table.alias("t").merge(empty.alias("s"), "t.id = s.id").whenNotMatchedBySourceDelete(
        "t.seq = 5 AND t.id > 2"
    ).execute()
    a, b = _both(path)
    assert a == TARGET[:2] and b == TARGET[:2]


def test_schema_evolution_adds_source_columns(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    ddl = "id long, seq long, name string, price decimal(10,2), day date, updated_at timestamp, color string"
    source = spark.createDataFrame(
        [(1, 9, "one!", None, None, None, "red"), (5, 1, "five", Decimal("5.00"), None, None, "blue")], ddl
    )
    # Like delta-spark, without schema evolution extra source columns are ignored.
    table.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdateAll().execute()
    plain = rows(read_with_deltalake(path), sort_by="id")
    assert "color" not in plain[0] and plain[0]["name"] == "one!"
    table.alias("t").merge(
        source.alias("s"), "t.id = s.id"
    ).whenMatchedUpdateAll().whenNotMatchedInsertAll().withSchemaEvolution().execute()
    got = rows(read_with_deltalake(path), sort_by="id")
    assert {r["id"]: r["color"] for r in got} == {1: "red", 2: None, 3: None, 4: None, 5: "blue"}
    assert {r["id"]: r["price"] for r in got}[5] == Decimal("5.00")
    duck = rows(read_with_duckdb(path), sort_by="id")
    assert [r["color"] for r in duck] == ["red", None, None, None, "blue"]


def test_schema_evolution_leaves_the_new_column_null_in_rows_no_clause_changes(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    ddl = "color string, id long, seq long, name string, price decimal(10,2), day date, updated_at timestamp"
    # id 1's change is stale (seq 3 < 5), id 2's is newer, id 7 is new.
    source = spark.createDataFrame(
        [
            ("red", 1, 3, "one-OLD", None, None, None),
            ("blue", 2, 7, "two!", None, None, None),
            ("green", 7, 1, "seven", None, None, None),
        ],
        ddl,
    )
    (
        table.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll("s.seq > t.seq")
        .whenNotMatchedInsertAll()
        .withSchemaEvolution()
        .execute()
    )
    # As delta-spark: the stale change and the rows without a change keep no color.
    expected = {1: ("one", None), 2: ("two!", "blue"), 3: (None, None), 4: ("four", None), 7: ("seven", "green")}
    for reader in (read_with_deltalake, read_with_duckdb):
        assert {r["id"]: (r["name"], r["color"]) for r in rows(reader(path), sort_by="id")} == expected


def test_schema_evolution_adds_a_nested_field_and_keeps_stale_changes_struct(spark, tmp_path):
    path = str(tmp_path / "t")
    info = pa.struct([("a", pa.int64())])
    write_deltalake(
        path,
        pa.table(
            {
                "id": pa.array([1, 2], pa.int64()),
                "seq": pa.array([5, 5], pa.int64()),
                "info": pa.array([{"a": 1}, {"a": 2}], info),
            }
        ),
    )
    # id 1's change is stale (seq 3 < 5), id 2's is newer, id 7 is new; each brings info.b.
    source = spark.createDataFrame(
        [(1, 3, (10, "stale")), (2, 7, (20, "newer")), (7, 1, (70, "new"))],
        "id long, seq long, info struct<a: long, b: string>",
    )
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll("s.seq > t.seq")
        .whenNotMatchedInsertAll()
        .withSchemaEvolution()
        .execute()
    )
    # As delta-spark: the stale change keeps the stored struct, its new field null.
    expected = [
        {"id": 1, "seq": 5, "info": {"a": 1, "b": None}},
        {"id": 2, "seq": 7, "info": {"a": 20, "b": "newer"}},
        {"id": 7, "seq": 1, "info": {"a": 70, "b": "new"}},
    ]
    for reader in (read_with_deltalake, read_with_duckdb):
        assert rows(reader(path), sort_by="id") == expected


def test_schema_evolution_refuses_fields_added_inside_map_values_and_commits_nothing(spark, tmp_path):
    path = str(tmp_path / "t")
    seed_map_of_structs(path, "tags")
    source = spark.createDataFrame([(1, {"k": (2, "x")})], "id long, tags map<string, struct<a: long, b: string>>")
    with pytest.raises(SchemaMismatchError, match=r"'tags' gains struct fields inside the values of map 'tags'"):
        (
            DeltaTable.forPath(spark, path)
            .alias("t")
            .merge(source.alias("s"), "t.id = s.id")
            .whenMatchedUpdateAll()
            .whenNotMatchedInsertAll()
            .withSchemaEvolution()
            .execute()
        )
    assert rows(read_with_deltalake(path)) == [{"id": 1, "tags": [("k", {"a": 1})]}]
    assert RsTable(path).version() == 0


def test_a_map_whose_structs_another_writer_grew_fails_each_change_saying_why(spark, tmp_path):
    path = str(tmp_path / "t")
    grown = pa.map_(pa.string(), pa.struct([("a", pa.int64()), ("b", pa.string())]))
    seed_map_of_structs(path, "tags")
    write_deltalake(path, pa.schema([("tags", grown)]).empty_table(), mode="append", schema_mode="merge")
    # A second file under the grown schema, so that OPTIMIZE has two files to compact.
    write_deltalake(
        path,
        pa.table({"id": pa.array([2], pa.int64()), "tags": pa.array([[("j", {"a": 2, "b": "y"})]], grown)}),
        mode="append",
    )
    source = spark.createDataFrame([(1, {"k": (2, "x")})], "id long, tags map<string, struct<a: long, b: string>>")
    table = DeltaTable.forPath(spark, path)
    why = r"map column's struct values gained fields.*overwriteSchema.*delta-spark"
    with pytest.raises(SchemaMismatchError, match=why):
        table.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdateAll().execute()
    with pytest.raises(SchemaMismatchError, match=why):
        table.delete("id = 1")
    with pytest.raises(SchemaMismatchError, match=why):
        table.update("id = 1", {"id": "3"})
    with pytest.raises(SchemaMismatchError, match=why):
        table.optimize().executeCompaction()
    assert RsTable(path).version() == 2
    assert rows(read_with_deltalake(path), sort_by="id") == [
        {"id": 1, "tags": [("k", {"a": 1, "b": None})]},
        {"id": 2, "tags": [("j", {"a": 2, "b": "y"})]},
    ]


def test_failed_merge_commits_nothing(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    source = spark.createDataFrame([(1, "x")], "id long, name string")
    with pytest.raises(DeltaError) as err:
        table.alias("t").merge(source.alias("s"), "t.nope = s.id").whenMatchedUpdateAll().execute()
    assert str(path) in str(err.value) and "MERGE" in str(err.value)
    with pytest.raises(DeltaOptionError, match="no clause"):
        table.alias("t").merge(source.alias("s"), "t.id = s.id").execute()
    with pytest.raises(DeltaOptionError, match="same alias"):
        table.alias("s").merge(source.alias("s"), "s.id = s.id").whenMatchedDelete().execute()
    bad_cast = spark.createDataFrame([(1, "not a number")], "id long, seq string")
    with pytest.raises(DeltaError):
        table.alias("t").merge(bad_cast.alias("s"), "t.id = s.id").whenMatchedUpdate(set={"seq": "s.seq"}).execute()
    assert RsTable(str(path)).version() == 1
    a, b = _both(path)
    assert a == TARGET and b == TARGET


def test_conflicting_concurrent_write_raises(spark, tmp_path, monkeypatch):
    path = tmp_path / "t"
    table = _target(spark, path)
    # The merge reads version 1; another writer commits an update before the merge commits.
    stale = RsTable(str(path))
    RsTable(str(path)).update(updates={"name": "'other writer'"}, predicate="id = 2")
    monkeypatch.setattr(tables_module, "_open", lambda *_a, **_k: stale)
    source = spark.createDataFrame([(2, 99, "merge")], "id long, seq long, name string")
    with pytest.raises(ConcurrentWriteError) as err:
        table.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdate(set={"name": "s.name"}).execute()
    assert str(path) in str(err.value)
    monkeypatch.undo()
    assert RsTable(str(path)).version() == 2
    got = {r["id"]: r["name"] for r in read_with_deltalake(path).to_pylist()}
    assert got[2] == "other writer"

    stale = RsTable(str(path))
    RsTable(str(path)).delete("id = 1")
    monkeypatch.setattr(tables_module, "_open", lambda *_a, **_k: stale)
    with pytest.raises(ConcurrentWriteError):
        table.delete("id = 1")


@pytest.mark.parametrize(
    ("column", "sql"),
    [
        (lambda: F.col("t.id") == F.col("s.id"), "(t.id = s.id)"),
        (lambda: F.col("s.seq") > F.col("t.seq"), "(s.seq > t.seq)"),
        (lambda: F.col("s.op") == "D", "(s.op = 'D')"),
        (lambda: F.col("s.name") == "it's", "(s.name = 'it''s')"),
        (lambda: (F.col("a") != 1) & F.col("b").isNull(), "((NOT (a = 1)) AND (b IS NULL))"),
        (lambda: (F.col("a") >= 1.5) | (F.col("b") <= -2), "((a >= 1.5) OR (b <= -2))"),
        (lambda: ~F.col("flag") | F.col("c").isin(1, 2), "((NOT flag) OR (c IN (1, 2)))"),
        (
            lambda: F.when(F.col("s.op") == "D", None).otherwise(F.col("s.v")),
            "(CASE WHEN (s.op = 'D') THEN NULL ELSE s.v END)",
        ),
        (lambda: F.coalesce("s.v", F.lit("x")), "coalesce(s.v, 'x')"),
        (lambda: F.expr("s.seq > t.seq"), "(s.seq > t.seq)"),
        (lambda: F.col("my col"), '"my col"'),
    ],
)
def test_columns_become_datafusion_sql(spark, column, sql):
    assert to_sql(column()) == sql


def test_duplicate_source_matches_fail_like_delta_spark(spark, tmp_path):
    path = tmp_path / "t"
    table = _target(spark, path)
    source = spark.createDataFrame([(1, 8, "x"), (1, 9, "y")], "id long, seq long, name string")
    with pytest.raises(DeltaError, match="multiple source rows"):
        table.alias("t").merge(source.alias("s"), "t.id = s.id").whenMatchedUpdate(set={"name": "s.name"}).execute()
    assert RsTable(str(path)).version() == 1


@pytest.mark.parametrize("partitioned", [False, True])
def test_merge_result_reads_back_through_the_delta_format(spark, tmp_path, partitioned):
    path = tmp_path / "t"
    table = _target(spark, path, partitioned=partitioned)
    source = spark.createDataFrame(CHANGES, SOURCE_DDL)
    (
        table.alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedDelete("s.op = 'D'")
        .whenMatchedUpdateAll("s.seq > t.seq")
        .whenNotMatchedInsertAll("s.op <> 'D'")
        .execute()
    )
    expected = _expected_upsert(TARGET, CHANGES)
    spark_rows = spark.read.format("delta").load(str(path)).orderBy("id").collect()
    got = [r.asDict() for r in spark_rows]
    for r in got:
        if r["updated_at"] is not None:  # session time zone is UTC; Spark returns naive datetimes
            r["updated_at"] = r["updated_at"].replace(tzinfo=UTC)
    assert [{k: r[k] for k in TARGET_SCHEMA.names} for r in got] == expected


def test_merge_records_commit_info(spark, tmp_path):
    path = tmp_path / "t"
    write_deltalake(str(path), pa.Table.from_pylist(TARGET, schema=TARGET_SCHEMA))
    source = spark.createDataFrame(CHANGES, SOURCE_DDL).drop("op")
    (
        DeltaTable.forPath(spark, str(path))
        .alias("t")
        .merge(source.alias("s"), "t.id = s.id")
        .whenMatchedUpdateAll(condition="s.seq > t.seq")
        .withCommitInfo({"dagster_run_id": "run-42", "userMetadata": "nightly"})
        .execute()
    )
    last = RsTable(str(path)).history(1)[0]
    assert last["operation"] == "MERGE"
    assert last["dagster_run_id"] == "run-42"
    assert last["userMetadata"] == "nightly"
    updated = {r["id"]: r["seq"] for r in read_with_duckdb(path).to_pylist()}
    assert updated == {1: 5, 2: 7, 3: 6, 4: 5}
