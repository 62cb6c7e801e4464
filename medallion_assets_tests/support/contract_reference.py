"""An independent reading of the landing contract (docs/landing-contract.md) in plain Python.

Tests compare what the pipeline builds with what this module derives from the
same landing folder. It shares no code with the package on purpose (only the
standard library and pyarrow), so a mistake has to be made twice to pass.

How lines are judged (the package's silver transforms follow the same rules):

- Files are read as UTF-8 with each undecodable byte sequence replaced by
  U+FFFD (Python's ``errors="replace"``), so a bad line never hides the lines
  around it. The first check of a line (a customer record: of every field,
  those past the contract's too) is that it holds no U+FFFD, else it is
  ``not valid UTF-8``. A literal U+FFFD in a valid file gets the same verdict:
  in UTF-8 text it only ever stands for bytes an earlier step could not
  decode. The JSON escape ``\\ufffd`` is text without U+FFFD, so it is not
  caught here.
- A JSON value is read by its text: a string is its content, a number or
  boolean its JSON literal, ``null`` or an absent key is *missing*. So
  ``"o_orderkey": "12"`` is the integer 12 and ``"o_orderkey": 12.5`` is not
  an integer. An empty CSV field is missing.
- Integers match ``-?[0-9]+`` and fit the column (64 bit, 32 bit for
  ``o_shippriority`` and ``l_linenumber``); decimals match
  ``-?[0-9]{1,13}(.[0-9]{1,2})?`` (exactly what decimal(15,2) holds, no
  rounding); dates are ``YYYY-MM-DD``; timestamps
  ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``.
- A line is rejected with the reason of its first failing check, checked in
  this order: UTF-8, JSON, ``event_id``, ``event_time``, ``op``, ``order``,
  ``o_orderkey``; for upserts then every order column in TPC-H order, then
  ``lineitems`` and each line item's columns (``lineitem <n>: ...``, n from 1).
  Customer rows: UTF-8, too few fields, ``op``, ``c_custkey``, ``updated_at``, then
  for I/U every other column in header order. Fields past the contract's
  columns are schema drift and ignored; a line with them whose other fields
  fail a check is ``malformed CSV line``.
  A customer file whose header is not the contract's columns in order (names
  past them aside) has every record rejected with ``header does not match the
  declaration: expected (...), found (...)``.
- Order state: the valid event with the greatest ``(event_time, event_id)``;
  a delete removes the order. Customer state: the valid row with the greatest
  ``updated_at`` (ties: the later file name, then the later line); ``D``
  removes the customer.
- Silver then keeps only rows that meet the drop expectations of TPC-H's
  feeds (restated below: :data:`ORDER_STATUSES`, :data:`MARKET_SEGMENTS`, a
  line item's quantity above 0 and discount from 0 to 1; null fails): an order,
  line item or customer that fails one is quarantined
  (:func:`expected_drops`) and absent from :func:`expected_silver_state`.
  Silver judges each run's latest change of a key, and a dropped change
  leaves the key's earlier row; this reference judges the final change only,
  which is the same for the simulator's dropped rows (keys with one change).
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

_DEC = pa.decimal128(15, 2)

ORDER_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("o_orderkey", pa.int64()),
    ("o_custkey", pa.int64()),
    ("o_orderstatus", pa.string()),
    ("o_totalprice", _DEC),
    ("o_orderdate", pa.date32()),
    ("o_orderpriority", pa.string()),
    ("o_clerk", pa.string()),
    ("o_shippriority", pa.int32()),
    ("o_comment", pa.string()),
]
LINEITEM_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("l_orderkey", pa.int64()),
    ("l_partkey", pa.int64()),
    ("l_suppkey", pa.int64()),
    ("l_linenumber", pa.int32()),
    ("l_quantity", _DEC),
    ("l_extendedprice", _DEC),
    ("l_discount", _DEC),
    ("l_tax", _DEC),
    ("l_returnflag", pa.string()),
    ("l_linestatus", pa.string()),
    ("l_shipdate", pa.date32()),
    ("l_commitdate", pa.date32()),
    ("l_receiptdate", pa.date32()),
    ("l_shipinstruct", pa.string()),
    ("l_shipmode", pa.string()),
    ("l_comment", pa.string()),
]
CUSTOMER_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("c_custkey", pa.int64()),
    ("c_name", pa.string()),
    ("c_address", pa.string()),
    ("c_nationkey", pa.int64()),
    ("c_phone", pa.string()),
    ("c_acctbal", _DEC),
    ("c_mktsegment", pa.string()),
    ("c_comment", pa.string()),
]
REFERENCE_COLUMNS: dict[str, list[tuple[str, pa.DataType]]] = {
    "region": [("r_regionkey", pa.int64()), ("r_name", pa.string()), ("r_comment", pa.string())],
    "nation": [
        ("n_nationkey", pa.int64()),
        ("n_name", pa.string()),
        ("n_regionkey", pa.int64()),
        ("n_comment", pa.string()),
    ],
    "supplier": [
        ("s_suppkey", pa.int64()),
        ("s_name", pa.string()),
        ("s_address", pa.string()),
        ("s_nationkey", pa.int64()),
        ("s_phone", pa.string()),
        ("s_acctbal", _DEC),
        ("s_comment", pa.string()),
    ],
    "part": [
        ("p_partkey", pa.int64()),
        ("p_name", pa.string()),
        ("p_mfgr", pa.string()),
        ("p_brand", pa.string()),
        ("p_type", pa.string()),
        ("p_size", pa.int32()),
        ("p_container", pa.string()),
        ("p_retailprice", _DEC),
        ("p_comment", pa.string()),
    ],
    "partsupp": [
        ("ps_partkey", pa.int64()),
        ("ps_suppkey", pa.int64()),
        ("ps_availqty", pa.int32()),
        ("ps_supplycost", _DEC),
        ("ps_comment", pa.string()),
    ],
}
CUSTOMER_CSV_HEADER = [
    "op",
    "c_custkey",
    "c_name",
    "c_address",
    "c_nationkey",
    "c_phone",
    "c_acctbal",
    "c_mktsegment",
    "c_comment",
    "updated_at",
]

_INTEGER = re.compile(r"-?[0-9]+")
_DECIMAL = re.compile(r"-?[0-9]{1,13}(\.[0-9]{1,2})?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z")
_INT_BITS = {pa.int64(): 64, pa.int32(): 32}
#: What decoding with ``errors="replace"`` puts where bytes were not UTF-8.
_REPLACEMENT = "\N{REPLACEMENT CHARACTER}"


class _Reject(Exception):
    """A line breaks the contract; the message is the reason."""


#: What TPC-H's drop expectations let through: ``orders_status_known`` and ``customers_segment_known``.
ORDER_STATUSES = frozenset({"O", "F", "P"})
MARKET_SEGMENTS = frozenset({"AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"})


def _order_dropped_by(order: dict[str, Any]) -> list[str]:
    return [] if order["o_orderstatus"] in ORDER_STATUSES else ["orders_status_known"]


def _lineitem_dropped_by(item: dict[str, Any]) -> list[str]:
    failed = []
    if item["l_discount"] is None or not Decimal(0) <= item["l_discount"] <= Decimal(1):
        failed.append("lineitem_discount_in_range")
    if item["l_quantity"] is None or not item["l_quantity"] > 0:
        failed.append("lineitem_quantity_positive")
    return failed


def _customer_dropped_by(customer: dict[str, Any]) -> list[str]:
    return [] if customer["c_mktsegment"] in MARKET_SEGMENTS else ["customers_segment_known"]


def _visible_files(folder: Path, suffix: str) -> list[Path]:
    """Files a consumer sees: names starting with '.' or '_' are not data."""
    if not folder.is_dir():
        return []
    return sorted(
        path
        for path in folder.iterdir()
        if path.is_file() and path.name.endswith(suffix) and not path.name.startswith((".", "_"))
    )


def _text(value: Any) -> str | None:
    """A JSON value by its text; None when missing."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, Decimal)):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _convert(name: str, text: str | None, kind: pa.DataType, prefix: str = "") -> Any:
    """Convert one value to its column type, or reject the line."""
    if text is None or text == "":
        raise _Reject(f"{prefix}missing {name}")
    if kind in _INT_BITS:
        bits = _INT_BITS[kind]
        if _INTEGER.fullmatch(text) and -(2 ** (bits - 1)) <= int(text) < 2 ** (bits - 1):
            return int(text)
        raise _Reject(f"{prefix}{name} is not an integer: '{text}'")
    if kind == _DEC:
        if _DECIMAL.fullmatch(text):
            return Decimal(text)
        raise _Reject(f"{prefix}{name} is not a decimal: '{text}'")
    if kind == pa.date32():
        try:
            if _DATE.fullmatch(text):
                return date.fromisoformat(text)
        except ValueError:
            pass
        raise _Reject(f"{prefix}{name} is not a date: '{text}'")
    return text


def _timestamp(name: str, text: str | None) -> datetime:
    if text is None or text == "":
        raise _Reject(f"missing {name}")
    try:
        if _TIMESTAMP.fullmatch(text):
            return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)
    except ValueError:
        pass
    raise _Reject(f"{name} is not a timestamp: '{text}'")


def parse_order_line(line: str) -> dict[str, Any]:
    """One NDJSON line, as decoded from the file, as a typed event.

    Returns:
        ``{"event_id", "event_time", "op", "order": {...}, "lineitems": [...]}``
        (order and lineitems typed; for deletes only ``o_orderkey``).

    Raises:
        ValueError: With the rejection reason when the line is bad.
    """
    try:
        return _parse_order_line(line)
    except _Reject as reject:
        raise ValueError(str(reject)) from None


def _parse_order_line(line: str) -> dict[str, Any]:
    if _REPLACEMENT in line:
        raise _Reject("not valid UTF-8")
    try:
        event = json.loads(line, parse_float=Decimal)
    except ValueError:
        raise _Reject("not valid JSON") from None
    if not isinstance(event, dict):
        raise _Reject("not a JSON object")
    event_id = _text(event.get("event_id"))
    if event_id is None:
        raise _Reject("missing event_id")
    event_time = _timestamp("event_time", _text(event.get("event_time")))
    op = _text(event.get("op"))
    if op is None:
        raise _Reject("missing op")
    if op not in ("upsert", "delete"):
        raise _Reject(f"op is not upsert or delete: '{op}'")
    body = event.get("order")
    if body is None:
        raise _Reject("missing order")
    if not isinstance(body, dict):
        raise _Reject("order is not a JSON object")
    orderkey = _convert("o_orderkey", _text(body.get("o_orderkey")), pa.int64())
    parsed = {"event_id": event_id, "event_time": event_time, "op": op}
    if op == "delete":
        return {**parsed, "order": {"o_orderkey": orderkey}, "lineitems": []}
    order = {"o_orderkey": orderkey}
    for name, kind in ORDER_COLUMNS[1:]:
        order[name] = _convert(name, _text(body.get(name)), kind)
    items = body.get("lineitems")
    if items is None:
        raise _Reject("missing lineitems")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise _Reject("lineitems is not an array of objects")
    lineitems = []
    for number, item in enumerate(items, start=1):
        row = {"l_orderkey": orderkey}
        for name, kind in LINEITEM_COLUMNS[1:]:
            row[name] = _convert(name, _text(item.get(name)), kind, prefix=f"lineitem {number}: ")
        lineitems.append(row)
    return {**parsed, "order": order, "lineitems": lineitems}


def parse_customer_row(fields: list[str]) -> dict[str, Any]:
    """One CSV record (header excluded), as decoded from the file, as a typed change.

    Raises:
        ValueError: With the rejection reason when the row is bad.
    """
    try:
        return _parse_customer_row(fields)
    except _Reject as reject:
        raise ValueError(str(reject)) from None


def _parse_customer_row(fields: list[str]) -> dict[str, Any]:
    if any(_REPLACEMENT in field for field in fields):
        raise _Reject("not valid UTF-8")
    if len(fields) < len(CUSTOMER_CSV_HEADER):
        raise _Reject("malformed CSV line")
    if len(fields) > len(CUSTOMER_CSV_HEADER):
        # Fields past the contract's are schema drift, ignored when the rest is valid.
        try:
            return _parse_customer_row(fields[: len(CUSTOMER_CSV_HEADER)])
        except _Reject:
            raise _Reject("malformed CSV line") from None
    raw = dict(zip(CUSTOMER_CSV_HEADER, fields, strict=False))
    op = raw["op"] or None
    if op is None:
        raise _Reject("missing op")
    if op not in ("I", "U", "D"):
        raise _Reject(f"op is not I, U or D: '{op}'")
    custkey = _convert("c_custkey", raw["c_custkey"], pa.int64())
    updated_at = _timestamp("updated_at", raw["updated_at"] or None)
    change = {"op": op, "updated_at": updated_at, "c_custkey": custkey}
    if op != "D":
        for name, kind in CUSTOMER_COLUMNS[1:]:
            change[name] = _convert(name, raw[name], kind)
    return change


def _order_events(landing: Path) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    events, rejects = [], []
    for path in _visible_files(landing / "orders", ".json"):
        relative = path.relative_to(landing).as_posix()
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    events.append(_parse_order_line(line.rstrip("\n")))
                except _Reject as reject:
                    rejects.append((relative, str(reject)))
    return events, rejects


def _customer_changes(landing: Path) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    changes, rejects = [], []
    for path in _visible_files(landing / "customers", ".csv"):
        relative = path.relative_to(landing).as_posix()
        with path.open(encoding="utf-8", errors="replace", newline="") as handle:
            rows = csv.reader(handle)
            header = next(rows, None)
            if header is None:
                continue  # an empty file holds no record
            # Fields are read by position: a file whose header is not the contract's (names past
            # it aside) is rejected whole, every record with one reason.
            wrong_header = header[: len(CUSTOMER_CSV_HEADER)] != CUSTOMER_CSV_HEADER and (
                f"header does not match the declaration: expected ({', '.join(CUSTOMER_CSV_HEADER)}), "
                f"found ({', '.join(header)})"
            )
            for line_number, fields in enumerate(rows, start=2):
                if not fields:
                    continue  # a blank line is no record (Spark's CSV reader skips it too)
                if wrong_header:
                    rejects.append((relative, wrong_header))
                    continue
                try:
                    change = _parse_customer_row(fields)
                except _Reject as reject:
                    rejects.append((relative, str(reject)))
                    continue
                change["_order"] = (change["updated_at"], relative, line_number)
                changes.append(change)
    return changes, rejects


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, pa.DataType]]) -> pa.Table:
    schema = pa.schema(columns)
    return pa.Table.from_pylist([{name: row[name] for name, _ in columns} for row in rows], schema=schema)


def _live_orders(landing: Path) -> list[dict[str, Any]]:
    """The winning upsert event of each order that is not deleted, by key."""
    events, _ = _order_events(landing)
    winners: dict[int, dict[str, Any]] = {}
    for event in events:
        key = event["order"]["o_orderkey"]
        current = winners.get(key)
        if current is None or (event["event_time"], event["event_id"]) > (current["event_time"], current["event_id"]):
            winners[key] = event
    return [winners[key] for key in sorted(winners) if winners[key]["op"] == "upsert"]


def _live_customers(landing: Path) -> list[dict[str, Any]]:
    """The winning change of each customer that is not deleted, by key."""
    changes, _ = _customer_changes(landing)
    winners: dict[int, dict[str, Any]] = {}
    for change in changes:
        current = winners.get(change["c_custkey"])
        if current is None or change["_order"] > current["_order"]:
            winners[change["c_custkey"]] = change
    return [winners[key] for key in sorted(winners) if winners[key]["op"] != "D"]


def expected_orders(landing_dir: Path | str) -> tuple[pa.Table, pa.Table]:
    """The ``orders`` and ``lineitem`` the contract defines, before the drop expectations.

    What the parse and the choice of each order's latest event give;
    :func:`expected_silver_state` holds what silver keeps of it.

    Returns:
        (orders sorted by ``o_orderkey``, lineitem sorted by
        ``(l_orderkey, l_linenumber)``).
    """
    live = _live_orders(Path(landing_dir))
    orders = [event["order"] for event in live]
    lineitems = sorted(
        (item for event in live for item in event["lineitems"]),
        key=lambda item: (item["l_orderkey"], item["l_linenumber"]),
    )
    return _table(orders, ORDER_COLUMNS), _table(lineitems, LINEITEM_COLUMNS)


def expected_customers(landing_dir: Path | str) -> pa.Table:
    """The unmasked ``customers`` the contract defines before the drop expectations, sorted by ``c_custkey``."""
    return _table(_live_customers(Path(landing_dir)), CUSTOMER_COLUMNS)


def expected_drops(landing_dir: Path | str) -> dict[str, int]:
    """Rows each drop expectation of TPC-H's feeds sets aside, by expectation name (only those that fail any).

    An order's line items are judged on their own: a dropped order's items
    that meet theirs stay (the simulator's dropped orders have none that do).
    """
    landing = Path(landing_dir)
    failed: dict[str, int] = {}
    judged = [_order_dropped_by(e["order"]) for e in _live_orders(landing)]
    judged += [_lineitem_dropped_by(item) for e in _live_orders(landing) for item in e["lineitems"]]
    judged += [_customer_dropped_by(c) for c in _live_customers(landing)]
    for names in judged:
        for name in names:
            failed[name] = failed.get(name, 0) + 1
    return failed


def expected_reference(landing_dir: Path | str, table: str) -> pa.Table | None:
    """The newest snapshot of a reference table, typed; None if none landed."""
    files = _visible_files(Path(landing_dir) / "reference" / table, ".parquet")
    if not files:
        return None
    columns = REFERENCE_COLUMNS[table]
    snapshot = pq.read_table(files[-1]).select([name for name, _ in columns])
    snapshot = snapshot.cast(pa.schema(columns))
    return snapshot.sort_by([(columns[0][0], "ascending"), (columns[1][0], "ascending")])


def expected_silver_state(landing_dir: Path | str) -> dict[str, pa.Table]:
    """Every silver table the landing folder defines, after the drop expectations (customers unmasked).

    Returns:
        Keys ``orders``, ``lineitem``, ``customers`` and each reference table
        landed so far; tables sorted by their keys.
    """
    landing = Path(landing_dir)
    live = _live_orders(landing)
    orders = [e["order"] for e in live if not _order_dropped_by(e["order"])]
    lineitem = sorted(
        (item for e in live for item in e["lineitems"] if not _lineitem_dropped_by(item)),
        key=lambda item: (item["l_orderkey"], item["l_linenumber"]),
    )
    customers = [c for c in _live_customers(landing) if not _customer_dropped_by(c)]
    state = {
        "orders": _table(orders, ORDER_COLUMNS),
        "lineitem": _table(lineitem, LINEITEM_COLUMNS),
        "customers": _table(customers, CUSTOMER_COLUMNS),
    }
    for table in REFERENCE_COLUMNS:
        snapshot = expected_reference(landing_dir, table)
        if snapshot is not None:
            state[table] = snapshot
    return state


def expected_reject_reasons(landing_dir: Path | str) -> list[tuple[str, str]]:
    """Every rejected line as ``(file relative to landing, reason)``, file order."""
    landing = Path(landing_dir)
    return _order_events(landing)[1] + _customer_changes(landing)[1]


def expected_rejects(landing_dir: Path | str) -> dict[str, int]:
    """Rejected lines per file, keyed by the path relative to the landing dir."""
    counts: dict[str, int] = {}
    for relative, _ in expected_reject_reasons(landing_dir):
        counts[relative] = counts.get(relative, 0) + 1
    return counts


def mask_phone(phone: str | None) -> str | None:
    """The silver masking of ``c_phone``: country code kept, other digits '*'."""
    if phone is None:
        return None
    return phone[:3] + re.sub(r"[0-9]", "*", phone[3:])


def mask_address(address: str | None) -> str | None:
    """The silver masking of ``c_address``: SHA-256 of its UTF-8 bytes, hex."""
    if address is None:
        return None
    return hashlib.sha256(address.encode("utf-8")).hexdigest()


def masked_customers(customers: pa.Table) -> pa.Table:
    """``customers`` as silver stores it: phone and address masked."""
    phone_index = customers.schema.get_field_index("c_phone")
    address_index = customers.schema.get_field_index("c_address")
    masked = customers.set_column(
        phone_index, "c_phone", pa.array([mask_phone(v) for v in customers["c_phone"].to_pylist()], pa.string())
    )
    return masked.set_column(
        address_index,
        "c_address",
        pa.array([mask_address(v) for v in customers["c_address"].to_pylist()], pa.string()),
    )
