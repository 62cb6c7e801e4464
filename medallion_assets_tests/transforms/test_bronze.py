"""Bronze: schemas, ingestion columns and reading the landed files."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, TimestampType

from medallion_assets.pipelines.tpch import transforms as tpch
from medallion_assets.pipelines.tpch.contract import CUSTOMER_CSV_COLUMNS
from medallion_assets.transforms import bronze


def test_latest_snapshot_is_the_greatest_visible_name():
    files = [
        "landing/reference/part/batch-00001.parquet",
        "landing/reference/part/batch-00003.parquet",
        "landing/reference/part/.batch-00004.parquet.tmp",
        "landing/reference/part/_batch-00009.parquet",
        "landing/reference/part/batch-00002.parquet",
    ]
    assert bronze.latest_snapshot(files) == "landing/reference/part/batch-00003.parquet"
    assert bronze.latest_snapshot([]) is None


def test_orders_raw_keeps_each_line_and_where_it_came_from(spark, tmp_path):
    lines = ['{"event_id": "a"}', "not json at all", '{"event_id": "b"}']
    (tmp_path / "batch-00001-001.json").write_text("\n".join(lines) + "\n", encoding="utf-8")

    raw = bronze.landed_lines(spark.read.text(str(tmp_path)))

    assert [(f.name, f.dataType) for f in raw.schema.fields] == [
        (f.name, f.dataType) for f in bronze.LINES_SCHEMA.fields
    ]
    rows = raw.collect()
    assert sorted(row.value for row in rows) == sorted(lines)
    assert {row._source_file.rsplit("/", 1)[-1] for row in rows} == {"batch-00001-001.json"}
    assert all(row._ingested_at is not None for row in rows)


def test_customers_cdc_reads_rfc4180_and_flags_malformed_lines(spark, tmp_path):
    text = (
        ",".join(CUSTOMER_CSV_COLUMNS)
        + "\n"
        + 'I,1,Customer#1,"12 Main St, Apt ""B""",3,13-111-222-3333,10.50,BUILDING,'
        + '" lead, comma",1998-09-01T00:00:00Z\n'
        + "U,2,cut short\n"
        + "D,3,,,,,,,,1998-09-02T00:00:00Z\n"
    )
    (tmp_path / "batch-00001.csv").write_text(text, encoding="utf-8")

    cdc = tpch.customers_cdc(
        spark.read.schema(tpch.CUSTOMERS_CSV_READ_SCHEMA).options(**tpch.CUSTOMERS_CSV_OPTIONS).csv(str(tmp_path))
    )

    assert cdc.schema.fieldNames() == tpch.CUSTOMERS_CDC_SCHEMA.fieldNames()
    assert all(
        isinstance(f.dataType, StringType) for f in cdc.schema.fields if f.name not in ("_ingested_at", "_header")
    )
    assert isinstance(cdc.schema["_ingested_at"].dataType, TimestampType)
    # Each row carries its file's header, read apart from Spark's parse, for silver to compare.
    assert {tuple(row._header) for row in cdc.collect()} == {tuple(CUSTOMER_CSV_COLUMNS)}
    rows = {row.c_custkey: row for row in cdc.orderBy("c_custkey").collect()}
    assert rows["1"].c_address == '12 Main St, Apt "B"'
    assert rows["1"].c_comment == " lead, comma"
    assert rows["1"]._corrupt_record is None
    assert rows["2"]._corrupt_record == "U,2,cut short"
    assert rows["3"]._corrupt_record is None and rows["3"].c_name is None
    assert cdc.where(F.col("_source_file").endswith("batch-00001.csv")).count() == 3


def test_orders_raw_replaces_undecodable_bytes_and_keeps_every_line(spark, tmp_path):
    """A line with bytes that are not UTF-8 is kept, those bytes replaced by U+FFFD."""
    lines = [
        '{"event_id": "a", "o_comment": "café ☕"}'.encode(),
        b'{"event_id": "b", "o_comment": "caf\xe9"}',  # Latin-1
        b"cut \xe2\x82, surrogate \xed\xa0\x80, stray \x80\x80, overlong \xc0\xaf",
        "a literal \ufffd is valid UTF-8".encode("utf-8"),
        b'{"event_id": "c"}',
    ]
    (tmp_path / "batch-00001-001.json").write_bytes(b"\n".join(lines) + b"\n")

    raw = bronze.landed_lines(spark.read.text(str(tmp_path)))

    assert raw.where(~F.is_valid_utf8("value")).count() == 0
    # What Python's decoder makes of the bytes, undecodable ones replaced.
    assert sorted(row.value for row in raw.collect()) == sorted(
        line.decode("utf-8", errors="replace") for line in lines
    )
    # Valid Arrow strings: what the delta-rs writer and every reader need.
    raw.select("value").toArrow().validate(full=True)


def test_customers_cdc_fields_are_valid_utf8_with_undecodable_bytes_replaced(spark, tmp_path):
    """Spark's CSV reader decodes with Java's decoder, which replaces undecodable bytes; bronze keeps that."""
    header = ",".join(CUSTOMER_CSV_COLUMNS).encode()
    good = "I,1,José,1 Main St,3,13-111-222-3333,10.00,BUILDING,c,1998-09-01T00:00:00Z".encode()
    latin1 = b"I,2,Jos\xe9,1 Main St,3,13-111-222-3333,10.00,BUILDING,c,1998-09-01T00:00:00Z"
    short = b"U,3,\xff\xfe"
    (tmp_path / "batch-00001.csv").write_bytes(b"\n".join([header, good, latin1, short]) + b"\n")

    cdc = tpch.customers_cdc(
        spark.read.schema(tpch.CUSTOMERS_CSV_READ_SCHEMA).options(**tpch.CUSTOMERS_CSV_OPTIONS).csv(str(tmp_path))
    )

    strings = [*CUSTOMER_CSV_COLUMNS, "_corrupt_record"]
    assert cdc.where(F.exists(F.array(*strings), lambda s: ~F.is_valid_utf8(s))).count() == 0
    rows = {row.c_custkey: row for row in cdc.collect()}
    assert [rows[key].c_name for key in ("1", "2", "3")] == [
        line.split(b",")[2].decode("utf-8", errors="replace") for line in (good, latin1, short)
    ]
    assert rows["3"]._corrupt_record == short.decode("utf-8", errors="replace")
    cdc.select(*strings).toArrow().validate(full=True)


def test_making_text_valid_keeps_the_bronze_schemas_nullability_included(spark, tmp_path):
    """Existing bronze tables were created from the stream frames' schemas; those must not change."""
    (tmp_path / "orders").mkdir()
    (tmp_path / "customers").mkdir()
    text = spark.readStream.format("text").load(str(tmp_path / "orders"))
    csv_rows = (
        spark.readStream.format("csv")
        .schema(tpch.CUSTOMERS_CSV_READ_SCHEMA)
        .options(**tpch.CUSTOMERS_CSV_OPTIONS)
        .load(str(tmp_path / "customers"))
    )

    as_read = bronze.with_ingestion_columns(text).select(*bronze.LINES_SCHEMA.fieldNames())
    assert bronze.landed_lines(text).schema == as_read.schema
    as_read = bronze.with_ingestion_columns(csv_rows).select(
        *(name for name in tpch.CUSTOMERS_CDC_SCHEMA.fieldNames() if name != bronze.HEADER_COLUMN)
    )
    # The header column is the one bronze adds after them (an older table gains it, nullable).
    assert tpch.customers_cdc(csv_rows).drop(bronze.HEADER_COLUMN).schema == as_read.schema
    assert tpch.customers_cdc(csv_rows).schema[bronze.HEADER_COLUMN].nullable


def test_a_snapshots_values_become_the_text_silver_validates_and_its_changes_are_what_differs(spark, tmp_path):
    import datetime as dt
    from decimal import Decimal

    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.types import DateType, DecimalType, LongType

    from medallion_assets.feeds import ApplyChanges, Feed, Field, LandingSnapshots
    from medallion_assets.transforms import silver

    feed = Feed(
        name="stock_raw",
        description="Stock.",
        source=LandingSnapshots(folder="stock"),
        fields=(
            Field("sku"),
            Field("count", LongType()),
            Field("price", DecimalType(10, 2)),
            Field("day", DateType()),
            Field("at", TimestampType()),
            Field("absent", nullable=True),
        ),
        silver=ApplyChanges(table="stock", keys=("sku",)),
    )
    at = dt.datetime(2026, 3, 1, 12, 34, 56, 1, tzinfo=dt.UTC)
    rows = pa.table(
        {
            "sku": ["A", "B", "C"],
            "count": pa.array([7, 8, 9], pa.int64()),
            "price": pa.array([Decimal("12.50"), Decimal("1.00"), Decimal("2.00")], pa.decimal128(10, 2)),
            "day": pa.array([dt.date(2026, 3, 1)] * 3, pa.date32()),
            "at": pa.array([at] * 3, pa.timestamp("us", "UTC")),
        }
    )
    pq.write_table(rows, tmp_path / "snap-1.parquet")
    text = bronze.snapshot_text(spark.read.parquet(str(tmp_path / "snap-1.parquet")), feed)

    assert [f.dataType for f in text.schema.fields] == [StringType()] * len(feed.fields)
    # Each text is what silver takes for its declared type.
    typed = [silver.typed_value(F.col(f.name), f.type).alias(f"typed_{f.name}") for f in feed.fields[1:5]]
    [first] = text.where(F.col("sku") == "A").select("*", *typed).collect()
    got = first.asDict()
    assert got.pop("typed_at") is not None  # the instant itself: Python shows it in the process's time zone
    assert got == {
        "sku": "A",
        "count": "7",
        "price": "12.50",
        "day": "2026-03-01",
        "at": "2026-03-01T12:34:56.000001Z",
        "absent": None,
        "typed_count": 7,
        "typed_price": Decimal("12.50"),
        "typed_day": dt.date(2026, 3, 1),
    }

    # B changed, C gone, D new, A the same: an upsert of B and D, a delete of C.
    before = text
    after = spark.createDataFrame(
        [
            ("A", "7", "12.50", "2026-03-01", "2026-03-01T12:34:56.000001Z", None),
            ("B", "80", "1.00", "2026-03-01", "2026-03-01T12:34:56.000001Z", None),
            ("D", "1", "3.00", "2026-03-02", "2026-03-02T00:00:00.000000Z", None),
        ],
        text.schema,
    )
    diff = bronze.snapshot_changes(after, before, feed)
    changes = {(r["sku"], r["_change"], r["count"]) for r in diff.collect()}
    assert changes == {("B", "upsert", "80"), ("D", "upsert", "1"), ("C", "delete", None)}

    # Silver judges the changes' text: a value that does not fit is a reason; a delete needs only its key.
    bad = spark.createDataFrame([("E", "ten", "1.00", "2026-03-01", "2026-03-01T00:00:00.000000Z", None)], text.schema)
    bronze_rows = diff.unionByName(bronze.snapshot_changes(bad, before.limit(0), feed)).select(
        "*",
        F.lit("snap-2.parquet").alias("_snapshot"),
        F.lit("file:/snap-2.parquet").alias("_source_file"),
        F.current_timestamp().alias("_ingested_at"),
    )
    judged = {
        r["sku"]: r["reason"]
        for r in silver.judge_changes(bronze_rows, feed)
        .select(F.col("_typed_sku").alias("sku"), F.col("_reject_reason").alias("reason"))
        .collect()
    }
    assert judged == {"B": None, "C": None, "D": None, "E": "count is not an integer: 'ten'"}
