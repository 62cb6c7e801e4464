"""Landing files with bytes that are not UTF-8 do not stop the bronze streams.

The contract says the files are UTF-8, but a producer can still deliver a line
in Latin-1 or cut a multi-byte character in two. The real streams run here
(``availableNow``, as the bronze assets run them) over a landing folder with
such an order file and such a customer file, then over files landed after
them: bronze keeps every line of every file (undecodable bytes replaced by
U+FFFD, so delta-rs and DuckDB read the tables back), the later files go in
(the stream is not stuck on the bad one), and silver, fed what bronze holds,
rejects exactly the lines the independent contract reference rejects.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from medallion_assets.ingest import start_bronze_stream
from medallion_assets.pipelines.tpch import transforms as silver
from medallion_assets.pipelines.tpch.contract import CUSTOMER_CSV_COLUMNS
from medallion_assets.pipelines.tpch.feeds import CUSTOMERS_CDC, ORDERS_RAW
from medallion_assets.resources import LakeResource
from medallion_assets_tests.support import contract_reference
from medallion_assets_tests.support.order_events import order_event_line
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

pytestmark = pytest.mark.both_engines

_HEADER = ",".join(CUSTOMER_CSV_COLUMNS).encode()


def _customer_row(op: str, key: int, name: bytes = b"Customer", comment: bytes = b"c") -> bytes:
    return b",".join(
        [
            op.encode(),
            str(key).encode(),
            name,
            b"1 Main St",
            b"3",
            b"13-111-222-3333",
            b"10.00",
            b"BUILDING",
            comment,
            b"2024-01-01T00:00:00Z",
        ]
    )


def _with_bytes(line: str, marker: str, raw: bytes) -> bytes:
    """``line`` as UTF-8 with ``marker`` replaced by ``raw`` (bytes that need not be UTF-8)."""
    assert marker in line
    return line.encode("utf-8").replace(marker.encode("utf-8"), raw)


def _land(folder: Path, name: str, lines: list[bytes]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"\n".join(lines) + b"\n")


def _ingest(spark, lake: LakeResource) -> None:
    for feed in (ORDERS_RAW, CUSTOMERS_CDC):
        query = start_bronze_stream(spark, lake, feed)
        query.awaitTermination()
        assert query.exception() is None


def _file_name(uri: str) -> str:
    return uri.rsplit("/", 1)[-1]


def _delivered_order_lines(folder: Path) -> list[tuple[str, str]]:
    """(file, line) of every landed order line, decoded by Python with undecodable bytes replaced."""
    return sorted(
        (path.name, line.decode("utf-8", errors="replace"))
        for path in folder.glob("*.json")
        for line in path.read_bytes().splitlines()
    )


def _delivered_customer_rows(folder: Path) -> list[tuple]:
    """(file, CSV fields as bronze keeps them, corrupt record) of every landed customer record.

    Decoded by Python with undecodable bytes replaced; an empty field is null
    (Spark's CSV default), a record without the header's field count is kept
    whole as the corrupt record.
    """
    width = len(CUSTOMER_CSV_COLUMNS)
    rows = []
    for path in folder.glob("*.csv"):
        text = path.read_bytes().decode("utf-8", errors="replace")
        lines = text.splitlines()
        for line, fields in zip(lines[1:], csv.reader(io.StringIO("\n".join(lines[1:]))), strict=False):
            padded = [field or None for field in fields[:width]] + [None] * (width - len(fields))
            rows.append((path.name, *padded, line if len(fields) != width else None))
    return sorted(rows, key=repr)


def _bronze_order_lines(table) -> list[tuple[str, str]]:
    return sorted((_file_name(row["_source_file"]), row["value"]) for row in table.to_pylist())


def _bronze_customer_rows(table) -> list[tuple]:
    columns = [*CUSTOMER_CSV_COLUMNS, "_corrupt_record"]
    return sorted(
        ((_file_name(row["_source_file"]), *(row[name] for name in columns)) for row in table.to_pylist()), key=repr
    )


def _assert_bronze_holds_every_landed_line(lake: LakeResource, landing: Path) -> None:
    orders_path = lake.table_path(["bronze", "orders_raw"])
    customers_path = lake.table_path(["bronze", "customers_cdc"])
    expected_orders = _delivered_order_lines(landing / "orders")
    expected_customers = _delivered_customer_rows(landing / "customers")
    for read in (read_with_deltalake, read_with_duckdb):
        assert _bronze_order_lines(read(orders_path)) == expected_orders, read.__name__
        assert _bronze_customer_rows(read(customers_path)) == expected_customers, read.__name__


def _file_and_reason(rejects) -> list[tuple[str, str]]:
    rows = rejects.select(
        F.regexp_extract("_source_file", r"((orders|customers)/[^/]+)$", 1).alias("file"), "reason"
    ).collect()
    return sorted((row.file, row.reason) for row in rows)


def test_undecodable_bytes_are_kept_replaced_and_do_not_stop_the_streams(spark, tmp_path):
    lake = LakeResource(root=str(tmp_path / "lake"))
    landing = Path(lake.landing_dir)
    orders, customers = landing / "orders", landing / "customers"
    _land(
        orders,
        "batch-00001.json",
        [
            _with_bytes(order_event_line(1, "e1", order_fields={"o_comment": "@"}), "@", "café ☕".encode()),
            # Valid JSON but for one Latin-1 byte in a string: rejected all the same.
            _with_bytes(order_event_line(2, "e2", order_fields={"o_comment": "@"}), "@", b"caf\xe9"),
            # A cut three-byte character, an encoded surrogate and a stray continuation byte,
            # first on the line: the column's greatest value, so in the writer's min/max statistics.
            b'\xe2\x82 \xed\xa0\x80 \x80 {"event_id": "e3"}',
            order_event_line(4, "e4").encode("utf-8"),
        ],
    )
    _land(
        customers,
        "batch-00001.csv",
        [
            _HEADER,
            _customer_row("I", 1, name="José".encode()),
            _customer_row("I", 2, name=b"Jos\xe9"),  # Latin-1: otherwise a valid change
            b"U,3,\xff\xfe",  # too few fields as well; the encoding is checked first
            _customer_row("I", 4),
        ],
    )

    _ingest(spark, lake)

    _assert_bronze_holds_every_landed_line(lake, landing)

    # Files landed after the bad ones go in on the next run: nothing is stuck.
    _land(orders, "batch-00002.json", [order_event_line(5, "e5").encode(), order_event_line(2, "e6").encode()])
    _land(customers, "batch-00002.csv", [_HEADER, _customer_row("U", 1, comment=b"later")])
    _ingest(spark, lake)

    _assert_bronze_holds_every_landed_line(lake, landing)
    orders_raw = read_with_deltalake(lake.table_path(["bronze", "orders_raw"]))
    customers_cdc = read_with_deltalake(lake.table_path(["bronze", "customers_cdc"]))
    assert {_file_name(uri) for uri in orders_raw.column("_source_file").to_pylist()} == {
        "batch-00001.json",
        "batch-00002.json",
    }
    assert {_file_name(uri) for uri in customers_cdc.column("_source_file").to_pylist()} == {
        "batch-00001.csv",
        "batch-00002.csv",
    }

    # Silver, fed what bronze holds, agrees with the independent contract reference line by line.
    events, order_rejects = silver.parse_order_events(spark.createDataFrame(orders_raw))
    changes, customer_rejects = silver.parse_customer_changes(spark.createDataFrame(customers_cdc))
    expected_rejects = sorted(contract_reference.expected_reject_reasons(landing))
    assert sorted(_file_and_reason(order_rejects) + _file_and_reason(customer_rejects)) == expected_rejects
    assert {reason for _, reason in expected_rejects} == {"not valid UTF-8"}
    expected_orders, expected_lineitem = contract_reference.expected_orders(landing)
    winners = silver.latest_order_changes(events)
    assertDataFrameEqual(silver.order_rows(winners), spark.createDataFrame(expected_orders))
    assertDataFrameEqual(silver.lineitem_rows(winners), spark.createDataFrame(expected_lineitem))
    assertDataFrameEqual(
        silver.latest_customer_state(changes), spark.createDataFrame(contract_reference.expected_customers(landing))
    )
