"""Names fixed by the landing contract (docs/landing-contract.md), shared by its producer and consumers.

The simulator writes files with these columns and types, and the bronze and
silver transforms read them; keeping one definition means a change to the
contract is made once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

#: Columns of the customer change CSV files, in header order.
CUSTOMER_CSV_COLUMNS: tuple[str, ...] = (
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
)


@dataclass(frozen=True)
class LandingStream:
    """A stream of change files the producer lands and bronze ingests.

    Attributes:
        bronze_table: the bronze table (and stream) name.
        folder: the sub-folder of ``landing/`` the files are written to.
        suffix: the data files' name suffix; other files there are not data.
    """

    bronze_table: str
    folder: str
    suffix: str


#: The landed change streams, by bronze table.
LANDING_STREAMS: dict[str, LandingStream] = {
    "orders_raw": LandingStream("orders_raw", "orders", ".json"),
    "customers_cdc": LandingStream("customers_cdc", "customers", ".csv"),
}

#: Reference tables landed as full Parquet snapshots under landing/reference/<table>/.
REFERENCE_TABLES: tuple[str, ...] = ("nation", "region", "part", "supplier", "partsupp")

_AMOUNT = pa.decimal128(15, 2)

#: The contract's Arrow schema of each TPC-H table (keys int64, ``p_size`` and
#: ``ps_availqty`` int32, amounts decimal(15,2), dates date32).
TPCH_SCHEMAS: dict[str, pa.Schema] = {
    "region": pa.schema([("r_regionkey", pa.int64()), ("r_name", pa.string()), ("r_comment", pa.string())]),
    "nation": pa.schema(
        [
            ("n_nationkey", pa.int64()),
            ("n_name", pa.string()),
            ("n_regionkey", pa.int64()),
            ("n_comment", pa.string()),
        ]
    ),
    "supplier": pa.schema(
        [
            ("s_suppkey", pa.int64()),
            ("s_name", pa.string()),
            ("s_address", pa.string()),
            ("s_nationkey", pa.int64()),
            ("s_phone", pa.string()),
            ("s_acctbal", _AMOUNT),
            ("s_comment", pa.string()),
        ]
    ),
    "customer": pa.schema(
        [
            ("c_custkey", pa.int64()),
            ("c_name", pa.string()),
            ("c_address", pa.string()),
            ("c_nationkey", pa.int64()),
            ("c_phone", pa.string()),
            ("c_acctbal", _AMOUNT),
            ("c_mktsegment", pa.string()),
            ("c_comment", pa.string()),
        ]
    ),
    "part": pa.schema(
        [
            ("p_partkey", pa.int64()),
            ("p_name", pa.string()),
            ("p_mfgr", pa.string()),
            ("p_brand", pa.string()),
            ("p_type", pa.string()),
            ("p_size", pa.int32()),
            ("p_container", pa.string()),
            ("p_retailprice", _AMOUNT),
            ("p_comment", pa.string()),
        ]
    ),
    "partsupp": pa.schema(
        [
            ("ps_partkey", pa.int64()),
            ("ps_suppkey", pa.int64()),
            ("ps_availqty", pa.int32()),
            ("ps_supplycost", _AMOUNT),
            ("ps_comment", pa.string()),
        ]
    ),
    "orders": pa.schema(
        [
            ("o_orderkey", pa.int64()),
            ("o_custkey", pa.int64()),
            ("o_orderstatus", pa.string()),
            ("o_totalprice", _AMOUNT),
            ("o_orderdate", pa.date32()),
            ("o_orderpriority", pa.string()),
            ("o_clerk", pa.string()),
            ("o_shippriority", pa.int32()),
            ("o_comment", pa.string()),
        ]
    ),
    "lineitem": pa.schema(
        [
            ("l_orderkey", pa.int64()),
            ("l_partkey", pa.int64()),
            ("l_suppkey", pa.int64()),
            ("l_linenumber", pa.int32()),
            ("l_quantity", _AMOUNT),
            ("l_extendedprice", _AMOUNT),
            ("l_discount", _AMOUNT),
            ("l_tax", _AMOUNT),
            ("l_returnflag", pa.string()),
            ("l_linestatus", pa.string()),
            ("l_shipdate", pa.date32()),
            ("l_commitdate", pa.date32()),
            ("l_receiptdate", pa.date32()),
            ("l_shipinstruct", pa.string()),
            ("l_shipmode", pa.string()),
            ("l_comment", pa.string()),
        ]
    ),
}

#: The fields an order event line may carry, per level: the envelope, its
#: ``order`` object, and each of the order's ``lineitems`` (a line item's order
#: key is the event's). Anything else is schema drift.
ORDER_EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "event": ("event_id", "event_time", "op", "order"),
    "order": (*TPCH_SCHEMAS["orders"].names, "lineitems"),
    "lineitem": tuple(name for name in TPCH_SCHEMAS["lineitem"].names if name != "l_orderkey"),
}


def unknown_order_fields(line: str) -> set[str]:
    """The fields of one order event line that :data:`ORDER_EVENT_FIELDS` does not define.

    Plain Python, for code without Spark (the checkpoint sensors); silver's
    ``drifted_order_fields`` applies the same sets to a whole DataFrame.

    Args:
        line: one NDJSON line; a line that is not a JSON object has no fields.

    Returns:
        Dotted names: ``channel``, ``order.o_discount_code``, ``order.lineitems.l_gift``.

    Example:
        >>> sorted(unknown_order_fields('{"event_id": "e1", "channel": "web", "order": {"o_gift": true}}'))
        ['channel', 'order.o_gift']
    """
    try:
        event = json.loads(line)
    except ValueError:
        return set()
    if not isinstance(event, dict):
        return set()
    found = {key for key in event if key not in ORDER_EVENT_FIELDS["event"]}
    order = event.get("order")
    if isinstance(order, dict):
        found |= {f"order.{key}" for key in order if key not in ORDER_EVENT_FIELDS["order"]}
        for item in order.get("lineitems") or []:
            if isinstance(item, dict):
                found |= {f"order.lineitems.{key}" for key in item if key not in ORDER_EVENT_FIELDS["lineitem"]}
    return found
