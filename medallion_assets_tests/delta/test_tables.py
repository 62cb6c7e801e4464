"""DeltaTable: builder, forPath, history, detail, DML, optimize, vacuum, restore, properties.

Every write is read back with delta-rs and with DuckDB's delta extension.
"""

from __future__ import annotations

import datetime as dt
import time
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable as RsTable
from deltalake import write_deltalake
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual

from medallion_assets.delta import (
    DeltaError,
    DeltaOptionError,
    NotADeltaTableError,
    UnsupportedTypeError,
)
from medallion_assets.delta.tables import DeltaTable
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb, rows

UTC = dt.UTC

ORDERS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("amount", pa.decimal128(10, 2)),
        pa.field("day", pa.date32()),
        pa.field("ts", pa.timestamp("us", tz="UTC")),
        pa.field("note", pa.string()),
    ]
)

ORDERS = [
    {
        "id": 1,
        "amount": Decimal("10.50"),
        "day": dt.date(2024, 1, 1),
        "ts": dt.datetime(2024, 1, 1, 8, 0, tzinfo=UTC),
        "note": "a",
    },
    {"id": 2, "amount": Decimal("-3.25"), "day": dt.date(2024, 1, 1), "ts": None, "note": None},
    {
        "id": 3,
        "amount": None,
        "day": dt.date(2024, 1, 2),
        "ts": dt.datetime(2024, 1, 2, 23, 59, 59, 123456, tzinfo=UTC),
        "note": "c",
    },
    {
        "id": 4,
        "amount": Decimal("99999999.99"),
        "day": dt.date(2024, 1, 2),
        "ts": dt.datetime(1999, 12, 31, tzinfo=UTC),
        "note": "d",
    },
]


def _create_orders(spark, path, *, partitioned=False, properties=None):
    builder = (
        DeltaTable.create(spark)
        .location(str(path))
        .addColumn("id", "bigint", nullable=False, comment="order id")
        .addColumn("amount", T.DecimalType(10, 2))
        .addColumn("day", "date")
        .addColumn("ts", T.TimestampType())
        .addColumn("note", "string")
        .comment("orders for tests")
    )
    if partitioned:
        builder = builder.partitionedBy("day")
    for k, v in (properties or {}).items():
        builder = builder.property(k, v)
    return builder.execute()


def _insert(path, records):
    write_deltalake(str(path), pa.Table.from_pylist(records, schema=ORDERS_SCHEMA), mode="append")


def _both(path, sort_by="id"):
    a = rows(read_with_deltalake(path), sort_by=sort_by)
    b = rows(read_with_duckdb(path), sort_by=sort_by)
    return a, b


# ----------------------------------------------------------------------------- builder


@pytest.mark.parametrize("partitioned", [False, True])
def test_create_builds_the_schema_partitioning_and_properties(spark, tmp_path, partitioned):
    path = tmp_path / "orders"
    table = _create_orders(
        spark, path, partitioned=partitioned, properties={"delta.appendOnly": "false", "owner": "qa"}
    )
    assert isinstance(table, DeltaTable)
    rs = RsTable(str(path))
    schema = rs.schema().to_arrow()
    assert [f.name for f in schema] == ["id", "amount", "day", "ts", "note"]
    fields = pa.schema(schema)
    assert fields.field("id").type == pa.int64() and not fields.field("id").nullable
    assert fields.field("amount").type == pa.decimal128(10, 2)
    assert fields.field("day").type == pa.date32()
    assert fields.field("ts").type == pa.timestamp("us", tz="UTC")
    meta = rs.metadata()
    assert meta.partition_columns == (["day"] if partitioned else [])
    assert meta.configuration["owner"] == "qa"
    assert meta.description == "orders for tests"
    assert '"comment":"order id"' in rs.schema().to_json()

    _insert(path, ORDERS)
    a, b = _both(path)
    assert a == ORDERS
    assert b == ORDERS
    detail = table.detail().first()
    assert detail.partitionColumns == (["day"] if partitioned else [])
    assert detail.format == "delta"
    assert detail.description == "orders for tests"
    assert detail.properties["owner"] == "qa"
    assert detail.numFiles == len(RsTable(str(path)).file_uris())
    assert detail.numFiles >= (2 if partitioned else 1)
    assert detail.sizeInBytes > 0
    assert detail.location.rstrip("/").endswith("orders")
    assert detail.minReaderVersion >= 1 and detail.minWriterVersion >= 2


def test_timestamp_ntz_and_struct_from_addColumns(spark, tmp_path):
    path = tmp_path / "ntz"
    schema = T.StructType(
        [
            T.StructField("k", T.IntegerType()),
            T.StructField("local", T.TimestampNTZType()),
            T.StructField("tags", T.ArrayType(T.StringType())),
            T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
            T.StructField("pt", T.StructType([T.StructField("x", T.DoubleType())])),
        ]
    )
    DeltaTable.create(spark).location(str(path)).addColumns(schema).execute()
    arrow = pa.schema(RsTable(str(path)).schema().to_arrow())
    assert arrow.field("local").type == pa.timestamp("us")
    assert arrow.field("k").type == pa.int32()
    data = pa.Table.from_pylist(
        [
            {
                "k": 1,
                "local": dt.datetime(2024, 5, 1, 12, 30),
                "tags": ["x", None],
                "attrs": [("a", 1)],
                "pt": {"x": 1.5},
            },
            {"k": 2, "local": None, "tags": None, "attrs": None, "pt": None},
        ],
        schema=pa.schema([pa.field(f.name, f.type) for f in arrow]),
    )
    write_deltalake(str(path), data, mode="append")
    assert rows(read_with_deltalake(path), sort_by="k")[0]["local"] == dt.datetime(2024, 5, 1, 12, 30)
    duck = rows(read_with_duckdb(path), sort_by="k")
    assert [r["k"] for r in duck] == [1, 2]
    assert duck[0]["tags"] == ["x", None]


def test_create_refuses_an_existing_table_and_replace_needs_one(spark, tmp_path):
    path = tmp_path / "t"
    _create_orders(spark, path)
    with pytest.raises(DeltaError, match="already exists") as err:
        _create_orders(spark, path)
    assert str(path) in str(err.value)
    with pytest.raises(NotADeltaTableError):
        DeltaTable.replace(spark).location(str(tmp_path / "none")).addColumn("a", "int").execute()


def test_create_if_not_exists_keeps_data_and_create_or_replace_replaces(spark, tmp_path):
    path = tmp_path / "t"
    _create_orders(spark, path)
    _insert(path, ORDERS[:2])
    DeltaTable.createIfNotExists(spark).location(str(path)).addColumn("other", "string").execute()
    assert rows(read_with_deltalake(path), sort_by="id") == ORDERS[:2]

    DeltaTable.createOrReplace(spark).location(str(path)).addColumn("other", "string").execute()
    replaced = read_with_deltalake(path)
    assert replaced.column_names == ["other"] and replaced.num_rows == 0
    assert read_with_duckdb(path).num_rows == 0

    DeltaTable.replace(spark).location(str(path)).addColumn("x", "int").execute()
    assert read_with_deltalake(path).column_names == ["x"]


def test_builder_argument_errors(spark, tmp_path):
    with pytest.raises(DeltaError, match="location"):
        DeltaTable.create(spark).tableName("db.orders")
    with pytest.raises(DeltaError, match="location"):
        DeltaTable.create(spark).addColumn("a", "int").execute()
    with pytest.raises(DeltaOptionError, match="partition column 'nope'"):
        DeltaTable.create(spark).location(str(tmp_path / "a")).addColumn("a", "int").partitionedBy("nope").execute()
    with pytest.raises(DeltaOptionError, match="duplicate"):
        DeltaTable.create(spark).location(str(tmp_path / "b")).addColumn("a", "int").addColumn("A", "int").execute()
    with pytest.raises(DeltaOptionError, match="not a Spark SQL type"):
        DeltaTable.create(spark).location(str(tmp_path / "c")).addColumn("a", "notatype(")
    with pytest.raises(UnsupportedTypeError, match="'span'"):
        (
            DeltaTable.create(spark)
            .location(str(tmp_path / "d"))
            .addColumn("a", "int")
            .addColumn("span", T.DayTimeIntervalType())
            .execute()
        )
    with pytest.raises(UnsupportedTypeError, match="'nothing'"):
        DeltaTable.create(spark).location(str(tmp_path / "e")).addColumn("nothing", T.NullType()).execute()
    assert not RsTable.is_deltatable(str(tmp_path / "d"))


# ----------------------------------------------------------------------------- forPath / toDF / history


def test_for_path_and_is_delta_table(spark, tmp_path):
    path = tmp_path / "t"
    assert not DeltaTable.isDeltaTable(spark, str(path))
    with pytest.raises(NotADeltaTableError) as err:
        DeltaTable.forPath(spark, str(path))
    assert str(path) in str(err.value)
    (tmp_path / "plain").mkdir()
    with pytest.raises(NotADeltaTableError):
        DeltaTable.forPath(spark, str(tmp_path / "plain"))
    _create_orders(spark, path)
    assert DeltaTable.isDeltaTable(spark, str(path))
    assert DeltaTable.forPath(spark, str(path)).path == str(path)
    with pytest.raises(DeltaError, match="forPath"):
        DeltaTable.forName(spark, "db.t")


def test_to_df_reads_the_latest_version(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path, partitioned=True)
    _insert(path, ORDERS)
    df = table.toDF()
    assert sorted(df.columns) == sorted(["id", "amount", "day", "ts", "note"])
    got = sorted((r.id, r.amount, r.day, r.note) for r in df.collect())
    assert got == sorted((r["id"], r["amount"], r["day"], r["note"]) for r in ORDERS)
    aliased = table.alias("o").toDF().select(F.col("o.id")).collect()
    assert sorted(r.id for r in aliased) == [1, 2, 3, 4]


def test_history_has_delta_spark_columns(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path)
    _insert(path, ORDERS)
    table.delete("id = 1")
    hist = table.history()
    assert hist.columns[:2] == ["version", "timestamp"]
    for name in [
        "operation",
        "operationParameters",
        "readVersion",
        "isolationLevel",
        "isBlindAppend",
        "operationMetrics",
        "userMetadata",
        "engineInfo",
    ]:
        assert name in hist.columns
    assert dict(hist.dtypes)["operationParameters"] == "map<string,string>"
    assert dict(hist.dtypes)["timestamp"] == "timestamp"
    got = [(r.version, r.operation) for r in hist.collect()]
    assert got == [(2, "DELETE"), (1, "WRITE"), (0, "CREATE TABLE")]
    assert [r.version for r in table.history(1).collect()] == [2]
    last = table.history(1).first()
    assert last.readVersion == 1
    assert isinstance(last.operationParameters["predicate"], str)
    now = dt.datetime.now(UTC).replace(tzinfo=None)
    assert abs((last.timestamp - now).total_seconds()) < 600  # session time zone is UTC
    with pytest.raises(DeltaOptionError):
        table.history(0)


# ----------------------------------------------------------------------------- delete / update


@pytest.mark.parametrize("partitioned", [False, True])
def test_delete_with_string_and_column_conditions(spark, tmp_path, partitioned):
    path = tmp_path / "t"
    table = _create_orders(spark, path, partitioned=partitioned)
    _insert(path, ORDERS)
    table.delete("amount < 0")
    expected = [r for r in ORDERS if not (r["amount"] is not None and r["amount"] < 0)]
    a, b = _both(path)
    assert a == expected and b == expected
    table.delete(F.col("day") == F.lit(dt.date(2024, 1, 2)))
    expected = [r for r in expected if r["day"] != dt.date(2024, 1, 2)]
    a, b = _both(path)
    assert a == expected and b == expected
    assert table.lastOperationMetrics["num_deleted_rows"] == 2 or partitioned
    table.delete()
    assert _both(path) == ([], [])


def test_update_with_set_dicts_and_columns(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path, partitioned=True)
    _insert(path, ORDERS)
    table.update("id = 2", {"note": "'fixed'", "amount": "amount * 2"})
    table.update(condition=F.col("note").isNull(), set={"note": F.lit("was null")})
    table.update(set={"id": "id + 100"})
    table.updateExpr("id = 101", {"amount": "coalesce(amount, 0) + 1"})
    expected = []
    for r in ORDERS:
        r = dict(r)
        if r["id"] == 2:
            r["note"] = "fixed"
            r["amount"] = r["amount"] * 2
        if r["note"] is None:
            r["note"] = "was null"
        r["id"] += 100
        if r["id"] == 101:
            r["amount"] = (r["amount"] or 0) + 1
        expected.append(r)
    a, b = _both(path)
    assert a == expected and b == expected
    with pytest.raises(DeltaOptionError):
        table.update("id = 1")
    with pytest.raises(DeltaError, match="UPDATE"):
        table.update("no_such_col = 1", {"note": "'x'"})
    assert [r["id"] for r in read_with_deltalake(path).to_pylist()].count(101) == 1


# ----------------------------------------------------------------------------- optimize


def test_optimize_compaction_where_and_zorder(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path, partitioned=True)
    for r in ORDERS:
        _insert(path, [r])  # one file per row: 2 per partition
    before = len(RsTable(str(path)).file_uris())
    assert before == 4
    result = table.optimize().where("day = '2024-01-01'").executeCompaction()
    metrics = result.first().metrics
    assert metrics.numFilesRemoved == 2 and metrics.numFilesAdded == 1
    assert len(RsTable(str(path)).file_uris()) == 3
    metrics = table.optimize().executeCompaction().first().metrics
    assert metrics.numFilesRemoved == 2 and metrics.numFilesAdded == 1
    assert len(RsTable(str(path)).file_uris()) == 2
    a, b = _both(path)
    assert a == ORDERS and b == ORDERS

    z = table.optimize().executeZOrderBy("id", "amount").first().metrics
    assert z.numFilesAdded is not None
    a, b = _both(path)
    assert a == ORDERS and b == ORDERS
    hist_ops = [r.operation for r in table.history(2).collect()]
    assert hist_ops[0] == "OPTIMIZE"
    with pytest.raises(DeltaOptionError, match="not a partition column"):
        table.optimize().where("id = 1").executeCompaction()
    with pytest.raises(DeltaOptionError, match="partition columns"):
        table.optimize().executeZOrderBy("day")


# ----------------------------------------------------------------------------- vacuum


def test_vacuum_refuses_short_retention_unless_disabled(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path)
    _insert(path, ORDERS[:2])
    _insert(path, ORDERS[2:])
    table.optimize().executeCompaction()  # the two small files are now unreferenced
    live = set(RsTable(str(path)).file_uris())
    on_disk = {str(p) for p in path.glob("*.parquet")}
    stale = on_disk - live
    assert len(stale) == 2

    with pytest.raises(DeltaError) as err:
        table.vacuum(0)
    message = str(err.value)
    assert str(path) in message and "0 hours" in message and "168 hours" in message

    assert table.vacuum().count() == 0  # default retention: files are too young
    assert {str(p) for p in path.glob("*.parquet")} == on_disk

    dry = table.vacuum(0, enforceRetentionDuration=False, dryRun=True)
    assert len(dry.collect()) == 2
    assert {str(p) for p in path.glob("*.parquet")} == on_disk

    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        deleted = table.vacuum(0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert len(deleted.collect()) == 2
    assert {str(p) for p in path.glob("*.parquet")} == live
    a, b = _both(path)
    assert a == ORDERS and b == ORDERS


def test_vacuum_minimum_comes_from_the_table_property(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path, properties={"delta.deletedFileRetentionDuration": "interval 2 hours"})
    with pytest.raises(DeltaError, match="minimum of 2 hours"):
        table.vacuum(1)
    assert table.vacuum(2).count() == 0
    with pytest.raises(DeltaOptionError):
        table.vacuum(-1, enforceRetentionDuration=False)


# ----------------------------------------------------------------------------- restore


def test_restore_to_version_and_timestamp(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path)
    _insert(path, ORDERS[:2])  # v1
    time.sleep(0.05)
    after_v1 = dt.datetime.now(UTC)
    time.sleep(0.05)
    _insert(path, ORDERS[2:])  # v2
    table.delete("id = 1")  # v3
    out = table.restoreToVersion(1).first()
    assert out.num_of_files_after_restore == 1
    assert out.num_restored_files >= 0 and out.num_removed_files >= 1
    a, b = _both(path)
    assert a == ORDERS[:2] and b == ORDERS[:2]
    assert table.history(1).first().operation == "RESTORE"

    table.restoreToVersion(2)
    a, b = _both(path)
    assert a == ORDERS and b == ORDERS
    table.restoreToTimestamp(after_v1.isoformat())
    a, b = _both(path)
    assert a == ORDERS[:2] and b == ORDERS[:2]
    with pytest.raises(DeltaOptionError, match="latest version"):
        table.restoreToVersion(99)


# ----------------------------------------------------------------------------- properties, constraints, protocol


def test_properties_constraints_and_protocol(spark, tmp_path):
    path = tmp_path / "t"
    table = _create_orders(spark, path)
    _insert(path, ORDERS)
    table.setProperties({"delta.enableChangeDataFeed": "true", "team": "data"})
    table.setProperty("delta.logRetentionDuration", "interval 60 days")
    config = RsTable(str(path)).metadata().configuration
    assert config["delta.enableChangeDataFeed"] == "true"
    assert config["team"] == "data"
    assert config["delta.logRetentionDuration"] == "interval 60 days"
    assert table.detail().first().properties["team"] == "data"

    with pytest.raises(DeltaError, match="team"):
        table.unsetProperties(["team"])
    table.unsetProperties(["not.set"])  # a no-op, like UNSET TBLPROPERTIES IF EXISTS
    with pytest.raises(DeltaOptionError):
        table.unsetProperties(["not.set"], ifExists=False)

    table.addConstraint("id_positive", "id > 0")
    assert RsTable(str(path)).metadata().configuration["delta.constraints.id_positive"] == "id > 0"
    from medallion_assets.delta import ConstraintViolationError

    version = RsTable(str(path)).version()
    with pytest.raises(ConstraintViolationError):
        table.addConstraint("small", "id < 3")
    assert RsTable(str(path)).version() == version
    table.unsetProperty("delta.constraints.id_positive")
    assert "delta.constraints.id_positive" not in RsTable(str(path)).metadata().configuration
    table.dropConstraint("never_there")  # IF EXISTS by default
    with pytest.raises(DeltaError):
        table.dropConstraint("never_there", ifExists=False)

    table.upgradeTableProtocol(2, 5)
    protocol = RsTable(str(path)).protocol()
    assert (protocol.min_reader_version, protocol.min_writer_version) == (2, 5)
    assert "columnMapping" in table.detail().first().tableFeatures
    table.upgradeTableProtocol(1, 2)  # never lowers
    assert RsTable(str(path)).protocol().min_writer_version == 5

    other = _create_orders(spark, tmp_path / "u")
    other.addFeatureSupport("appendOnly")
    protocol = RsTable(str(tmp_path / "u")).protocol()
    assert protocol.min_writer_version == 7 and "appendOnly" in protocol.writer_features
    assert "appendOnly" in other.detail().first().tableFeatures
    with pytest.raises(DeltaOptionError, match="unknown"):
        other.addFeatureSupport("teleportation")
    a, b = _both(path)
    assert a == ORDERS and b == ORDERS


def test_detail_row_schema(spark, tmp_path):
    table = _create_orders(spark, tmp_path / "t", partitioned=True)
    detail = table.detail()
    expected = [
        "format",
        "id",
        "name",
        "description",
        "location",
        "createdAt",
        "lastModified",
        "partitionColumns",
        "clusteringColumns",
        "numFiles",
        "sizeInBytes",
        "properties",
        "minReaderVersion",
        "minWriterVersion",
        "tableFeatures",
    ]
    assert detail.columns == expected
    row = detail.first()
    assert row.numFiles == 0 and row.sizeInBytes == 0
    assert row.id == RsTable(str(tmp_path / "t")).metadata().id
    assertDataFrameEqual(
        detail.select("format", "partitionColumns"),
        spark.createDataFrame([("delta", ["day"])], "format string, partitionColumns array<string>"),
    )


def test_convert_parquet_folder_to_delta(spark, tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "raw"
    for day, ids in (("2024-01-01", [1, 2]), ("2024-01-02", [3])):
        folder = path / f"day={day}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), folder / "part-0.parquet")
    table = DeltaTable.convertToDelta(spark, f"parquet.`{path}`", "day date")
    assert table.detail().first().partitionColumns == ["day"]
    expected = [
        {"id": 1, "day": dt.date(2024, 1, 1)},
        {"id": 2, "day": dt.date(2024, 1, 1)},
        {"id": 3, "day": dt.date(2024, 1, 2)},
    ]
    a, b = _both(path)
    assert [{"id": r["id"], "day": r["day"]} for r in a] == expected
    assert [{"id": r["id"], "day": r["day"]} for r in b] == expected
    with pytest.raises(DeltaError, match="already a Delta table"):
        DeltaTable.convertToDelta(spark, str(path))
