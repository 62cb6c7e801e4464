"""Silver: parsing with reasons, latest state, masking and history, checked
against the independent contract reference on a simulated delivery."""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from medallion_assets.expectations import ObservedInput
from medallion_assets.pipelines.tpch import simulator
from medallion_assets.pipelines.tpch import transforms as silver
from medallion_assets.pipelines.tpch import transforms as tpch
from medallion_assets.pipelines.tpch.contract import CUSTOMER_CSV_COLUMNS, REFERENCE_TABLES
from medallion_assets.transforms import bronze
from medallion_assets_tests.support import contract_reference

UTC = dt.UTC


@pytest.fixture(scope="module")
def landing(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("silver") / "landing"
    simulator.land_all(folder, scale_factor=0.001, batches=2, seed=5)
    return folder


@pytest.fixture(scope="module")
def orders_raw(spark, landing):
    return bronze.landed_lines(spark.read.text(str(landing / "orders")))


@pytest.fixture(scope="module")
def customers_cdc(spark, landing):
    reader = spark.read.schema(tpch.CUSTOMERS_CSV_READ_SCHEMA).options(**tpch.CUSTOMERS_CSV_OPTIONS)
    return tpch.customers_cdc(reader.csv(str(landing / "customers")))


def _file_and_reason(rejects) -> list[tuple[str, str]]:
    rows = rejects.select(
        F.regexp_extract("_source_file", r"((orders|customers)/[^/]+)$", 1).alias("file"), "reason"
    ).collect()
    return sorted((row.file, row.reason) for row in rows)


def test_orders_and_lineitem_equal_the_contract_reference(spark, landing, orders_raw):
    events, _ = silver.parse_order_events(orders_raw)
    winners = silver.latest_order_changes(events).cache()
    expected_orders, expected_lineitem = contract_reference.expected_orders(landing)

    assertDataFrameEqual(silver.order_rows(winners), spark.createDataFrame(expected_orders))
    assertDataFrameEqual(silver.lineitem_rows(winners), spark.createDataFrame(expected_lineitem))
    orders, lineitem = silver.latest_order_state(events)
    assert orders.schema == silver.ORDERS_SCHEMA
    assert lineitem.schema == silver.LINEITEM_SCHEMA
    winners.unpersist()


def test_order_rejects_equal_the_contract_reference(landing, orders_raw):
    _, rejects = silver.parse_order_events(orders_raw)
    expected = sorted(r for r in contract_reference.expected_reject_reasons(landing) if r[0].startswith("orders/"))
    assert expected
    assert _file_and_reason(rejects) == expected


def test_customers_equal_the_contract_reference(spark, landing, customers_cdc):
    changes, rejects = silver.parse_customer_changes(customers_cdc)
    expected = contract_reference.expected_customers(landing)

    state = silver.latest_customer_state(changes).cache()
    assertDataFrameEqual(state, spark.createDataFrame(expected))
    assertDataFrameEqual(
        silver.mask_customer_pii(state), spark.createDataFrame(contract_reference.masked_customers(expected))
    )
    state.unpersist()
    expected_rejects = sorted(
        r for r in contract_reference.expected_reject_reasons(landing) if r[0].startswith("customers/")
    )
    assert _file_and_reason(rejects) == expected_rejects


def test_csv_fields_past_the_contract_are_ignored_when_the_rest_is_valid(spark, tmp_path):
    """Schema drift in the customer feed: a file whose header adds a column."""
    header = [*CUSTOMER_CSV_COLUMNS, "c_email"]
    rows = [
        [
            "I",
            "7",
            "Customer#7",
            "1 Main St",
            "3",
            "13-111-222-3333",
            "10.00",
            "BUILDING",
            "c",
            "2024-01-01T00:00:00Z",
            "a@b.c",
        ],
        [
            "U",
            "8",
            "Customer, 8",
            "1 Main St",
            "3",
            "13-111-222-3333",
            "11.00",
            "BUILDING",
            "c",
            "2024-01-01T00:00:00Z",
            "x,y",
        ],
        [
            "U",
            "9",
            "Customer#9",
            "1 Main St",
            "3",
            "13-111-222-3333",
            "12.3.4",
            "BUILDING",
            "c",
            "2024-01-01T00:00:00Z",
            "z",
        ],
        ["U", "10", "a line cut short"],
    ]
    folder = tmp_path / "customers"
    folder.mkdir()
    with (folder / "drifted.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerows([header, *rows])
    reader = spark.read.schema(tpch.CUSTOMERS_CSV_READ_SCHEMA).options(**tpch.CUSTOMERS_CSV_OPTIONS)

    changes, rejects = silver.parse_customer_changes(tpch.customers_cdc(reader.csv(str(folder))))

    assertDataFrameEqual(
        changes.select("op", "c_custkey", "c_name", "c_acctbal"),
        [("I", 7, "Customer#7", Decimal("10.00")), ("U", 8, "Customer, 8", Decimal("11.00"))],
    )
    assert sorted(row.reason for row in rejects.collect()) == ["malformed CSV line", "malformed CSV line"]
    # The independent reference gives each row the same verdict.
    for fields in rows[:2]:
        assert contract_reference.parse_customer_row(fields)["c_custkey"] in (7, 8)
    for fields in rows[2:]:
        with pytest.raises(ValueError, match="^malformed CSV line$"):
            contract_reference.parse_customer_row(fields)


def test_a_csv_file_whose_header_is_not_the_declaration_is_rejected_whole(spark, tmp_path):
    """Spark reads CSV fields by position: a file with two columns swapped, or other columns,
    must not parse as the declared fields; the other files go through."""
    good = [
        "I",
        "7",
        "Customer#7",
        "1 Main St",
        "3",
        "13-111-222-3333",
        "10.00",
        "BUILDING",
        "c",
        "2024-01-01T00:00:00Z",
    ]
    swapped = list(CUSTOMER_CSV_COLUMNS)
    swapped[2], swapped[8] = swapped[8], swapped[2]  # c_name and c_comment: both text, valid either way
    folder = tmp_path / "customers"
    folder.mkdir()
    for name, header, rows in (
        ("a.csv", CUSTOMER_CSV_COLUMNS, [good]),
        ("b.csv", swapped, [good, [*good[:1], "8", *good[2:]]]),
        ("c.csv", ["id", "name", "favourite_colour"], [["1", "x", "blue"]]),
    ):
        with (folder / name).open("w", newline="", encoding="utf-8") as handle:
            # Python's csv defaults: lines end with \r\n; a.csv's header quoted too, which must still match.
            quoting = csv.QUOTE_ALL if name == "a.csv" else csv.QUOTE_MINIMAL
            csv.writer(handle, quoting=quoting).writerows([header, *rows])
    reader = spark.read.schema(tpch.CUSTOMERS_CSV_READ_SCHEMA).options(**tpch.CUSTOMERS_CSV_OPTIONS)

    changes, rejects = silver.parse_customer_changes(tpch.customers_cdc(reader.csv(str(folder))))

    assert [(row.c_custkey, row._source_file.rsplit("/", 1)[1]) for row in changes.collect()] == [(7, "a.csv")]
    expected = ", ".join(CUSTOMER_CSV_COLUMNS)
    assert sorted(_file_and_reason(rejects)) == [
        (
            "customers/b.csv",
            f"header does not match the declaration: expected ({expected}), found ({', '.join(swapped)})",
        ),
        (
            "customers/b.csv",
            f"header does not match the declaration: expected ({expected}), found ({', '.join(swapped)})",
        ),
        (
            "customers/c.csv",
            f"header does not match the declaration: expected ({expected}), found (id, name, favourite_colour)",
        ),
    ]
    # Bronze rows from before bronze kept the header (no _header column) are judged as before.
    older, _ = silver.parse_customer_changes(tpch.customers_cdc(reader.csv(str(folder / "b.csv"))).drop("_header"))
    assert older.count() == 2


def test_reference_snapshots_conform_to_the_contract(spark, landing):
    for table in REFERENCE_TABLES:
        files = [str(p) for p in (landing / "reference" / table).iterdir()]
        newest = bronze.latest_snapshot(files)
        conformed = silver.conform_reference(spark.read.parquet(newest), table)
        assert conformed.schema == silver.REFERENCE_SCHEMAS[table]
        assertDataFrameEqual(conformed, spark.createDataFrame(contract_reference.expected_reference(landing, table)))


def _event(event_id, event_time, op, order) -> str:
    return json.dumps({"event_id": event_id, "event_time": event_time, "op": op, "order": order})


def _order(key, **changes) -> dict:
    order = {
        "o_orderkey": key,
        "o_custkey": 7,
        "o_orderstatus": "O",
        "o_totalprice": "100.25",
        "o_orderdate": "1996-01-02",
        "o_orderpriority": "5-LOW",
        "o_clerk": "Clerk#1",
        "o_shippriority": 0,
        "o_comment": "c",
        "lineitems": [
            {
                "l_linenumber": 1,
                "l_partkey": 11,
                "l_suppkey": 12,
                "l_quantity": "2.00",
                "l_extendedprice": "100.25",
                "l_discount": "0.05",
                "l_tax": "0.01",
                "l_returnflag": "N",
                "l_linestatus": "O",
                "l_shipdate": "1996-02-01",
                "l_commitdate": "1996-02-02",
                "l_receiptdate": "1996-02-03",
                "l_shipinstruct": "NONE",
                "l_shipmode": "AIR",
                "l_comment": "l",
            }
        ],
    }
    order.update(changes)
    return order


def _raw(spark, lines):
    ingested = dt.datetime(2026, 1, 1, tzinfo=UTC)
    return spark.createDataFrame([(line, "file:/x/orders/a.json", ingested) for line in lines], bronze.LINES_SCHEMA)


def test_bad_lines_are_rejected_with_reasons_and_good_lines_survive(spark):
    bad_item = _order(4)
    bad_item["lineitems"][0]["l_quantity"] = "2x"
    # A good first item does not hide a bad later one: an empty text field, a missing number.
    empty_text = _order(9)
    empty_text["lineitems"].append({**empty_text["lineitems"][0], "l_linenumber": 2, "l_shipmode": ""})
    missing_number = _order(10)
    missing_number["lineitems"].append({k: v for k, v in missing_number["lineitems"][0].items() if k != "l_tax"})
    lines = [
        _event("e1", "1996-01-03T00:00:00Z", "upsert", _order(1)),
        '{"event_id": "e2", "order": {',
        _event("e3", "1996-01-03T00:00:00Z", "upsert", {k: v for k, v in _order(2).items() if k != "o_orderkey"}),
        _event("e4", "1996-01-03T00:00:00Z", "upsert", _order("2b")),
        _event("e5", "1996-01-03T00:00:00Z", "upsert", _order(3, o_totalprice="abc")),
        _event("e6", "1996-01-03T00:00:00Z", "upsert", _order(3, o_shippriority="high")),
        _event("e7", "1996-01-03T00:00:00Z", "upsert", bad_item),
        _event("e8", "someday", "upsert", _order(5)),
        _event("e9", "1996-01-03T00:00:00Z", "merge", _order(5)),
        _event("e10", "1996-01-03T00:00:00Z", "upsert", _order(6, lineitems="none")),
        _event("e11", "1996-01-03T00:00:00Z", "upsert", _order(7, o_totalprice="1.234")),
        _event("e12", "1996-01-04T00:00:00Z", "delete", {"o_orderkey": 8}),
        "[1, 2]",
        _event("e13", "1996-01-03T00:00:00Z", "upsert", empty_text),
        _event("e14", "1996-01-03T00:00:00Z", "upsert", missing_number),
    ]

    events, rejects = silver.parse_order_events(_raw(spark, lines))

    assert sorted((row.value, row.reason) for row in rejects.collect()) == sorted(
        [
            (lines[1], "not valid JSON"),
            (lines[2], "missing o_orderkey"),
            (lines[3], "o_orderkey is not an integer: '2b'"),
            (lines[4], "o_totalprice is not a decimal: 'abc'"),
            (lines[5], "o_shippriority is not an integer: 'high'"),
            (lines[6], "lineitem 1: l_quantity is not a decimal: '2x'"),
            (lines[7], "event_time is not a timestamp: 'someday'"),
            (lines[8], "op is not upsert or delete: 'merge'"),
            (lines[9], "lineitems is not an array of objects"),
            (lines[10], "o_totalprice is not a decimal: '1.234'"),
            (lines[12], "not a JSON object"),
            (lines[13], "lineitem 2: missing l_shipmode"),
            (lines[14], "lineitem 2: missing l_tax"),
        ]
    )
    # The independent reference gives each line the same verdict.
    for row in rejects.collect():
        with pytest.raises(ValueError, match=f"^{re.escape(row.reason)}$"):
            contract_reference.parse_order_line(row.value)
    good = {row.event_id: row for row in events.collect()}
    assert set(good) == {"e1", "e12"}
    first = good["e1"]
    assert (first.o_orderkey, first.o_totalprice, first.o_orderdate) == (1, Decimal("100.25"), dt.date(1996, 1, 2))
    assert first.event_time == dt.datetime(1996, 1, 3)  # session time zone is UTC
    assert first.lineitems[0].l_discount == Decimal("0.05")
    assert (good["e12"].op, good["e12"].o_orderkey, good["e12"].lineitems) == ("delete", 8, None)
    assert events.schema == silver.ORDER_EVENTS_SCHEMA


def test_latest_order_changes_takes_the_newest_event_whatever_the_arrival(spark):
    lines = [
        # Order 1: the final version first, an older one later, a copy of it.
        _event("b", "1996-01-05T00:00:00Z", "upsert", _order(1, o_orderstatus="F")),
        _event("a", "1996-01-04T00:00:00Z", "upsert", _order(1, o_orderstatus="P")),
        _event("b", "1996-01-05T00:00:00Z", "upsert", _order(1, o_orderstatus="F")),
        # Order 2: inserted, then deleted; the delete arrived first.
        _event("d", "1996-01-06T00:00:00Z", "delete", {"o_orderkey": 2}),
        _event("c", "1996-01-05T00:00:00Z", "upsert", _order(2)),
        # Order 3: same time, the greater event id wins.
        _event("x", "1996-01-05T00:00:00Z", "upsert", _order(3, o_clerk="Clerk#x")),
        _event("y", "1996-01-05T00:00:00Z", "upsert", _order(3, o_clerk="Clerk#y")),
    ]
    events, _ = silver.parse_order_events(_raw(spark, lines))

    changes = {row.o_orderkey: row for row in silver.latest_order_changes(events).collect()}
    assert {key: (row.event_id, row.op) for key, row in changes.items()} == {
        1: ("b", "upsert"),
        2: ("d", "delete"),
        3: ("y", "upsert"),
    }
    orders, lineitem = silver.latest_order_state(events)
    assert sorted((row.o_orderkey, row.o_orderstatus, row.o_clerk) for row in orders.collect()) == [
        (1, "F", "Clerk#1"),
        (3, "O", "Clerk#y"),
    ]
    assert sorted((row.l_orderkey, row.l_linenumber) for row in lineitem.collect()) == [(1, 1), (3, 1)]


def _drifted_lines() -> list[str]:
    gift = _order(2)
    gift["lineitems"][0]["l_gift_wrap"] = True
    return [
        _event("e1", "1996-01-03T00:00:00Z", "upsert", _order(1, o_loyalty_tier="gold", o_channel=3)),
        json.dumps(
            {"event_id": "e2", "event_time": "1996-01-03T00:00:00Z", "op": "upsert", "source": "web", "order": gift}
        ),
        _event("e3", "1996-01-03T00:00:00Z", "upsert", _order(3, **{"O_CLERK": "x", "bad name": 1})),
        _event("e4", "1996-01-04T00:00:00Z", "delete", {"o_orderkey": 4, "o_loyalty_tier": "silver"}),
        "not json",
    ]


def test_drifted_order_fields_are_found_per_level_with_their_line_counts(spark):
    drifted = silver.drifted_order_fields(_raw(spark, _drifted_lines()))

    assert sorted(tuple(row) for row in drifted.collect()) == [
        ("event", "source", 1),
        ("lineitem", "l_gift_wrap", 1),
        ("order", "O_CLERK", 1),
        ("order", "bad name", 1),
        ("order", "o_channel", 1),
        ("order", "o_loyalty_tier", 2),
    ]
    kept, skipped = silver.keep_order_fields((row.level, row.field) for row in drifted.collect())
    assert kept == silver.KeptOrderFields(order=("o_channel", "o_loyalty_tier"), lineitem=("l_gift_wrap",))
    assert skipped == ["event.source", "order.O_CLERK", "order.bad name"]


def test_drifted_fields_are_observed_while_another_query_reads_the_lines(spark):
    # The 'ignore' policy's route: an observation on the parse's input, no scan of its own.
    observed = ObservedInput(
        _raw(spark, _drifted_lines()).repartition(3), drifted=silver.drifted_order_fields_seen(F.col("value"))
    )
    parsed, _ = silver.parse_order_events(observed.frame)
    assert parsed.groupBy("op").count().collect()  # the step's own query, reading every line

    assert sorted((field["level"], field["field"]) for field in observed.metric("drifted")) == [
        ("event", "source"),
        ("lineitem", "l_gift_wrap"),
        ("order", "O_CLERK"),
        ("order", "bad name"),
        ("order", "o_channel"),
        ("order", "o_loyalty_tier"),
    ]
    assert observed.metric("rows") == 5


def test_kept_drift_fields_become_text_columns_and_the_rest_is_ignored(spark):
    raw = _raw(spark, _drifted_lines())
    kept = silver.KeptOrderFields(order=("o_channel", "o_loyalty_tier"), lineitem=("l_gift_wrap",))

    events, rejects = silver.parse_order_events(raw, kept)
    winners = silver.latest_order_changes(events)
    orders, lineitem = silver.order_rows(winners, kept), silver.lineitem_rows(winners, kept)

    assert [row.value for row in rejects.collect()] == ["not json"]  # drift never rejects a line
    assert events.schema == silver.order_events_schema(kept)
    assert orders.columns == [*silver.ORDERS_SCHEMA.fieldNames(), "o_channel", "o_loyalty_tier"]
    assertDataFrameEqual(
        orders.select("o_orderkey", "o_clerk", "o_channel", "o_loyalty_tier"),
        [(1, "Clerk#1", "3", "gold"), (2, "Clerk#1", None, None), (3, "Clerk#1", None, None)],
    )
    assertDataFrameEqual(
        lineitem.select("l_orderkey", "l_linenumber", "l_gift_wrap"), [(1, 1, None), (2, 1, "true"), (3, 1, None)]
    )
    deleted = winners.where("o_orderkey = 4").first()
    assert (deleted.op, deleted.o_loyalty_tier) == ("delete", None)  # a delete carries its key only

    # The default keeps nothing: the same lines give exactly the contract's tables.
    ignored_events, _ = silver.parse_order_events(raw)
    ignored = silver.latest_order_changes(ignored_events)
    assert silver.order_rows(ignored).schema == silver.ORDERS_SCHEMA
    assert silver.lineitem_rows(ignored).schema == silver.LINEITEM_SCHEMA
    assertDataFrameEqual(silver.order_rows(ignored), orders.drop("o_channel", "o_loyalty_tier"))


def _cdc(spark, rows):
    ingested = dt.datetime(2026, 1, 1, tzinfo=UTC)
    padded = [(*row, None, f"file:/x/customers/{file}", ingested, list(CUSTOMER_CSV_COLUMNS)) for file, row in rows]
    return spark.createDataFrame(padded, tpch.CUSTOMERS_CDC_SCHEMA)


def _customer(op, key, balance, updated_at, name="Customer#1"):
    return (op, str(key), name, "1 Main St", "3", "13-111-222-3333", balance, "BUILDING", "c", updated_at)


def test_latest_customer_changes_ignore_late_older_updates(spark):
    cdc = _cdc(
        spark,
        [
            ("b1.csv", _customer("I", 1, "10.00", "1998-09-01T00:00:00Z")),
            ("b1.csv", _customer("U", 1, "30.00", "1998-09-03T00:00:00Z")),
            ("b2.csv", _customer("U", 1, "20.00", "1998-09-02T00:00:00Z")),
            ("b1.csv", _customer("I", 2, "5.00", "1998-09-01T00:00:00Z")),
            ("b2.csv", ("D", "2", None, None, None, None, None, None, None, "1998-09-02T00:00:00Z")),
        ],
    )
    changes, rejects = silver.parse_customer_changes(cdc)
    assert rejects.count() == 0

    latest = {row.c_custkey: row for row in silver.latest_customer_changes(changes).collect()}
    assert {key: (row.op, row.c_acctbal) for key, row in latest.items()} == {
        1: ("U", Decimal("30.00")),
        2: ("D", None),
    }
    state = silver.latest_customer_state(changes).collect()
    assert [(row.c_custkey, row.c_acctbal) for row in state] == [(1, Decimal("30.00"))]

    history = silver.customer_history_rows(changes).orderBy("c_custkey", "valid_from").collect()
    assert [
        (row.c_custkey, row.c_acctbal, row.valid_from, row.valid_to, row.is_current, row.is_deleted) for row in history
    ] == [
        (1, Decimal("10.00"), dt.datetime(1998, 9, 1), dt.datetime(1998, 9, 2), False, False),
        (1, Decimal("20.00"), dt.datetime(1998, 9, 2), dt.datetime(1998, 9, 3), False, False),
        (1, Decimal("30.00"), dt.datetime(1998, 9, 3), None, True, False),
        (2, Decimal("5.00"), dt.datetime(1998, 9, 1), dt.datetime(1998, 9, 2), False, False),
        (2, None, dt.datetime(1998, 9, 2), None, True, True),
    ]


def test_mask_customer_pii_keeps_the_country_code_and_hashes_the_address(spark):
    import hashlib

    customers = spark.createDataFrame(
        [(1, "1 Main St", "25-989-741-2988")], "c_custkey long, c_address string, c_phone string"
    )
    row = silver.mask_customer_pii(customers).collect()[0]
    assert row.c_phone == "25-***-***-****"
    assert row.c_address == hashlib.sha256(b"1 Main St").hexdigest()
    assert silver.mask_customer_pii(customers).columns == customers.columns


def _land_bytes(path: Path, lines: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + b"\n")


def _with_bytes(line: str, marker: str, raw: bytes) -> bytes:
    """``line`` as UTF-8 with ``marker`` replaced by ``raw`` (bytes that need not be UTF-8)."""
    assert marker in line
    return line.encode("utf-8").replace(marker.encode("utf-8"), raw)


def test_order_lines_with_undecodable_bytes_are_rejected_before_parsing(spark, tmp_path):
    landing = tmp_path / "landing"

    def utf8_event(event_id, order) -> bytes:
        # Non-ASCII characters as UTF-8 text, not JSON escapes.
        line = json.dumps(
            {"event_id": event_id, "event_time": "1996-01-03T00:00:00Z", "op": "upsert", "order": order},
            ensure_ascii=False,
        )
        return line.encode("utf-8")

    lines = [
        utf8_event("e1", _order(1, o_comment="café ☕")),
        # Valid JSON but for one Latin-1 byte, in a field silver would otherwise ignore.
        _with_bytes(_event("e2", "1996-01-03T00:00:00Z", "upsert", _order(2, o_gift_note="@")), "@", b"caf\xe9"),
        # Neither UTF-8 nor JSON: the encoding is the first check.
        b'{"event_id": "e3", "order": \xe2\x82 \xed\xa0\x80',
        # A literal U+FFFD is valid UTF-8, but it is what undecodable bytes turn into: the same verdict.
        utf8_event("e4", _order(4, o_comment="\ufffd")),
        # The JSON escape \ufffd is ASCII text: the line is valid, its comment is U+FFFD.
        _event("e5", "1996-01-03T00:00:00Z", "upsert", _order(5, o_comment="\ufffd")).encode("ascii"),
    ]
    _land_bytes(landing / "orders" / "batch-00001.json", lines)

    orders_raw = bronze.landed_lines(spark.read.text(str(landing / "orders")))
    events, rejects = silver.parse_order_events(orders_raw)

    good = {row.o_orderkey: row for row in events.collect()}
    assert sorted(good) == [1, 5]
    assert (good[1].o_comment, good[5].o_comment) == ("café ☕", "\ufffd")
    assert _file_and_reason(rejects) == [("orders/batch-00001.json", "not valid UTF-8")] * 3
    # The independent reference, decoding the file itself, gives each line the same verdict.
    assert _file_and_reason(rejects) == contract_reference.expected_reject_reasons(landing)
    for row in rejects.collect():
        with pytest.raises(ValueError, match="^not valid UTF-8$"):
            contract_reference.parse_order_line(row.value)
    expected_orders, expected_lineitem = contract_reference.expected_orders(landing)
    assertDataFrameEqual(silver.latest_order_state(events)[0], spark.createDataFrame(expected_orders))
    assertDataFrameEqual(silver.latest_order_state(events)[1], spark.createDataFrame(expected_lineitem))
    # A rejected line carries no fields: the Latin-1 line's unknown field is not schema drift.
    assert silver.drifted_order_fields(orders_raw).collect() == []

    # Bronze rows written before bronze made lines valid (raw bytes) get the same verdict,
    # and their quarantined text is valid UTF-8.
    raw_bytes = bronze.with_ingestion_columns(spark.read.text(str(landing / "orders")))
    legacy_events, legacy_rejects = silver.parse_order_events(raw_bytes.select(*bronze.LINES_SCHEMA.fieldNames()))
    assert sorted(row.event_id for row in legacy_events.collect()) == ["e1", "e5"]
    assert _file_and_reason(legacy_rejects) == _file_and_reason(rejects)
    assert legacy_rejects.where(~F.is_valid_utf8("value")).count() == 0


def test_customer_rows_with_undecodable_bytes_are_rejected_first(spark, tmp_path):
    landing = tmp_path / "landing"

    def row(key: int, name: bytes, *extra: bytes) -> bytes:
        fields = [
            b"I",
            str(key).encode(),
            name,
            b"1 Main St",
            b"3",
            b"13-111-222-3333",
            b"10.00",
            b"BUILDING",
            b"c",
            b"1998-09-01T00:00:00Z",
            *extra,
        ]
        return b",".join(fields)

    lines = [
        ",".join(CUSTOMER_CSV_COLUMNS).encode(),
        row(1, "José".encode()),
        row(2, b"Jos\xe9"),  # Latin-1, otherwise a valid change
        b"U,3,\xff",  # too few fields too: the encoding is checked first
        row(4, b"Customer#4", b"extra \xe9"),  # a valid change but for a field past the contract's
        row(5, "\ufffd".encode("utf-8")),  # a literal U+FFFD: the same verdict
        row(6, b"Customer#6"),
    ]
    _land_bytes(landing / "customers" / "batch-00001.csv", lines)
    reader = spark.read.schema(tpch.CUSTOMERS_CSV_READ_SCHEMA).options(**tpch.CUSTOMERS_CSV_OPTIONS)

    changes, rejects = silver.parse_customer_changes(tpch.customers_cdc(reader.csv(str(landing / "customers"))))

    assert sorted(row.c_custkey for row in changes.collect()) == [1, 6]
    assert _file_and_reason(rejects) == [("customers/batch-00001.csv", "not valid UTF-8")] * 4
    # Customers mask c_phone and c_address: a line that was not UTF-8 is quarantined as its digest, no text of it.
    assert [len(row.value) for row in rejects.collect() if row.value.startswith("sha256:")] == [71] * 4
    assert _file_and_reason(rejects) == contract_reference.expected_reject_reasons(landing)
    assertDataFrameEqual(
        silver.latest_customer_state(changes), spark.createDataFrame(contract_reference.expected_customers(landing))
    )
    for line in lines[2:6]:
        fields = next(csv.reader([line.decode("utf-8", errors="replace")]))
        with pytest.raises(ValueError, match="^not valid UTF-8$"):
            contract_reference.parse_customer_row(fields)
