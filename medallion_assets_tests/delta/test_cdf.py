"""Change data feed: read_change_feed_batches and DeltaTable.changes after update/delete/merge."""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake

from medallion_assets.delta import DeltaError, DeltaOptionError, NotADeltaTableError
from medallion_assets.delta._cdf import read_change_feed_batches
from medallion_assets.delta.tables import DeltaTable
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string()), pa.field("amount", pa.decimal128(8, 2))])
CDF_TYPES = {
    "_change_type": pa.string(),
    "_commit_version": pa.int64(),
    "_commit_timestamp": pa.timestamp("us", tz="UTC"),
}


def _table(spark, path, cdf=True, partitioned=False):
    builder = (
        DeltaTable.create(spark)
        .location(str(path))
        .addColumn("id", "bigint")
        .addColumn("v", "string")
        .addColumn("amount", "decimal(8,2)")
    )
    if partitioned:
        builder = builder.partitionedBy("v")
    if cdf:
        builder = builder.property("delta.enableChangeDataFeed", "true")
    table = builder.execute()  # v0
    write_deltalake(
        str(path),
        pa.Table.from_pylist(
            [
                {"id": 1, "v": "a", "amount": Decimal("1.00")},
                {"id": 2, "v": "b", "amount": None},
                {"id": 3, "v": "c", "amount": Decimal("3.50")},
            ],
            schema=SCHEMA,
        ),
        mode="append",
    )  # v1
    return table


def _changes(reader_or_table):
    t = pa.table(reader_or_table) if not isinstance(reader_or_table, pa.Table) else reader_or_table
    return sorted((r["_commit_version"], r["_change_type"], r["id"], r["v"], r["amount"]) for r in t.to_pylist())


@pytest.mark.parametrize("partitioned", [False, True])
def test_change_feed_after_update_delete_merge(spark, tmp_path, partitioned):
    path = tmp_path / "t"
    table = _table(spark, path, partitioned=partitioned)
    table.update("id = 1", {"amount": "amount + 1"})  # v2
    table.delete("id = 2")  # v3
    source = spark.createDataFrame(
        [(3, "c", Decimal("30.00")), (4, "d", None)], "id long, v string, amount decimal(8,2)"
    )
    table.alias("t").merge(
        source.alias("s"), "t.id = s.id"
    ).whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()  # v4

    reader = read_change_feed_batches(str(path))
    assert isinstance(reader, pa.RecordBatchReader)
    data = reader.read_all()
    assert data.column_names == ["id", "v", "amount", "_change_type", "_commit_version", "_commit_timestamp"]
    for name, typ in CDF_TYPES.items():
        assert data.schema.field(name).type == typ
    expected = sorted(
        [
            (1, "insert", 1, "a", Decimal("1.00")),
            (1, "insert", 2, "b", None),
            (1, "insert", 3, "c", Decimal("3.50")),
            (2, "update_preimage", 1, "a", Decimal("1.00")),
            (2, "update_postimage", 1, "a", Decimal("2.00")),
            (3, "delete", 2, "b", None),
            (4, "update_preimage", 3, "c", Decimal("3.50")),
            (4, "update_postimage", 3, "c", Decimal("30.00")),
            (4, "insert", 4, "d", None),
        ]
    )
    assert _changes(data) == expected

    # Commit timestamps match the log's.
    log_ts = {h["version"]: h["timestamp"] for h in RsTable(str(path)).history()}
    for r in data.to_pylist():
        ms = int(r["_commit_timestamp"].timestamp() * 1000)
        assert abs(ms - log_ts[r["_commit_version"]]) <= 1

    ranged = read_change_feed_batches(str(path), starting_version=2, ending_version=3)
    assert _changes(ranged) == [e for e in expected if 2 <= e[0] <= 3]

    df = table.changes(startingVersion=3)
    assert dict(df.dtypes)["_commit_version"] == "bigint"
    assert dict(df.dtypes)["_commit_timestamp"] == "timestamp"
    got = sorted((r._commit_version, r._change_type, r.id, r.v, r.amount) for r in df.collect())
    assert got == [e for e in expected if e[0] >= 3]

    final = sorted(r["id"] for r in read_with_duckdb(path).to_pylist())
    assert final == [1, 3, 4] == sorted(r["id"] for r in read_with_deltalake(path).to_pylist())


def test_change_feed_by_timestamp(spark, tmp_path):
    path = tmp_path / "t"
    table = _table(spark, path)
    time.sleep(0.05)
    middle = dt.datetime.now(dt.UTC)
    time.sleep(0.05)
    table.delete("id = 3")  # v2
    got = _changes(read_change_feed_batches(str(path), starting_timestamp=middle))
    assert got == [(2, "delete", 3, "c", Decimal("3.50"))]
    got = _changes(read_change_feed_batches(str(path), ending_timestamp=middle.isoformat()))
    assert [g[0] for g in got] == [1, 1, 1]


def test_change_feed_needs_the_property(spark, tmp_path):
    path = tmp_path / "t"
    table = _table(spark, path, cdf=False)
    table.delete("id = 1")
    with pytest.raises(DeltaError, match="delta.enableChangeDataFeed") as err:
        read_change_feed_batches(str(path))
    assert str(path) in str(err.value)
    with pytest.raises(DeltaError, match="enableChangeDataFeed"):
        table.changes()

    # Enabled later: the feed is readable from that commit on.
    table.setProperty("delta.enableChangeDataFeed", "true")  # v3
    table.update("id = 2", {"v": "'B'"})  # v4
    got = _changes(read_change_feed_batches(str(path), starting_version=4))
    assert got == [(4, "update_postimage", 2, "B", None), (4, "update_preimage", 2, "b", None)]


def test_change_feed_argument_errors(spark, tmp_path):
    path = tmp_path / "t"
    _table(spark, path)
    with pytest.raises(NotADeltaTableError):
        read_change_feed_batches(str(tmp_path / "missing"))
    with pytest.raises(DeltaOptionError):
        read_change_feed_batches(str(path), starting_version=0, starting_timestamp="2024-01-01")
    with pytest.raises(DeltaOptionError):
        read_change_feed_batches(str(path), starting_version=3, ending_version=1)
    with pytest.raises(DeltaOptionError):
        read_change_feed_batches(str(path), starting_timestamp="yesterday")
    with pytest.raises(DeltaError, match="latest version"):
        read_change_feed_batches(str(path), starting_version=50)
    cols = read_change_feed_batches(str(path), columns=["id"]).read_all()
    assert cols.column_names == ["id", "_change_type", "_commit_version", "_commit_timestamp"]


def _append(path, ids):
    write_deltalake(
        path,
        pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]}),
        mode="append",
        configuration={"delta.enableChangeDataFeed": "true"},
    )


def test_added_rows_of_an_append_only_range_are_read_from_its_new_files(spark, tmp_path):
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.delta._read import read_added_rows

    path = str(tmp_path / "t")
    for ids in ([1, 2], [3], [4, 5], [6]):  # versions 0..3, each an append by delta-rs
        _append(path, ids)
    added = read_added_rows(spark, path, after_version=0, to_version=2)
    assertDataFrameEqual(added, spark.createDataFrame([(3, "n3"), (4, "n4"), (5, "n5")], "id long, name string"))
    # Spark scans exactly the files of versions 1 and 2: the rows never pass through the driver.
    new_files = {f.split("/")[-1] for f in RsTable(path, version=2).file_uris()} - {
        f.split("/")[-1] for f in RsTable(path, version=0).file_uris()
    }
    assert {f.split("/")[-1] for f in added.inputFiles()} == new_files and len(new_files) == 2
    assertDataFrameEqual(
        read_added_rows(spark, path, after_version=-1, to_version=0),
        spark.createDataFrame([(1, "n1"), (2, "n2")], "id long, name string"),
    )


def test_added_rows_defer_to_the_change_feed_when_a_commit_removed_data(spark, tmp_path):
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.delta._read import read_added_rows
    from medallion_assets.storage.engines import DeltaRsEngine

    path = str(tmp_path / "t")
    _append(path, [1, 2])
    _append(path, [3])
    RsTable(path).optimize.compact()  # version 2: compacts version 0's file with version 1's
    _append(path, [4])
    assert read_added_rows(spark, path, after_version=0, to_version=3) is None
    # The engine then reads the change feed: OPTIMIZE replays nothing.
    inserts = DeltaRsEngine().read_inserts(spark, path, after_version=0, to_version=3)
    assertDataFrameEqual(inserts, spark.createDataFrame([(3, "n3"), (4, "n4")], "id long, name string"))
    RsTable(path).delete("id = 4")  # version 4
    assert read_added_rows(spark, path, after_version=3, to_version=4) is None


def test_commit_labels_stay_right_when_a_commit_lands_while_history_is_listed(tmp_path, monkeypatch):
    import deltalake

    from medallion_assets.delta._read import _commits_after

    path = str(tmp_path / "t")
    _append(path, [1, 2])  # version 0
    _append(path, [3])  # version 1
    RsTable(path).delete("id = 1")  # version 2
    _append(path, [4])  # version 3
    listed = deltalake.DeltaTable.history
    landed = []

    def history_while_a_writer_commits(self, limit=None):
        if not landed:  # a concurrent append lands after the load, before the listing
            landed.append(True)
            _append(path, [5])  # version 4
        return listed(self, limit)

    monkeypatch.setattr(deltalake.DeltaTable, "history", history_while_a_writer_commits)
    by_version = {c["version"]: c["operation"] for c in _commits_after(path, 1, None)}
    assert by_version[2] == "DELETE" and by_version[3] == "WRITE"
