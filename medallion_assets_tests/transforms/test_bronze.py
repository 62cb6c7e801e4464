"""Bronze: schemas, ingestion columns and reading the landed files."""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, TimestampType

from medallion_assets.transforms import bronze


def test_latest_reference_snapshot_is_the_greatest_visible_name():
    files = [
        "landing/reference/part/batch-00001.parquet",
        "landing/reference/part/batch-00003.parquet",
        "landing/reference/part/.batch-00004.parquet.tmp",
        "landing/reference/part/_batch-00009.parquet",
        "landing/reference/part/batch-00002.parquet",
    ]
    assert bronze.latest_reference_snapshot(files) == "landing/reference/part/batch-00003.parquet"
    assert bronze.latest_reference_snapshot([]) is None


def test_orders_raw_keeps_each_line_and_where_it_came_from(spark, tmp_path):
    lines = ['{"event_id": "a"}', "not json at all", '{"event_id": "b"}']
    (tmp_path / "batch-00001-001.json").write_text("\n".join(lines) + "\n", encoding="utf-8")

    raw = bronze.orders_raw(spark.read.text(str(tmp_path)))

    assert [(f.name, f.dataType) for f in raw.schema.fields] == [
        (f.name, f.dataType) for f in bronze.ORDERS_RAW_SCHEMA.fields
    ]
    rows = raw.collect()
    assert sorted(row.value for row in rows) == sorted(lines)
    assert {row._source_file.rsplit("/", 1)[-1] for row in rows} == {"batch-00001-001.json"}
    assert all(row._ingested_at is not None for row in rows)


def test_customers_cdc_reads_rfc4180_and_flags_malformed_lines(spark, tmp_path):
    text = (
        ",".join(bronze.CUSTOMER_CSV_COLUMNS)
        + "\n"
        + 'I,1,Customer#1,"12 Main St, Apt ""B""",3,13-111-222-3333,10.50,BUILDING," lead, comma",1998-09-01T00:00:00Z\n'
        + "U,2,cut short\n"
        + "D,3,,,,,,,,1998-09-02T00:00:00Z\n"
    )
    (tmp_path / "batch-00001.csv").write_text(text, encoding="utf-8")

    cdc = bronze.customers_cdc(
        spark.read.schema(bronze.CUSTOMERS_CSV_READ_SCHEMA).options(**bronze.CUSTOMERS_CSV_OPTIONS).csv(str(tmp_path))
    )

    assert cdc.schema.fieldNames() == bronze.CUSTOMERS_CDC_SCHEMA.fieldNames()
    assert all(isinstance(f.dataType, StringType) for f in cdc.schema.fields[:-1])
    assert isinstance(cdc.schema["_ingested_at"].dataType, TimestampType)
    rows = {row.c_custkey: row for row in cdc.orderBy("c_custkey").collect()}
    assert rows["1"].c_address == '12 Main St, Apt "B"'
    assert rows["1"].c_comment == " lead, comma"
    assert rows["1"]._corrupt_record is None
    assert rows["2"]._corrupt_record == "U,2,cut short"
    assert rows["3"]._corrupt_record is None and rows["3"].c_name is None
    assert cdc.where(F.col("_source_file").endswith("batch-00001.csv")).count() == 3
