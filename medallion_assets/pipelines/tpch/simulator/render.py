"""Rendering planned lines as text, vectorized: NDJSON order events, CSV customer changes, older snapshots."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from medallion_assets.pipelines.tpch.contract import (
    CUSTOMER_CSV_COLUMNS,
    TPCH_SCHEMAS,
)
from medallion_assets.pipelines.tpch.simulator.noise import (
    DROPPED_CUSTOMER_SEGMENT,
    DROPPED_ORDER_STATUS,
    CustomerLine,
    Lines,
    OrderLine,
)

#: Header of the customer change files, in contract order.
CUSTOMER_CSV_HEADER: tuple[str, ...] = CUSTOMER_CSV_COLUMNS

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_UUID_DIGIT_COLUMNS = np.array([column for column in range(36) if column not in (8, 13, 18, 23)])
_JSON_ESCAPES = {"\\": "\\\\", '"': '\\"', **{chr(code): f"\\u{code:04x}" for code in range(32)}}


def _uuid4_texts(random_bytes: np.ndarray) -> pa.Array:
    """Version 4 UUIDs in their canonical text form, from 16 random bytes each."""
    raw = random_bytes.copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    digits = np.empty((len(raw), 32), dtype=np.uint8)
    digits[:, 0::2] = _HEX_DIGITS[raw >> 4]
    digits[:, 1::2] = _HEX_DIGITS[raw & 0x0F]
    text = np.full((len(raw), 36), ord("-"), dtype=np.uint8)
    text[:, _UUID_DIGIT_COLUMNS] = digits
    offsets = np.arange(len(raw) + 1, dtype=np.int32) * 36
    return pa.StringArray.from_buffers(len(raw), pa.py_buffer(offsets), pa.py_buffer(text))


def _timestamp_texts(seconds: np.ndarray) -> pa.Array:
    """Seconds since the epoch as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return pc.strftime(pa.array(seconds, pa.timestamp("s")), format="%Y-%m-%dT%H:%M:%SZ")


def _key_texts(keys: np.ndarray) -> pa.Array:
    return pa.array(keys).cast(pa.string())


def _json_escaped(values: pa.Array) -> pa.Array:
    """String values as they go between the quotes of a JSON string."""
    if not pc.any(pc.match_substring_regex(values, r'[\x00-\x1f"\\]')).as_py():
        return values  # TPC-H text never needs escaping: skip the passes
    for character, escape in _JSON_ESCAPES.items():
        values = pc.replace_substring(values, character, escape)
    return values


def _csv_field(values: pa.Array) -> pa.Array:
    """Values as RFC 4180 fields, quoted only when they must be (like Python's csv)."""
    needs_quotes = pc.match_substring_regex(values, r'[",\r\n]')
    if not pc.any(needs_quotes).as_py():
        return values
    quoted = pc.binary_join_element_wise('"', pc.replace_substring(values, '"', '""'), '"', "")
    return pc.if_else(needs_quotes, quoted, values)


def _value_texts(table: pa.Table) -> dict[str, pa.Array]:
    """Each column's values as JSON text: strings escaped (quotes not included), others cast."""
    texts = {}
    for column in table.schema:
        values = table[column.name].combine_chunks()
        texts[column.name] = _json_escaped(values) if pa.types.is_string(column.type) else values.cast(pa.string())
    return texts


def _rows(values: pa.Array | pa.ChunkedArray, mask: np.ndarray) -> pa.Array:
    """The values under ``mask``, as one array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    # take is several times faster than a boolean filter on long string arrays.
    return values.take(np.flatnonzero(mask))


def _merged(count: int, parts: Sequence[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """Gather ``count`` rows from parts, in one copy.

    Args:
        count: Rows of the result.
        parts: ``(rows, values)``: ``values[i]`` goes to row ``rows[i]``, or a
            single value goes to every row of ``rows``; a later part wins.
    """
    index = np.zeros(count, dtype=np.int64)
    arrays = []
    start = 0
    for rows, values in parts:
        if len(rows) == 0:
            continue
        index[rows] = start + (np.arange(len(rows)) if len(values) == len(rows) else 0)
        arrays.append(values)
        start += len(values)
    if not arrays:
        return pa.array([], pa.string())
    return pa.concat_arrays(arrays).take(index)


def _patched(values: pa.Array, *patches: tuple[np.ndarray, pa.Array | str | None]) -> pa.Array:
    """``values`` with the rows under each mask replaced, in one copy.

    Args:
        values: The text array.
        patches: ``(mask, replacement)``: one value per masked row, or one
            text (None for null) for all of them; a later patch wins.
    """
    parts = [(np.arange(len(values)), values)]
    for mask, replacement in patches:
        if isinstance(replacement, str) or replacement is None:
            replacement = pa.array([replacement], pa.string())
        parts.append((np.flatnonzero(mask), replacement))
    if all(len(rows) == 0 for rows, _ in parts[1:]):
        return values
    return _merged(len(values), parts)


def _plus_cents(amounts: pa.Array, cents: np.ndarray | int) -> pa.Array:
    """decimal(15,2) amounts plus some cents, as decimal(15,2)."""
    cents = np.broadcast_to(np.asarray(cents, dtype=np.int32), (len(amounts),))
    # int32 -> decimal(10,0) is exact; times 0.01 gives the cents as decimal(13,2).
    delta = pc.multiply(pa.array(cents).cast(pa.decimal128(10, 0)), pa.scalar(Decimal("0.01")))
    return pc.add(amounts, delta).cast(amounts.type)


@dataclass(frozen=True)
class _Member:
    """A member of a JSON object rendered from text arrays.

    Attributes:
        name: Its name, and the key of its value text.
        open: Text before the value text (a quote, a bracket, or nothing).
        close: Text after it.
        members: For an object value, its members (rendered in its place).
    """

    name: str
    open: str = ""
    close: str = ""
    members: tuple[_Member, ...] = ()


def _members(schema: pa.Schema, skip: Sequence[str] = ()) -> tuple[_Member, ...]:
    # Integers are JSON numbers; amounts, dates and text are JSON strings.
    return tuple(
        _Member(column.name) if pa.types.is_integer(column.type) else _Member(column.name, '"', '"')
        for column in schema
        if column.name not in skip
    )


def _object_pieces(members: Sequence[_Member], texts: Mapping[str, pa.Array | str]) -> list[pa.Array | str]:
    """Constant texts and value texts that, concatenated, make the object."""
    pieces: list[pa.Array | str] = ["{"]
    for index, member in enumerate(members):
        pieces.append(f'{"," if index else ""}"{member.name}":{member.open}')
        pieces += _object_pieces(member.members, texts) if member.members else [texts[member.name]]
        pieces.append(member.close)
    pieces.append("}")
    return pieces


def _render(
    members: Sequence[_Member],
    texts: Mapping[str, pa.Array | str],
    prefix: pa.Array | str = "",
    suffix: str = "",
) -> pa.Array:
    """One JSON object per row, written in a single concatenation pass.

    Args:
        members: The object's members, in order.
        texts: Value text of each member, as an array or one text for all rows.
        prefix: Text before each object.
        suffix: Text after each object.
    """
    pieces: list[pa.Array | str] = []
    for piece in [prefix, *_object_pieces(members, texts), suffix]:
        # Each piece costs a pass over the rows: merge neighbouring constants.
        if isinstance(piece, str) and pieces and isinstance(pieces[-1], str):
            pieces[-1] += piece
        elif not (isinstance(piece, str) and piece == ""):
            pieces.append(piece)
    return pc.binary_join_element_wise(*pieces, "")


def _concatenated_runs(strings: pa.Array, runs: np.ndarray) -> pa.Array:
    """Row ``i``: ``strings[runs[i]:runs[i + 1]]`` back to back, as a view of the same bytes."""
    if len(strings) == 0:
        return pa.array([""] * (len(runs) - 1), pa.string())
    _, offsets, data = strings.buffers()
    value_offsets = np.frombuffer(offsets, dtype=np.int32, count=len(strings) + 1, offset=strings.offset * 4)
    return pa.StringArray.from_buffers(len(runs) - 1, pa.py_buffer(value_offsets[runs].astype(np.int32)), data)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``range(start, start + count)`` and where each range begins in it."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1]), offsets


_ENVELOPE = (_Member("event_id", '"', '"'), _Member("event_time", '"', '"'), _Member("op", '"', '"'))
_LINEITEM = _members(TPCH_SCHEMAS["lineitem"], skip=("l_orderkey",))
_UPSERT_EVENT = _ENVELOPE + (
    _Member("order", members=_members(TPCH_SCHEMAS["orders"]) + (_Member("lineitems", "[", "]"),)),
)
_DELETE_EVENT = _ENVELOPE + (_Member("order", members=(_Member("o_orderkey"),)),)


def _lineitem_arrays(lines: Lines, lineitem: pa.Table, item_starts: np.ndarray, item_counts: np.ndarray) -> pa.Array:
    """The text inside each upsert line's ``lineitems`` array."""
    kind = lines.kind
    older = kind == OrderLine.OLDER
    counts = item_counts[lines.source]
    # An older version lacks the last line item, when there is more than one.
    kept = counts - (older & (counts > 1))
    item_rows, runs = _ranges(item_starts[lines.source], kept)
    items = lineitem.take(item_rows)
    texts = _value_texts(items)
    first = np.zeros(len(item_rows), dtype=bool)
    first[runs[:-1][kept > 0]] = True
    older_first = first & np.repeat(older, kept)
    quantity = _plus_cents(_rows(items["l_quantity"], older_first), 100)
    texts["l_quantity"] = _patched(texts["l_quantity"], (older_first, quantity.cast(pa.string())))
    bad_price = first & np.repeat(kind == OrderLine.BAD_EXTENDEDPRICE, kept)
    texts["l_extendedprice"] = _patched(texts["l_extendedprice"], (bad_price, "N/A"))
    # Every line item of a dropped order fails lineitem_quantity_positive, so none outlives its order.
    texts["l_quantity"] = _patched(texts["l_quantity"], (np.repeat(kind == OrderLine.DROPPED, kept), "0.00"))
    # Every item but an order's first brings its separating comma, so an
    # order's items are one contiguous run of bytes: no join per order needed.
    separators = pc.if_else(pa.array(first), "", ",")
    return _concatenated_runs(_render(_LINEITEM, texts, prefix=separators), runs)


def _upsert_lines(
    lines: Lines, orders: pa.Table, lineitem: pa.Table, item_starts: np.ndarray, item_counts: np.ndarray
) -> pa.Array:
    """The NDJSON text of upsert lines (good or bad, not cut short yet)."""
    kind = lines.kind
    older = kind == OrderLine.OLDER
    chosen = orders.take(lines.source)
    texts: dict[str, pa.Array | str] = dict(_value_texts(chosen))
    key_text = _key_texts(lines.key)
    key_as_text, key_as_fraction = kind == OrderLine.KEY_TEXT, kind == OrderLine.KEY_FRACTION
    texts["o_orderkey"] = _patched(
        key_text,
        # A JSON number: a text value brings its own quotes.
        (key_as_text, pc.binary_join_element_wise('"', _rows(key_text, key_as_text), 'x"', "")),
        (key_as_fraction, pc.binary_join_element_wise(_rows(key_text, key_as_fraction), ".5", "")),
    )
    status = _rows(chosen["o_orderstatus"], older)
    price = _plus_cents(_rows(chosen["o_totalprice"], older), lines.cents[older])
    texts["o_orderstatus"] = _patched(
        texts["o_orderstatus"],
        (older, pc.if_else(pc.not_equal(status, "P"), "P", "O")),
        (kind == OrderLine.DROPPED, DROPPED_ORDER_STATUS),
    )
    texts["o_totalprice"] = _patched(
        texts["o_totalprice"], (older, price.cast(pa.string())), (kind == OrderLine.BAD_TOTALPRICE, "12,50")
    )
    texts["o_comment"] = _patched(
        texts["o_comment"],
        (kind == OrderLine.PHANTOM, "phantom order, deleted later"),
        (kind == OrderLine.DROPPED, "unknown status, silver drops it"),
    )
    texts["o_shippriority"] = _patched(texts["o_shippriority"], (kind == OrderLine.BAD_SHIPPRIORITY, '"high"'))
    texts["o_orderdate"] = _patched(texts["o_orderdate"], (kind == OrderLine.BAD_ORDERDATE, "1996-13-45"))
    texts["lineitems"] = _lineitem_arrays(lines, lineitem, item_starts, item_counts)
    texts.update(event_id=_uuid4_texts(lines.uid), event_time=_timestamp_texts(lines.time), op="upsert")
    return _render(_UPSERT_EVENT, texts, suffix="\n")


def order_lines(
    lines: Lines, orders: pa.Table, lineitem: pa.Table, item_starts: np.ndarray, item_counts: np.ndarray
) -> pa.Array:
    """The NDJSON text of ``lines`` (each with its newline), in their order."""
    delete = lines.kind == OrderLine.DELETE
    delete_rows, upsert_rows = np.flatnonzero(delete), np.flatnonzero(~delete)
    deleted = lines.take(delete_rows)
    deletes = _render(
        _DELETE_EVENT,
        {
            "event_id": _uuid4_texts(deleted.uid),
            "event_time": _timestamp_texts(deleted.time),
            "op": "delete",
            "o_orderkey": _key_texts(deleted.key),
        },
        suffix="\n",
    )
    upserted = lines.take(upsert_rows)
    upserts = _upsert_lines(upserted, orders, lineitem, item_starts, item_counts)
    no_key = upserted.kind == OrderLine.NO_KEY
    # o_orderkey is the order's first member: drop it up to its comma.
    keyless = pc.replace_substring_regex(_rows(upserts, no_key), r'"order":\{"o_orderkey":[^,]*,', '"order":{')
    cut = upserted.kind == OrderLine.CUT_SHORT
    # Cut inside the order, so that the line is no JSON at all.
    short = pc.replace_substring_regex(_rows(upserts, cut), r',"lineitems":\[.*', ',"lineitems":[')
    return _merged(
        len(lines),
        [(delete_rows, deletes), (upsert_rows, upserts), (upsert_rows[no_key], keyless), (upsert_rows[cut], short)],
    )


def customer_lines(lines: Lines, customers: pa.Table) -> pa.Array:
    """The CSV records of ``lines`` (each with its newline), in their order."""
    kind = lines.kind
    chosen = customers.take(lines.source)
    texts = {name: chosen[name].combine_chunks().cast(pa.string()) for name in chosen.column_names}
    older = (kind == CustomerLine.OLDER_INSERT) | (kind == CustomerLine.OLDER_UPDATE)
    balance = _plus_cents(_rows(chosen["c_acctbal"], older), lines.cents[older])
    phone = pc.utf8_slice_codeunits(_rows(texts["c_phone"], older), 0, 3)
    segment = _rows(texts["c_mktsegment"], older)
    delete = kind == CustomerLine.DELETE
    key_text = _key_texts(lines.key)
    key_as_text = kind == CustomerLine.KEY_TEXT
    patches = {
        "c_acctbal": [(older, balance.cast(pa.string())), (kind == CustomerLine.BAD_ACCTBAL, "12.3.4")],
        "c_address": [(older, pc.utf8_reverse(_rows(texts["c_address"], older)))],
        "c_phone": [(older, pc.binary_join_element_wise(phone, "000-000-0000", ""))],
        "c_mktsegment": [
            (older, pc.if_else(pc.not_equal(segment, "HOUSEHOLD"), "HOUSEHOLD", "MACHINERY")),
            (kind == CustomerLine.DROPPED_INSERT, DROPPED_CUSTOMER_SEGMENT),
        ],
        "c_comment": [
            (kind == CustomerLine.PHANTOM_INSERT, "phantom customer, deleted later"),
            (kind == CustomerLine.DROPPED_INSERT, "unknown segment, silver drops it"),
        ],
    }
    for name in CUSTOMER_CSV_HEADER[2:-1]:
        # A delete carries its key only: the other fields stay empty.
        texts[name] = _patched(texts[name], *patches.get(name, []), (delete, None))
    texts["c_custkey"] = _patched(
        key_text, (key_as_text, pc.binary_join_element_wise(_rows(key_text, key_as_text), "x", ""))
    )
    inserts = np.isin(
        kind,
        [CustomerLine.INSERT, CustomerLine.OLDER_INSERT, CustomerLine.PHANTOM_INSERT, CustomerLine.DROPPED_INSERT],
    )
    texts["op"] = pa.array(np.select([inserts, delete, kind == CustomerLine.BAD_OP], ["I", "D", "X"], "U"))
    texts["updated_at"] = _patched(_timestamp_texts(lines.time), (kind == CustomerLine.BAD_UPDATED_AT, "yesterday"))
    fields = [_csv_field(texts[name]) for name in CUSTOMER_CSV_HEADER]
    records = pc.binary_join_element_wise(*fields, ",", null_handling="replace", null_replacement="")
    cut = kind == CustomerLine.CUT_SHORT
    short = pc.binary_join_element_wise(_rows(texts["op"], cut), _rows(key_text, cut), "a line cut short", ",")
    return pc.binary_join_element_wise(_patched(records, (cut, short)), "\n", "")


def older_snapshot(name: str, snapshot: pa.Table) -> pa.Table:
    """An older version of a reference snapshot, for the tables that have one."""
    if name == "part":
        price = snapshot["p_retailprice"].combine_chunks()
        older = _plus_cents(price, 100)
        return snapshot.set_column(snapshot.schema.get_field_index("p_retailprice"), "p_retailprice", older)
    if name == "supplier":
        comment = pc.binary_join_element_wise("old: ", snapshot["s_comment"].combine_chunks(), "")
        return snapshot.set_column(snapshot.schema.get_field_index("s_comment"), "s_comment", comment)
    return snapshot


OLDER_SNAPSHOTS = ("part", "supplier")
