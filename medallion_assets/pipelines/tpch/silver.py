"""TPC-H's own silver step: order events (files and Kafka) -> ``silver.orders`` and ``silver.lineitem``.

An order event is nested (an order with its line items), so this step is
plain transform code (:mod:`.transforms`) built from the same building blocks
the generic change-feed step uses: parse with a reason per rejected line,
expectations as checks, merges by key and sequence with deletes, the
quarantine appended last, and what it set aside reported by the
``orders_rejected_rows`` check on ``silver.orders`` (see :mod:`medallion_assets.assets.silver`).
``lineitem`` is replaced by order: an order's new event replaces all its line items.

Where the deployment has no Kafka, the definitions leave ``bronze.orders_kafka``
out and take this step's variant that reads the landed files only
(:func:`assets_without`).
"""

# No ``from __future__ import annotations``: Dagster reads the config class from the annotation.
from collections.abc import Collection, Sequence
from typing import Literal

from dagster import (
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetOut,
    AssetsDefinition,
    Config,
    MetadataValue,
    Output,
    multi_asset,
)
from pydantic import Field
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from medallion_assets.assets.checks import reference_check, silver_freshness_checks, unique_key_check
from medallion_assets.assets.silver import quarantine_out
from medallion_assets.expectations import (
    DEFAULT_MAX_REJECTED_SHARE,
    ObservedInput,
    apply_expectations,
    cache_rows,
    check_specs,
    count_rejected,
    expect,
    expect_or_drop,
    expect_or_fail,
    has_no_rows,
    rejected_rows_check_spec,
    rejected_rows_result,
    rejects_to_quarantine,
    step_output,
    tag_failed_checks,
)
from medallion_assets.feeds import Feed
from medallion_assets.io_manager import DELTA_KINDS, READ, delta_table
from medallion_assets.pipelines.tpch import transforms as T
from medallion_assets.pipelines.tpch.feeds import ORDERS_KAFKA, ORDERS_RAW, TPCH_COLUMN_DESCRIPTIONS
from medallion_assets.transforms.silver import rejected_changes, rows_to_merge

ORDERS = AssetKey(["silver", "orders"])
LINEITEM = AssetKey(["silver", "lineitem"])
QUARANTINE_ORDERS = AssetKey(["quarantine", "orders"])

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
#: Share of a run's order lines past which ``orders_rejected_rows`` is an ERROR
#: (as ``ApplyChanges.max_rejected_share``), as for any feed: the simulator's noisy batches reject about 0.3% of
#: their lines on purpose, a WARN.
ORDERS_MAX_REJECTED_SHARE: float | None = DEFAULT_MAX_REJECTED_SHARE


def _sequence() -> F.Column:
    # One sortable text per change, so the merge compares a single column.
    return F.concat_ws("|", F.date_format("event_time", "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"), F.col("event_id")).alias(
        "_sequence"
    )


def _descriptions(schema) -> dict[str, str]:
    return {name: TPCH_COLUMN_DESCRIPTIONS[name] for name in schema.fieldNames()}


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


#: The bronze tables of order events the step reads: landed files and Kafka messages.
ORDER_SOURCES: tuple[Feed, ...] = (ORDERS_RAW, ORDERS_KAFKA)


def orders_step(sources: Sequence[Feed] = ORDER_SOURCES) -> AssetsDefinition:
    """TPC-H's order step (``orders_and_lineitem``), reading the bronze tables of ``sources``.

    Args:
        sources: :data:`ORDER_SOURCES`, or those of them the definitions include
            (the landed files always).
    """
    names = [feed.name for feed in sources]
    if ORDERS_RAW.name not in names:
        raise ValueError(f"TPC-H's order step reads {ORDERS_RAW.name} always; got {names}")

    @multi_asset(
        name="orders_and_lineitem",
        outs={
            # schema_mode="merge": the 'evolve' drift policy adds columns; rows that lack one store null.
            # filtered_by: the dates gold's queries filter on (lineitem's other two dates are only compared
            # with each other), so that a write keeps statistics on no other date.
            "orders": AssetOut(
                kinds=set(DELTA_KINDS),  # AssetOut takes a set
                key=ORDERS,
                group_name="silver",
                metadata=delta_table(
                    write_mode="merge",
                    merge_keys=["o_orderkey"],
                    sequence_column="_sequence",
                    delete_column="_deleted",
                    schema_mode="merge",
                    filtered_by=["o_orderdate"],
                    column_descriptions=_descriptions(T.ORDERS_SCHEMA),
                ),
                is_required=False,
            ),
            "lineitem": AssetOut(
                kinds=set(DELTA_KINDS),  # AssetOut takes a set
                key=LINEITEM,
                group_name="silver",
                metadata=delta_table(
                    write_mode="merge",
                    merge_keys=["l_orderkey", "l_linenumber"],
                    sequence_column="_sequence",
                    delete_column="_deleted",
                    replace_group="l_orderkey",
                    schema_mode="merge",
                    filtered_by=["l_shipdate"],
                    column_descriptions=_descriptions(T.LINEITEM_SCHEMA),
                ),
                is_required=False,
            ),
            "quarantine_orders": quarantine_out(
                key=QUARANTINE_ORDERS, source=" and ".join(names), guards=[ORDERS, LINEITEM]
            ),
        },
        ins={feed.name: AssetIn(key=feed.bronze_key, metadata={READ: "changes"}) for feed in sources},
        check_specs=[
            *check_specs(ORDERS, ORDERS_EXPECTATIONS),
            *check_specs(LINEITEM, LINEITEM_EXPECTATIONS),
            rejected_rows_check_spec(ORDERS, table="orders", max_rejected_share=ORDERS_MAX_REJECTED_SHARE),
        ],
        can_subset=False,
    )
    def orders_and_lineitem(context: AssetExecutionContext, config: OrdersSilverConfig, **order_events: DataFrame):
        """orders and lineitem: latest state per order (deletes applied), merged from new events of either source."""
        yield from _merge_order_events(
            context, config, T.order_lines(order_events[ORDERS_RAW.name], order_events.get(ORDERS_KAFKA.name))
        )

    return orders_and_lineitem


orders_and_lineitem = orders_step()


def assets_without(left_out: Collection[AssetKey]) -> list[AssetsDefinition]:
    """The step for definitions that leave bronze tables out (``bronze.orders_kafka`` where there is no Kafka).

    Called by :func:`medallion_assets.definitions.build_definitions` in place of
    :data:`orders_and_lineitem`.
    """
    return [orders_step([feed for feed in ORDER_SOURCES if feed.bronze_key not in left_out])]


def _merge_order_events(context: AssetExecutionContext, config: OrdersSilverConfig, lines: DataFrame):
    """The step's outputs and check results from order event lines (``value``, ``_source_file``, ``_ingested_at``)."""
    no_rows = has_no_rows(lines)
    # The lines are counted, and under 'ignore' their drifted fields found, as the parse
    # reads them (the step's aggregations read every line), not by scans of their own.
    if config.schema_drift == "evolve":
        # The one input read twice: which columns the parse builds depends on the drifted fields.
        kept, ignored = T.keep_order_fields([] if no_rows else _drifted_fields(lines))
        observed = ObservedInput(lines)
    else:
        kept = T.KeptOrderFields()
        observed = ObservedInput(lines, drifted=T.drifted_order_fields_seen(F.col("value")))
    # Cached: the expectation counts parse every line once, and the rejects are read back.
    judged = cache_rows(T.judge_order_lines(observed.frame, kept), no_rows=no_rows)
    events, rejects = T.order_events(judged, kept), rejected_changes(judged)
    unique_events = T.deduplicate_events(events)
    # The winner's file goes along so a row that fails an expectation is quarantined with it.
    winner_files = unique_events.groupBy("o_orderkey", "event_time", "event_id").agg(
        F.max("_source_file").alias("_source_file")
    )
    changes = (
        T.latest_order_changes(unique_events)
        .join(winner_files, ["o_orderkey", "event_time", "event_id"], "left")
        .withColumn("_sequence", _sequence())
    )
    changes = cache_rows(changes, no_rows=no_rows)
    upserts = changes.where(F.col("op") == "upsert")
    deletes = changes.where(F.col("op") == "delete")

    order_upserts = T.order_rows(upserts, kept).join(
        upserts.select("o_orderkey", "_sequence", "_source_file"), "o_orderkey"
    )
    orders = apply_expectations(
        order_upserts, ORDERS_EXPECTATIONS, asset_key=ORDERS, table_name="orders", no_rows=no_rows
    )
    lineitem_upserts = T.lineitem_rows(upserts, kept).join(
        upserts.select(F.col("o_orderkey").alias("l_orderkey"), "_sequence", "_source_file"), "l_orderkey"
    )
    lineitem = apply_expectations(
        lineitem_upserts, LINEITEM_EXPECTATIONS, asset_key=LINEITEM, table_name="lineitem", no_rows=no_rows
    )

    # Cached: counted here, then written from the cache by the IO manager.
    quarantined = cache_rows(
        rejects_to_quarantine(rejects, "orders").unionByName(orders.quarantined).unionByName(lineitem.quarantined),
        no_rows=no_rows,
    )
    rejected = count_rejected(quarantined, input_rows=observed.rows, no_rows=no_rows, judged=judged)
    judged.unpersist()  # what reads it next is cached: the changes and the quarantined rows
    if config.schema_drift == "ignore":  # the parse observed them
        seen = [] if no_rows else observed.metric("drifted")
        # Not reported (Spark Connect, or an observation lost): the scan finds the same fields.
        drifted = _drifted_fields(lines) if seen is None else [(field["level"], field["field"]) for field in seen]
        ignored = sorted(f"{level}.{field}" for level, field in set(drifted))
    drift_metadata = {"schema_drift_policy": config.schema_drift, "schema_drift_ignored": MetadataValue.json(ignored)}
    rejected_check = rejected_rows_result(
        rejected, asset_key=ORDERS, table="orders", max_rejected_share=ORDERS_MAX_REJECTED_SHARE
    )
    tag_failed_checks(context, [*orders.check_results, *lineitem.check_results, rejected_check])
    try:
        yield from orders.check_results
        yield from lineitem.check_results
        if orders.blocked or lineitem.blocked:
            # A failed expectation: the tables stay as they are; the blocking check stops downstream.
            yield Output(quarantined, output_name="quarantine_orders", metadata=rejected.metadata)
            yield rejected_check
            return
        deleted_orders = deletes.select("o_orderkey", "_sequence")
        order_rows = step_output(rows_to_merge(orders.kept, deleted_orders), no_rows=no_rows)
        line_rows = step_output(
            rows_to_merge(lineitem.kept, deleted_orders.withColumnRenamed("o_orderkey", "l_orderkey")), no_rows=no_rows
        )
        yield Output(
            order_rows,
            output_name="orders",
            metadata={**drift_metadata, "schema_drift_kept": MetadataValue.json(list(kept.order)), **rejected.metadata},
        )
        yield Output(
            line_rows,
            output_name="lineitem",
            metadata={**drift_metadata, "schema_drift_kept": MetadataValue.json(list(kept.lineitem))},
        )
        # Last: the step's read position is the oldest of its tables', so a run killed
        # before this append reads the increment again, merges it again (a no-op) and
        # quarantines it once. Written first, a killed run's rejects were appended twice.
        yield Output(
            step_output(quarantined, no_rows=no_rows), output_name="quarantine_orders", metadata=rejected.metadata
        )
        yield rejected_check
    finally:
        # Written by now (each output is written as it is yielded): later steps get the memory back.
        for frame in (quarantined, changes):
            frame.unpersist()
        orders.release()
        lineitem.release()


def _drifted_fields(lines: DataFrame) -> list[tuple[str, str]]:
    return [(row["level"], row["field"]) for row in T.drifted_order_fields(lines).collect()]


#: Table checks of TPC-H's own silver tables and the references between them.
tpch_silver_checks = [
    unique_key_check("orders", ("o_orderkey",)),
    unique_key_check("lineitem", ("l_orderkey", "l_linenumber")),
    reference_check("lineitem", ("l_orderkey",), "orders", ("o_orderkey",)),
    reference_check("orders", ("o_custkey",), "customers", ("c_custkey",)),
    reference_check("customers", ("c_nationkey",), "nation", ("n_nationkey",)),
    *silver_freshness_checks(["orders", "lineitem"]),
]
