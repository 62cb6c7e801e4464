"""Order event lines for tests that land a few hand-made events."""

from __future__ import annotations

import json
from typing import Any


def order_event_line(
    key: int,
    event_id: str,
    *,
    event_time: str = "1996-01-02T10:22:31Z",
    total: str = "10.00",
    order_fields: dict[str, Any] | None = None,
    item_fields: dict[str, Any] | None = None,
    envelope_fields: dict[str, Any] | None = None,
) -> str:
    """One valid upsert line with one line item; the ``*_fields`` add or replace fields at each level."""
    item = {
        "l_linenumber": 1,
        "l_partkey": 1,
        "l_suppkey": 1,
        "l_quantity": "1",
        "l_extendedprice": "10.00",
        "l_discount": "0.05",
        "l_tax": "0.01",
        "l_returnflag": "N",
        "l_linestatus": "O",
        "l_shipdate": "1996-03-13",
        "l_commitdate": "1996-02-12",
        "l_receiptdate": "1996-03-22",
        "l_shipinstruct": "NONE",
        "l_shipmode": "TRUCK",
        "l_comment": "x",
        **(item_fields or {}),
    }
    order = {
        "o_orderkey": key,
        "o_custkey": 1,
        "o_orderstatus": "F",
        "o_totalprice": total,
        "o_orderdate": "1996-01-02",
        "o_orderpriority": "5-LOW",
        "o_clerk": "Clerk#000000951",
        "o_shippriority": 0,
        "o_comment": "c",
        "lineitems": [item],
        **(order_fields or {}),
    }
    return json.dumps(
        {"event_id": event_id, "event_time": event_time, "op": "upsert", **(envelope_fields or {}), "order": order}
    )
