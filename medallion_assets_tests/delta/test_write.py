"""``write_delta``: Spark's Parquet writer plus one delta-rs commit, checked with independent readers.

Input tables are built by delta-rs (``write_deltalake``), not by the writer under test.
"""

from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from medallion_assets.delta import (
    ConcurrentWriteError,
    ConstraintViolationError,
    SchemaMismatchError,
    UnsupportedFeatureError,
    read_delta,
    write_delta,
)
from medallion_assets.delta._commit import commit_write
from medallion_assets.delta._write import STAGING_PREFIX
from medallion_assets_tests.support.readers import SAMPLE_SCHEMA as SPARK_SCHEMA
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb, rows, seed_map_of_structs

ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("region", pa.string()),
        ("amount", pa.decimal128(15, 2)),
        ("day", pa.date32()),
        ("at", pa.timestamp("us", tz="UTC")),
        ("note", pa.string()),
    ]
)


def sample(start: int, count: int) -> list[dict]:
    regions = ["EU", "US", "A/S=I%A", None]
    return [
        {
            "id": i,
            "region": regions[i % 4],
            "amount": Decimal(i * 101) / Decimal(100),
            "day": dt.date(2024, 1, 1) + dt.timedelta(days=i % 40),
            "at": dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC) + dt.timedelta(hours=i),
            "note": None if i % 5 == 0 else f"row {i}",
        }
        for i in range(start, start + count)
    ]


def frame(spark, data: list[dict]):
    return spark.createDataFrame([tuple(r.values()) for r in data], SPARK_SCHEMA)


def seed_with_delta_rs(path: str, data: list[dict], **kwargs) -> None:
    deltalake.write_deltalake(path, pa.Table.from_pylist(data, schema=ARROW_SCHEMA), **kwargs)


def assert_readers_see(path: str, data: list[dict]) -> None:
    want = rows(pa.Table.from_pylist(data, schema=ARROW_SCHEMA), sort_by="id")
    for reader in (read_with_deltalake, read_with_duckdb):
        assert rows(reader(path).select(ARROW_SCHEMA.names), sort_by="id") == want, f"{reader.__name__} disagrees"


def data_files_on_disk(path: str) -> set[str]:
    found = set()
    for folder, _, names in os.walk(path):
        if "_delta_log" in folder:
            continue
        found.update(os.path.relpath(os.path.join(folder, n), path) for n in names if n.endswith(".parquet"))
    return found


def test_appends_and_overwrites_a_partitioned_table_made_by_delta_rs(spark, tmp_path):
    path = str(tmp_path / "t")
    seed_with_delta_rs(path, sample(0, 12), partition_by=["region"])

    assert write_delta(frame(spark, sample(12, 30)), path, mode="append", options={"userMetadata": "batch 2"}) == 1
    assert_readers_see(path, sample(0, 42))
    assertDataFrameEqual(read_delta(spark, path), frame(spark, sample(0, 42)))
    table = deltalake.DeltaTable(path)
    assert table.history(1)[0]["userMetadata"] == "batch 2"
    assert not [n for n in os.listdir(path) if n.startswith(STAGING_PREFIX)], "the staging folder is gone"

    assert write_delta(frame(spark, sample(100, 8)), path, mode="overwrite") == 2
    assert_readers_see(path, sample(100, 8))


def test_statistics_come_from_the_files_and_prune_files(spark, tmp_path):
    path = str(tmp_path / "t")
    write_delta(frame(spark, sample(0, 400)).repartition(4, "id"), path, mode="overwrite")
    actions = pa.table(deltalake.DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    assert len(actions) == 4
    for action in actions:
        data = pq.read_table(os.path.join(path, action["path"]))
        assert action["num_records"] == data.num_rows
        assert action["min.id"] == pc.min(data["id"]).as_py()
        assert action["max.amount"] == pc.max(data["amount"]).as_py()
        assert action["null_count.note"] == data["note"].null_count
        assert action["min.day"] == pc.min(data["day"]).as_py()
    one_file = actions[0]
    pruned = deltalake.DeltaTable(path).file_uris(
        file_pruning_predicate=f"id >= {one_file['min.id']} AND id <= {one_file['min.id']}"
    )
    assert len(pruned) < 4, "delta-rs skips files by the statistics write_delta recorded"


def test_a_new_table_is_partitioned_as_asked_and_escapes_partition_values(spark, tmp_path):
    path = str(tmp_path / "t")
    write_delta(frame(spark, sample(0, 20)), path, mode="append", partition_by=["region"])
    table = deltalake.DeltaTable(path)
    assert table.metadata().partition_columns == ["region"]
    values = {a["partition.region"] for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()}
    assert values == {"EU", "US", "A/S=I%A", None}
    assert_readers_see(path, sample(0, 20))
    with pytest.raises(SchemaMismatchError, match="partitioned by"):
        write_delta(frame(spark, sample(20, 2)), path, mode="append", partition_by=["day"])


def test_replace_where_comparing_two_partition_columns_keeps_the_other_partitions(spark, tmp_path):
    path = str(tmp_path / "t")
    schema = pa.schema([("p1", pa.int64()), ("p2", pa.int64()), ("v", pa.string())])
    original = [{"p1": a, "p2": b, "v": f"old {a}{b}"} for a in range(3) for b in range(3)]
    deltalake.write_deltalake(path, pa.Table.from_pylist(original, schema=schema), partition_by=["p1", "p2"])
    new = [{"p1": i, "p2": i, "v": f"new {i}"} for i in range(3)]

    write_delta(
        spark.createDataFrame([tuple(r.values()) for r in new], "p1 long, p2 long, v string"),
        path,
        mode="overwrite",
        options={"replaceWhere": "p1 = p2"},
    )

    key = ["p1", "p2", "v"]
    expected = [r for r in original if r["p1"] != r["p2"]] + new
    assert rows(read_with_deltalake(path), sort_by=key) == rows(
        pa.Table.from_pylist(expected, schema=schema), sort_by=key
    )
    with pytest.raises(ConstraintViolationError, match="replaceWhere"):
        write_delta(
            spark.createDataFrame([(0, 1, "outside")], "p1 long, p2 long, v string"),
            path,
            mode="overwrite",
            options={"replaceWhere": "p1 = p2"},
        )


def test_dynamic_partition_overwrite_replaces_only_the_partitions_written(spark, tmp_path):
    path = str(tmp_path / "t")
    seed_with_delta_rs(path, sample(0, 12), partition_by=["region"])
    eu = [r for r in sample(50, 8) if r["region"] == "EU"]
    write_delta(frame(spark, eu), path, mode="overwrite", options={"partitionOverwriteMode": "dynamic"})
    assert_readers_see(path, [r for r in sample(0, 12) if r["region"] != "EU"] + eu)


def test_a_row_breaking_a_constraint_commits_nothing_and_leaves_no_file(spark, tmp_path):
    path = str(tmp_path / "t")
    strict = ARROW_SCHEMA.set(0, pa.field("id", pa.int64(), nullable=False))
    deltalake.write_deltalake(path, pa.Table.from_pylist(sample(1, 5), schema=strict))
    deltalake.DeltaTable(path).alter.add_constraint({"amount_positive": "amount * 2 > 0"})
    before = data_files_on_disk(path)
    version = deltalake.DeltaTable(path).version()

    with pytest.raises(ConstraintViolationError, match="amount_positive") as err:
        write_delta(frame(spark, sample(0, 3)), path, mode="append")  # id 0 has amount 0.00
    assert '"id":0' in str(err.value), "the message shows the violating row"
    with pytest.raises(ConstraintViolationError, match="NOT NULL column 'id'"):
        write_delta(frame(spark, [{**sample(7, 1)[0], "id": None}]), path, mode="append")

    assert deltalake.DeltaTable(path).version() == version
    assert data_files_on_disk(path) == before
    assert not [n for n in os.listdir(path) if n.startswith(STAGING_PREFIX)]
    write_delta(frame(spark, sample(10, 3)), path, mode="append")
    assert_readers_see(path, sample(1, 5) + sample(10, 3))


def test_a_replayed_application_transaction_writes_once(spark, tmp_path):
    path = str(tmp_path / "t")
    seed_with_delta_rs(path, sample(0, 4))
    options = {"txnAppId": "bronze-orders", "txnVersion": "7"}
    assert write_delta(frame(spark, sample(4, 4)), path, mode="append", options=options) == 1
    files = data_files_on_disk(path)
    assert write_delta(frame(spark, sample(4, 4)), path, mode="append", options=options) is None
    assert data_files_on_disk(path) == files
    assert_readers_see(path, sample(0, 8))


def test_schema_is_enforced_and_merge_schema_adds_columns(spark, tmp_path):
    path = str(tmp_path / "t")
    seed_with_delta_rs(path, sample(0, 4))
    wider = frame(spark, sample(4, 2)).withColumn("channel", F.lit("web"))
    with pytest.raises(SchemaMismatchError, match="channel"):
        write_delta(wider, path, mode="append")
    assert deltalake.DeltaTable(path).version() == 0
    write_delta(wider, path, mode="append", options={"mergeSchema": "true"})
    got = read_delta(spark, path)
    assertDataFrameEqual(
        got, frame(spark, sample(0, 4)).withColumn("channel", F.lit(None).cast("string")).unionByName(wider)
    )
    # A narrower frame fills the missing column with nulls, as format("delta") does.
    write_delta(frame(spark, sample(6, 1)), path, mode="append")
    assert read_with_duckdb(path).num_rows == 7


def test_merge_schema_adds_a_field_to_a_struct_column(spark, tmp_path):
    path = str(tmp_path / "t")
    info = pa.struct([("a", pa.int64())])
    deltalake.write_deltalake(
        path,
        pa.table(
            {
                "id": pa.array([1], pa.int64()),
                "info": pa.array([{"a": 1}], info),
                "parts": pa.array([[{"a": 1}]], pa.list_(info)),
            }
        ),
    )
    grown = spark.createDataFrame(
        [(2, (2, "x"), [(3, 0.5)])], "id long, info struct<a: long, b: string>, parts array<struct<a: long, w: double>>"
    )
    with pytest.raises(SchemaMismatchError, match="'info' is struct<a:bigint,b:string> in the data"):
        write_delta(grown, path, mode="append")
    assert deltalake.DeltaTable(path).version() == 0
    write_delta(grown, path, mode="append", options={"mergeSchema": "true"})
    expected = [
        {"id": 1, "info": {"a": 1, "b": None}, "parts": [{"a": 1, "w": None}]},
        {"id": 2, "info": {"a": 2, "b": "x"}, "parts": [{"a": 3, "w": 0.5}]},
    ]
    for reader in (read_with_deltalake, read_with_duckdb):
        assert rows(reader(path), sort_by="id") == expected


def test_merge_schema_refuses_fields_added_inside_map_values_and_commits_nothing(spark, tmp_path):
    # deltalake could add them, but could not MERGE into or DELETE from the table afterwards.
    path = str(tmp_path / "t")
    seed_map_of_structs(path, "by_name")
    grown = spark.createDataFrame([(2, {"m": (4, 1.5)})], "id long, by_name map<string, struct<a: long, w: double>>")
    with pytest.raises(
        SchemaMismatchError, match=r"'by_name' gains struct fields inside the values of map 'by_name'.*delta-spark"
    ):
        write_delta(grown, path, mode="append", options={"mergeSchema": "true"})
    assert deltalake.DeltaTable(path).version() == 0
    assert len(data_files_on_disk(path)) == 1
    # Values of the stored type still append, and the map's struct may grow inside a column of its own.
    kept = spark.createDataFrame(
        [(3, {"n": (5,)}, {"m": (4, 1.5)})],
        "id long, by_name map<string, struct<a: long>>, by_name_v2 map<string, struct<a: long, w: double>>",
    )
    write_delta(kept, path, mode="append", options={"mergeSchema": "true"})
    expected = [
        {"id": 1, "by_name": [("k", {"a": 1})], "by_name_v2": None},
        {"id": 3, "by_name": [("n", {"a": 5})], "by_name_v2": [("m", {"a": 4, "w": 1.5})]},
    ]
    for reader in (read_with_deltalake, read_with_duckdb):
        assert rows(reader(path), sort_by="id") == expected


def test_a_whole_overwrite_with_merge_schema_grows_the_schema_in_its_own_commit_maps_included(spark, tmp_path):
    # No file written before stays, so deltalake can still change the table afterwards.
    path = str(tmp_path / "t")
    seed_map_of_structs(path, "by_name")
    grown = spark.createDataFrame(
        [(2, {"m": (4, 1.5)}, "x"), (3, {"n": (5, None)}, None)],
        "id long, by_name map<string, struct<a: long, w: double>>, note string",
    )
    with pytest.raises(SchemaMismatchError, match="'by_name' gains struct fields inside the values of map"):
        write_delta(grown, path, mode="overwrite", options={"mergeSchema": "true", "replaceWhere": "id >= 2"})
    assert deltalake.DeltaTable(path).version() == 0
    write_delta(grown, path, mode="overwrite", options={"mergeSchema": "true"})
    table = deltalake.DeltaTable(path)
    assert table.version() == 1
    table.delete("id = 3")
    expected = [{"id": 2, "by_name": [("m", {"a": 4, "w": 1.5})], "note": "x"}]
    for reader in (read_with_deltalake, read_with_duckdb):
        assert rows(reader(path), sort_by="id") == expected


def test_empty_overwrite_empties_the_table(spark, tmp_path):
    path = str(tmp_path / "t")
    seed_with_delta_rs(path, sample(0, 4))
    write_delta(frame(spark, []), path, mode="overwrite")
    assert read_with_deltalake(path).num_rows == 0
    assert read_with_duckdb(path).num_rows == 0


def test_timestamp_partition_columns_are_refused_with_the_way_out(spark, tmp_path):
    with pytest.raises(UnsupportedFeatureError, match='format\\("delta"\\)'):
        write_delta(frame(spark, sample(0, 2)), str(tmp_path / "t"), mode="append", partition_by=["at"])


def test_an_overwrite_losing_to_a_concurrent_append_commits_nothing(spark, tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    seed_with_delta_rs(path, sample(0, 4))
    from medallion_assets.delta import _write

    def append_first(plan, files, **kwargs):
        deltalake.write_deltalake(path, pa.Table.from_pylist(sample(4, 2), schema=ARROW_SCHEMA), mode="append")
        return commit_write(plan, files, **kwargs)

    monkeypatch.setattr(_write, "commit_write", append_first)
    with pytest.raises(ConcurrentWriteError):
        write_delta(frame(spark, sample(100, 3)), path, mode="overwrite")
    assert_readers_see(path, sample(0, 6))
    assert len(data_files_on_disk(path)) == 2, "the losing overwrite's files are removed"
