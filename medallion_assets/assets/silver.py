"""Silver: typed, deduplicated latest state, merged in from what bronze gained.

Each step reads only the bronze rows added since it last ran (the IO manager's
``delta/read: changes`` input) and merges them; rejected lines and rows that
fail a drop/fail expectation go to ``quarantine.<table>`` with the reason.
"""

# No ``from __future__ import annotations``: Dagster reads the config class from the annotation.
from typing import Literal

from dagster import AssetIn, AssetKey, AssetOut, Config, MetadataValue, Output, asset, multi_asset
from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from medallion_assets.expectations import (
    apply_expectations,
    check_specs,
    expect,
    expect_or_drop,
    expect_or_fail,
    quarantine_rows,
)
from medallion_assets.io_manager import DELTA_KINDS, READ, delta_table
from medallion_assets.transforms import silver as T
from medallion_assets.transforms.bronze import REFERENCE_TABLES

ORDERS = AssetKey(["silver", "orders"])
LINEITEM = AssetKey(["silver", "lineitem"])
CUSTOMERS = AssetKey(["silver", "customers"])
CUSTOMERS_HISTORY = AssetKey(["silver", "customers_history"])

ORDERS_EXPECTATIONS = [
    expect_or_fail("orders_key_present", "o_orderkey IS NOT NULL", "the merge key"),
    expect_or_drop("orders_status_known", "o_orderstatus IN ('O', 'F', 'P')"),
    # A negative total means the feed's amounts are corrupt: stop before gold revenue is wrong.
    expect_or_fail("orders_total_price_non_negative", "o_totalprice >= 0", "amounts of the feed are sane"),
]
LINEITEM_EXPECTATIONS = [
    expect_or_drop("lineitem_discount_in_range", "l_discount BETWEEN 0 AND 1"),
    expect_or_drop("lineitem_quantity_positive", "l_quantity > 0"),
    expect("lineitem_ships_before_receipt", "l_shipdate <= l_receiptdate"),
]
CUSTOMERS_EXPECTATIONS = [
    expect_or_fail("customers_key_present", "c_custkey IS NOT NULL", "the merge key"),
    expect_or_drop("customers_segment_known", "c_mktsegment IN ('AUTOMOBILE','BUILDING','FURNITURE','HOUSEHOLD','MACHINERY')"),
    expect("customers_nation_in_tpch_range", "c_nationkey BETWEEN 0 AND 24"),
]

_QUARANTINE = delta_table(write_mode="append")


def _sequence(*columns: str) -> F.Column:
    # One sortable text per change, so the merge compares a single column.
    parts = [
        F.date_format(F.col(c), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS") if c in ("event_time", "updated_at") else F.col(c)
        for c in columns
    ]
    return F.concat_ws("|", *parts).alias("_sequence")


class OrdersSilverConfig(Config):
    """How ``silver.orders`` and ``silver.lineitem`` treat the order events they merge."""

    schema_drift: Literal["ignore", "evolve"] = Field(
        default="ignore",
        description=(
            "Fields of order events that the landing contract does not define: 'ignore' drops them "
            "(bronze keeps the raw line); 'evolve' adds each order field as a string column of "
            "silver.orders and each line item field as one of silver.lineitem (envelope fields "
            "and names that are not plain identifiers stay ignored)."
        ),
    )


def _rejects_to_quarantine(rejects: DataFrame, table_name: str) -> DataFrame:
    return quarantine_rows(rejects.withColumnRenamed("reason", "_reason_text"), table_name, F.col("_reason_text"))


@multi_asset(
    outs={
        # schema_mode="merge": the 'evolve' drift policy adds columns; rows that lack one store null.
        "orders": AssetOut(kinds=DELTA_KINDS, key=ORDERS, metadata=delta_table(write_mode="merge", merge_keys=["o_orderkey"], sequence_column="_sequence", delete_column="_deleted", schema_mode="merge"), is_required=False),
        "lineitem": AssetOut(kinds=DELTA_KINDS, key=LINEITEM, metadata=delta_table(write_mode="merge", merge_keys=["l_orderkey", "l_linenumber"], sequence_column="_sequence", delete_column="_deleted", replace_group="l_orderkey", schema_mode="merge"), is_required=False),
        "quarantine_orders": AssetOut(kinds=DELTA_KINDS, key=AssetKey(["quarantine", "orders"]), metadata=_QUARANTINE, is_required=False),
    },
    ins={
        "orders_raw": AssetIn(key=AssetKey(["bronze", "orders_raw"]), metadata={READ: "changes"}),
        "orders_kafka": AssetIn(key=AssetKey(["bronze", "orders_kafka"]), metadata={READ: "changes"}),
    },
    check_specs=[*check_specs(ORDERS, ORDERS_EXPECTATIONS), *check_specs(LINEITEM, LINEITEM_EXPECTATIONS)],
    group_name="silver",
    can_subset=False,
)
def orders_and_lineitem(config: OrdersSilverConfig, orders_raw: DataFrame, orders_kafka: DataFrame):
    """orders and lineitem: latest state per order (deletes applied), merged from new events of either source."""
    lines = T.order_lines(orders_raw, orders_kafka)
    drifted = [(row["level"], row["field"]) for row in T.drifted_order_fields(lines).collect()]
    if config.schema_drift == "evolve":
        kept, ignored = T.keep_order_fields(drifted)
    else:
        kept, ignored = T.KeptOrderFields(), sorted(f"{level}.{field}" for level, field in set(drifted))
    drift_metadata = {"schema_drift_policy": config.schema_drift, "schema_drift_ignored": MetadataValue.json(ignored)}
    events, rejects = T.parse_order_events(lines, kept)
    unique_events = T.deduplicate_events(events)
    # The winner's file goes along so a row that fails an expectation is quarantined with it.
    winner_files = unique_events.groupBy("o_orderkey", "event_time", "event_id").agg(F.max("_source_file").alias("_source_file"))
    changes = (
        T.latest_order_changes(unique_events)
        .join(winner_files, ["o_orderkey", "event_time", "event_id"], "left")
        .withColumn("_sequence", _sequence("event_time", "event_id"))
        .cache()
    )
    upserts = changes.where(F.col("op") == "upsert")
    deletes = changes.where(F.col("op") == "delete")

    order_upserts = T.order_rows(upserts, kept).join(upserts.select("o_orderkey", "_sequence", "_source_file"), "o_orderkey")
    orders = apply_expectations(order_upserts, ORDERS_EXPECTATIONS, asset_key=ORDERS, table_name="orders")
    lineitem_upserts = T.lineitem_rows(upserts, kept).join(
        upserts.select(F.col("o_orderkey").alias("l_orderkey"), "_sequence", "_source_file"), "l_orderkey"
    )
    lineitem = apply_expectations(lineitem_upserts, LINEITEM_EXPECTATIONS, asset_key=LINEITEM, table_name="lineitem")

    quarantined = _rejects_to_quarantine(rejects, "orders").unionByName(orders.quarantined).unionByName(lineitem.quarantined)
    yield from orders.check_results
    yield from lineitem.check_results
    if orders.blocked or lineitem.blocked:
        # A failed expectation: the tables stay as they are; the blocking check stops downstream.
        yield Output(quarantined, output_name="quarantine_orders")
        return
    deleted_orders = deletes.select("o_orderkey", "_sequence")
    order_rows = orders.kept.drop("_source_file").withColumn("_deleted", F.lit(False)).unionByName(
        deleted_orders.withColumn("_deleted", F.lit(True)), allowMissingColumns=True
    )
    line_rows = lineitem.kept.drop("_source_file").withColumn("_deleted", F.lit(False)).unionByName(
        deleted_orders.withColumnRenamed("o_orderkey", "l_orderkey").withColumn("_deleted", F.lit(True)),
        allowMissingColumns=True,
    )
    yield Output(order_rows, output_name="orders",
                 metadata={**drift_metadata, "schema_drift_kept": MetadataValue.json(list(kept.order))})
    yield Output(line_rows, output_name="lineitem",
                 metadata={**drift_metadata, "schema_drift_kept": MetadataValue.json(list(kept.lineitem))})
    # Last: the step's read position is the oldest of its tables', so a run killed
    # before this append reads the increment again, merges it again (a no-op) and
    # quarantines it once. Written first, a killed run's rejects were appended twice.
    yield Output(quarantined, output_name="quarantine_orders")


@multi_asset(
    outs={
        "customers": AssetOut(kinds=DELTA_KINDS, key=CUSTOMERS, metadata=delta_table(write_mode="merge", merge_keys=["c_custkey"], sequence_column="_sequence", delete_column="_deleted"), is_required=False),
        "quarantine_customers": AssetOut(kinds=DELTA_KINDS, key=AssetKey(["quarantine", "customers"]), metadata=_QUARANTINE, is_required=False),
    },
    ins={"customers_cdc": AssetIn(key=AssetKey(["bronze", "customers_cdc"]), metadata={READ: "changes"})},
    check_specs=check_specs(CUSTOMERS, CUSTOMERS_EXPECTATIONS),
    group_name="silver",
    can_subset=False,
)
def customers_and_history(customers_cdc: DataFrame):
    """customers: latest state, deletes applied, c_phone and c_address masked."""
    changes, rejects = T.parse_customer_changes(customers_cdc)
    changes = changes.cache()
    # The merge's sequence carries the winner's file too, so a tie on updated_at
    # goes to the later file across runs as it does within one (the contract's rule).
    winner_files = changes.groupBy("c_custkey", "updated_at").agg(F.max("_source_file").alias("_source_file"))
    latest = (
        T.latest_customer_changes(changes)
        .join(winner_files, ["c_custkey", "updated_at"], "left")
        .withColumn("_sequence", _sequence("updated_at", "_source_file"))
    )
    upserts = latest.where(F.col("op") != "D")
    # Masked before the expectations, so quarantined records carry no PII either.
    customer_upserts = T.mask_customer_pii(T.customer_rows(upserts)).join(
        upserts.select("c_custkey", "_sequence", "_source_file"), "c_custkey"
    )
    customers = apply_expectations(customer_upserts, CUSTOMERS_EXPECTATIONS, asset_key=CUSTOMERS, table_name="customers")
    quarantined = _rejects_to_quarantine(rejects, "customers").unionByName(customers.quarantined)
    yield from customers.check_results
    if customers.blocked:
        yield Output(quarantined, output_name="quarantine_customers")
        return
    rows = customers.kept.drop("_source_file").withColumn("_deleted", F.lit(False)).unionByName(
        latest.where(F.col("op") == "D").select("c_custkey", "_sequence").withColumn("_deleted", F.lit(True)),
        allowMissingColumns=True,
    )
    yield Output(rows, output_name="customers")
    yield Output(quarantined, output_name="quarantine_customers")  # last, as for orders


@asset(
    key=CUSTOMERS_HISTORY,
    ins={"customers_cdc": AssetIn(key=AssetKey(["bronze", "customers_cdc"]))},
    group_name="silver",
    kinds=DELTA_KINDS,
    description=(
        "Type-2 history of customers (valid_from, valid_to, is_current, is_deleted), PII masked. "
        "Rebuilt from every bronze change, so a change arriving in a later run closes the row before it "
        "(and a late, older change slots in between); not rewritten when bronze has not changed."
    ),
    metadata=delta_table(write_mode="overwrite", schema_mode="overwrite"),
)
def customers_history(customers_cdc: DataFrame) -> DataFrame:
    changes, _ = T.parse_customer_changes(customers_cdc)  # rejects are quarantined by customers_and_history
    return T.mask_customer_pii(T.customer_history_rows(changes))


def _reference_asset(table: str):
    @asset(
        key=["silver", table],
        ins={"snapshot": AssetIn(key=AssetKey(["bronze", table]))},
        group_name="silver",
        kinds=DELTA_KINDS,
        description=f"{table} with the contract's columns and types.",
        metadata=delta_table(write_mode="overwrite", schema_mode="overwrite"),
    )
    def _silver_reference(snapshot: DataFrame) -> DataFrame:
        return T.conform_reference(snapshot, table)

    _silver_reference.__name__ = table
    return _silver_reference


reference_assets = [_reference_asset(table) for table in REFERENCE_TABLES]

silver_assets = [orders_and_lineitem, customers_and_history, customers_history, *reference_assets]
