"""TPC-H's feeds, declared: what docs/landing-contract.md says the producer delivers.

Order events arrive as NDJSON files and, where the deployment has Kafka, as
messages of a topic; both hold nested events (an order with its line items),
so their silver step is TPC-H's own code (:mod:`.silver`). Customer changes
are flat CSV rows and go through the generic silver step. The reference
tables are Parquet snapshots.
"""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import TimestampType

from medallion_assets.expectations import expect, expect_or_drop, expect_or_fail
from medallion_assets.feeds import (
    ApplyChanges,
    Feed,
    Field,
    KafkaTopic,
    LandingFiles,
    LandingSnapshots,
    MaskDigits,
    Replace,
)
from medallion_assets.pipelines.tpch.contract import (
    CUSTOMER_CSV_COLUMNS,
    LANDING_STREAMS,
    REFERENCE_TABLES,
    TPCH_SCHEMAS,
    unknown_order_fields,
)

#: What each TPC-H column holds (TPC-H specification, clause 1.4), shown in the UI's column schema.
TPCH_COLUMN_DESCRIPTIONS: dict[str, str] = {
    "r_regionkey": "Region key (0-4).",
    "r_name": "Region name.",
    "r_comment": "Free text.",
    "n_nationkey": "Nation key (0-24).",
    "n_name": "Nation name.",
    "n_regionkey": "The nation's region (region.r_regionkey).",
    "n_comment": "Free text.",
    "s_suppkey": "Supplier key.",
    "s_name": "Supplier name.",
    "s_address": "Supplier address.",
    "s_nationkey": "The supplier's nation (nation.n_nationkey).",
    "s_phone": "Supplier phone, country code first.",
    "s_acctbal": "Supplier account balance.",
    "s_comment": "Free text.",
    "c_custkey": "Customer key.",
    "c_name": "Customer name.",
    "c_address": "Customer address (PII: SHA-256 in silver).",
    "c_nationkey": "The customer's nation (nation.n_nationkey).",
    "c_phone": "Customer phone (PII: digits after the country code masked in silver).",
    "c_acctbal": "Customer account balance.",
    "c_mktsegment": "Market segment: AUTOMOBILE, BUILDING, FURNITURE, HOUSEHOLD or MACHINERY.",
    "c_comment": "Free text.",
    "p_partkey": "Part key.",
    "p_name": "Part name.",
    "p_mfgr": "Manufacturer.",
    "p_brand": "Brand.",
    "p_type": "Part type.",
    "p_size": "Part size.",
    "p_container": "Container.",
    "p_retailprice": "Retail price.",
    "p_comment": "Free text.",
    "ps_partkey": "The part (part.p_partkey).",
    "ps_suppkey": "The supplier (supplier.s_suppkey).",
    "ps_availqty": "Quantity the supplier has available.",
    "ps_supplycost": "The supplier's cost for the part.",
    "ps_comment": "Free text.",
    "o_orderkey": "Order key.",
    "o_custkey": "The ordering customer (customers.c_custkey).",
    "o_orderstatus": "Order status: O (open), F (fulfilled) or P (partly).",
    "o_totalprice": "Total price of the order.",
    "o_orderdate": "Date the order was placed.",
    "o_orderpriority": "Order priority.",
    "o_clerk": "Clerk who took the order.",
    "o_shippriority": "Shipping priority.",
    "o_comment": "Free text.",
    "l_orderkey": "The order (orders.o_orderkey).",
    "l_partkey": "The part (part.p_partkey).",
    "l_suppkey": "The supplier (supplier.s_suppkey).",
    "l_linenumber": "Line number within the order.",
    "l_quantity": "Quantity.",
    "l_extendedprice": "Quantity times the part's retail price.",
    "l_discount": "Discount, a fraction between 0 and 1.",
    "l_tax": "Tax, a fraction.",
    "l_returnflag": "Return flag: R, A or N.",
    "l_linestatus": "Line status: O (open) or F (fulfilled).",
    "l_shipdate": "Ship date.",
    "l_commitdate": "Committed date.",
    "l_receiptdate": "Receipt date.",
    "l_shipinstruct": "Shipping instructions.",
    "l_shipmode": "Ship mode.",
    "l_comment": "Free text.",
}


def _tpch_fields(table: str, **overrides: dict) -> tuple[Field, ...]:
    """The contract's columns of a TPC-H table as fields, with their descriptions."""
    schema = from_arrow_schema(TPCH_SCHEMAS[table], prefer_timestamp_ntz=False)
    return tuple(
        Field(f.name, f.dataType, description=TPCH_COLUMN_DESCRIPTIONS[f.name], **overrides.get(f.name, {}))
        for f in schema.fields
    )


_ORDER_EVENT_FIELDS = (
    Field("event_id", description="The event's id; a redelivered event carries the same id."),
    Field("event_time", TimestampType(), description="When the change happened, UTC."),
    Field("op", values=("upsert", "delete"), description="upsert or delete."),
    Field("order", description="The order with its lineitems, as a JSON object."),
)

ORDERS_RAW = Feed(
    name="orders_raw",
    description="Order event lines from landing/orders, as delivered (text).",
    source=LandingFiles(
        folder=LANDING_STREAMS["orders_raw"].folder, format="ndjson", suffix=LANDING_STREAMS["orders_raw"].suffix
    ),
    fields=_ORDER_EVENT_FIELDS,
    unknown_fields=unknown_order_fields,
)

ORDERS_KAFKA = Feed(
    name="orders_kafka",
    description="Order event messages from the Kafka topic, as delivered, with topic, partition, offset and "
    "Kafka timestamp. Empty where the deployment has no Kafka source.",
    source=KafkaTopic(topic="orders"),
    fields=_ORDER_EVENT_FIELDS,
    unknown_fields=unknown_order_fields,
)

CUSTOMERS_EXPECTATIONS = (
    expect_or_fail("customers_key_present", "c_custkey IS NOT NULL", "the merge key"),
    expect_or_drop(
        "customers_segment_known", "c_mktsegment IN ('AUTOMOBILE','BUILDING','FURNITURE','HOUSEHOLD','MACHINERY')"
    ),
    expect("customers_nation_in_tpch_range", "c_nationkey BETWEEN 0 AND 24"),
)

CUSTOMERS_CDC = Feed(
    name="customers_cdc",
    description="Customer change rows from landing/customers, every column a string.",
    source=LandingFiles(
        folder=LANDING_STREAMS["customers_cdc"].folder, format="csv", suffix=LANDING_STREAMS["customers_cdc"].suffix
    ),
    fields=(
        Field("op", values=("I", "U", "D"), description="I (insert), U (update) or D (delete)."),
        *_tpch_fields("customer", c_phone={"mask": MaskDigits(keep=3)}, c_address={"mask": "sha256"}),
        Field("updated_at", TimestampType(), description="When the change happened, UTC; the latest wins."),
    ),
    silver=ApplyChanges(
        table="customers",
        keys=("c_custkey",),
        sequence_by=("updated_at",),
        delete_when=("op", "D"),
        except_fields=("op", "updated_at"),
        history=True,
    ),
    expectations=CUSTOMERS_EXPECTATIONS,
)
assert CUSTOMERS_CDC.field_names == CUSTOMER_CSV_COLUMNS, "the contract's CSV header and the declaration differ"


def _snapshot_feed(table: str, *keys: str) -> Feed:
    return Feed(
        name=table,
        description=f"The newest landed snapshot of {table}.",
        source=LandingSnapshots(folder=f"reference/{table}"),
        fields=_tpch_fields(table),
        silver=Replace(table=table, keys=keys),
    )


NATION = _snapshot_feed("nation", "n_nationkey")
REGION = _snapshot_feed("region", "r_regionkey")
PART = _snapshot_feed("part", "p_partkey")
SUPPLIER = _snapshot_feed("supplier", "s_suppkey")
PARTSUPP = _snapshot_feed("partsupp", "ps_partkey", "ps_suppkey")
assert {NATION.name, REGION.name, PART.name, SUPPLIER.name, PARTSUPP.name} == set(REFERENCE_TABLES)

#: The reference snapshot feeds, in the contract's order.
REFERENCE_FEEDS: tuple[Feed, ...] = tuple(
    {f.name: f for f in (NATION, REGION, PART, SUPPLIER, PARTSUPP)}[t] for t in REFERENCE_TABLES
)
