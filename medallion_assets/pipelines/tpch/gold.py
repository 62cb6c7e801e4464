"""Gold: business tables and the TPC-H answers, computed from silver.

Thin: each asset calls a function of :mod:`.gold_transforms`. Every gold table is
rewritten whole (the IO manager skips the rewrite when its silver inputs did
not change). None is a Dagster-partitioned asset: Dagster runs partitioned and
unpartitioned assets of one "Materialize all" as separate runs of a backfill,
which on a laptop means two Spark drivers; whole tables keep it one run, one
JVM. A user's own time-window partitioned asset is supported by the IO manager
(``delta_table(partition_expr=...)``, replaceWhere over the run's window).

The revenue tables carry a reconciliation check against silver, computed in
the same step from the same silver versions; every gold table has Dagster's
last-update freshness check.

Each asset declares its column lineage next to it (output column -> the silver
columns its values are computed from; filters and join keys are not listed,
and a row count depends on no column) and attaches it to every materialization
as ``dagster/column_lineage``, beside the IO manager's own table metadata.
Next to it too, what each column is (``delta_table(column_descriptions=...)``):
the IO manager puts it in the materialization's ``dagster/column_schema``.
"""
# No ``from __future__ import annotations``: Dagster reads the annotations at runtime.

from collections.abc import Sequence
from decimal import Decimal

from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    MetadataValue,
    Output,
    TableColumnDep,
    TableColumnLineage,
    asset,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from medallion_assets.assets.checks import last_update_freshness_checks
from medallion_assets.io_manager import DELTA_KINDS, check_once_per_version, delta_table
from medallion_assets.pipelines.tpch import gold_transforms as G

GROUP = "gold"

#: Gold is refreshed daily: allow a day and a bit.
GOLD_MAX_LAG_HOURS = 26.0


def _silver(*tables: str) -> dict[str, AssetIn]:
    return {name if name != "customers" else "customer": AssetIn(key=AssetKey(["silver", name])) for name in tables}


def _from(table: str, *columns: str) -> list[TableColumnDep]:
    """Lineage deps on ``columns`` of silver ``table``."""
    return [TableColumnDep(AssetKey(["silver", table]), column) for column in columns]


def _with_lineage(frame: DataFrame, lineage: dict[str, list[TableColumnDep]], **metadata) -> Output[DataFrame]:
    """The asset's output, carrying its column lineage (the IO manager adds the table's own metadata)."""
    return Output(frame, metadata={"dagster/column_lineage": TableColumnLineage(deps_by_column=lineage), **metadata})


#: ``l_extendedprice * (1 - l_discount)``, the net price summed by the revenue columns.
NET_PRICE = _from("lineitem", "l_extendedprice", "l_discount")


def _net_price_sum(alias: str = "revenue") -> F.Column:
    # Written out here rather than taken from the transforms: the reconciliation
    # must not share the code it checks.
    return F.sum(F.expr("l_extendedprice * (1 - l_discount)")).alias(alias)


def reconcile(
    context: AssetExecutionContext, gold: DataFrame, silver: DataFrame, keys: Sequence[str], values: Sequence[str], *,
    check_name: str, asset_key: AssetKey,
) -> AssetCheckResult:
    """Compare ``values`` per ``keys`` between a gold table and silver's own aggregate.

    A key present on one side only, or with a different value, is a failing row.
    Decimal sums are compared exactly. Evaluated again only when a silver
    table the step read changed (:func:`check_once_per_version`).
    """
    return check_once_per_version(
        context, AssetCheckKey(asset_key, check_name),
        lambda: _reconciled(gold, silver, keys, values, check_name=check_name, asset_key=asset_key),
    )


def _reconciled(
    gold: DataFrame, silver: DataFrame, keys: Sequence[str], values: Sequence[str], *, check_name: str, asset_key: AssetKey
) -> AssetCheckResult:
    g = gold.select(*keys, *[F.col(v).alias(f"_g_{v}") for v in values])
    s = silver.select(*keys, *[F.col(v).alias(f"_s_{v}") for v in values])
    joined = g.join(s, list(keys), "full_outer")
    same = F.lit(True)
    for v in values:
        same = same & F.col(f"_g_{v}").eqNullSafe(F.col(f"_s_{v}"))
    totals = joined.agg(
        F.count(F.lit(1)).alias("rows"),
        F.coalesce(F.sum(F.when(same, 0).otherwise(1)), F.lit(0)).alias("failing"),
        *[F.sum(f"_g_{v}").alias(f"gold_{v}") for v in values],
        *[F.sum(f"_s_{v}").alias(f"silver_{v}") for v in values],
    ).first()
    failing = int(totals["failing"])
    metadata = {"passing_rows": int(totals["rows"]) - failing, "failing_rows": failing, "keys": MetadataValue.json(list(keys))}
    for v in values:
        for side in ("gold", "silver"):
            value = totals[f"{side}_{v}"]
            metadata[f"{side}_total_{v}"] = MetadataValue.text(str(value if value is not None else Decimal(0)))
    return AssetCheckResult(
        asset_key=asset_key,
        check_name=check_name,
        passed=failing == 0,
        severity=AssetCheckSeverity.ERROR,
        metadata=metadata,
    )


def _reconciliation_spec(key: AssetKey, what: str) -> AssetCheckSpec:
    return AssetCheckSpec(name="revenue_reconciles_with_silver", asset=key, description=what)


# ---------------------------------------------------------------- TPC-H answers

PRICING_SUMMARY_LINEAGE = {
    "l_returnflag": _from("lineitem", "l_returnflag"),
    "l_linestatus": _from("lineitem", "l_linestatus"),
    "sum_qty": _from("lineitem", "l_quantity"),
    "sum_base_price": _from("lineitem", "l_extendedprice"),
    "sum_disc_price": NET_PRICE,
    "sum_charge": _from("lineitem", "l_extendedprice", "l_discount", "l_tax"),
    "avg_qty": _from("lineitem", "l_quantity"),
    "avg_price": _from("lineitem", "l_extendedprice"),
    "avg_disc": _from("lineitem", "l_discount"),
    "count_order": [],
}
PRICING_SUMMARY_COLUMNS = {
    "l_returnflag": "Return flag of the group's line items (R, A or N).",
    "l_linestatus": "Line status of the group's line items (O open, F fulfilled).",
    "sum_qty": "Sum of l_quantity over the group's line items shipped by 1998-09-02, decimal.",
    "sum_base_price": "Sum of l_extendedprice over the group's line items shipped by 1998-09-02, decimal.",
    "sum_disc_price": (
        "Sum of l_extendedprice * (1 - l_discount) over the group's line items shipped by 1998-09-02, decimal."
    ),
    "sum_charge": (
        "Sum of l_extendedprice * (1 - l_discount) * (1 + l_tax) over the group's line items shipped by "
        "1998-09-02, decimal."
    ),
    "avg_qty": "Average l_quantity of the group's line items shipped by 1998-09-02, decimal.",
    "avg_price": "Average l_extendedprice of the group's line items shipped by 1998-09-02, decimal.",
    "avg_disc": "Average l_discount (a fraction) of the group's line items shipped by 1998-09-02, decimal.",
    "count_order": "Number of the group's line items shipped by 1998-09-02 (line items, not orders: TPC-H's name).",
}


@asset(
    key=["gold", "pricing_summary"],
    ins=_silver("lineitem"),
    group_name=GROUP,
    kinds=DELTA_KINDS,
    description="TPC-H Q1 (pricing summary report), validation parameters (DELTA = 90 days).",
    metadata=delta_table(schema_mode="overwrite", column_descriptions=PRICING_SUMMARY_COLUMNS),
)
def pricing_summary(lineitem: DataFrame) -> Output[DataFrame]:
    return _with_lineage(G.pricing_summary(lineitem), PRICING_SUMMARY_LINEAGE)


SHIPPING_PRIORITY_LINEAGE = {
    "l_orderkey": _from("lineitem", "l_orderkey"),
    "revenue": NET_PRICE,
    "o_orderdate": _from("orders", "o_orderdate"),
    "o_shippriority": _from("orders", "o_shippriority"),
}
SHIPPING_PRIORITY_COLUMNS = {
    "l_orderkey": (
        "Key of an order of a BUILDING-segment customer placed before 1995-03-15 with line items shipped after it."
    ),
    "revenue": (
        "Sum of l_extendedprice * (1 - l_discount) over the order's line items shipped after 1995-03-15, decimal."
    ),
    "o_orderdate": "Date the order was placed.",
    "o_shippriority": "Shipping priority of the order (o_shippriority).",
}


@asset(
    key=["gold", "shipping_priority"],
    ins=_silver("customers", "orders", "lineitem"),
    group_name=GROUP,
    kinds=DELTA_KINDS,
    description="TPC-H Q3 (shipping priority), validation parameters (BUILDING, 1995-03-15).",
    metadata=delta_table(schema_mode="overwrite", column_descriptions=SHIPPING_PRIORITY_COLUMNS),
)
def shipping_priority(customer: DataFrame, orders: DataFrame, lineitem: DataFrame) -> Output[DataFrame]:
    return _with_lineage(G.shipping_priority(customer, orders, lineitem), SHIPPING_PRIORITY_LINEAGE)


LOCAL_SUPPLIER_VOLUME_LINEAGE = {"n_name": _from("nation", "n_name"), "revenue": NET_PRICE}
LOCAL_SUPPLIER_VOLUME_COLUMNS = {
    "n_name": "Name of a nation of region ASIA.",
    "revenue": (
        "Sum of l_extendedprice * (1 - l_discount) over the line items of 1994 orders whose customer and "
        "supplier are both of this nation, decimal."
    ),
}


@asset(
    key=["gold", "local_supplier_volume"],
    ins=_silver("customers", "orders", "lineitem", "supplier", "nation", "region"),
    group_name=GROUP,
    kinds=DELTA_KINDS,
    description="TPC-H Q5 (local supplier volume), validation parameters (ASIA, 1994).",
    metadata=delta_table(schema_mode="overwrite", column_descriptions=LOCAL_SUPPLIER_VOLUME_COLUMNS),
)
def local_supplier_volume(
    customer: DataFrame, orders: DataFrame, lineitem: DataFrame, supplier: DataFrame, nation: DataFrame, region: DataFrame
) -> Output[DataFrame]:
    return _with_lineage(
        G.local_supplier_volume(customer, orders, lineitem, supplier, nation, region), LOCAL_SUPPLIER_VOLUME_LINEAGE
    )


#: ``sum(l_extendedprice * l_discount)``, not the net price.
FORECASTING_REVENUE_CHANGE_LINEAGE = {"revenue": _from("lineitem", "l_extendedprice", "l_discount")}
FORECASTING_REVENUE_CHANGE_COLUMNS = {
    "revenue": (
        "Sum of l_extendedprice * l_discount over line items shipped in 1994 with l_discount between 0.05 and "
        "0.07 and l_quantity below 24: the revenue those discounts gave away, decimal."
    ),
}


@asset(
    key=["gold", "forecasting_revenue_change"],
    ins=_silver("lineitem"),
    group_name=GROUP,
    kinds=DELTA_KINDS,
    description="TPC-H Q6 (forecasting revenue change), validation parameters (1994, 0.06, 24).",
    metadata=delta_table(schema_mode="overwrite", column_descriptions=FORECASTING_REVENUE_CHANGE_COLUMNS),
)
def forecasting_revenue_change(lineitem: DataFrame) -> Output[DataFrame]:
    return _with_lineage(G.forecasting_revenue_change(lineitem), FORECASTING_REVENUE_CHANGE_LINEAGE)


# ---------------------------------------------------------------- business tables

DAILY_REVENUE = AssetKey(["gold", "daily_revenue"])
MONTHLY_REVENUE = AssetKey(["gold", "monthly_revenue"])
CUSTOMER_LIFETIME_VALUE = AssetKey(["gold", "customer_lifetime_value"])

DAILY_REVENUE_LINEAGE = {
    "o_orderdate": _from("orders", "o_orderdate"),
    "c_mktsegment": _from("customers", "c_mktsegment"),
    "revenue": NET_PRICE,
    "order_count": _from("orders", "o_orderkey"),
}
DAILY_REVENUE_COLUMNS = {
    "o_orderdate": "Date the orders were placed.",
    "c_mktsegment": "Market segment of the ordering customers.",
    "revenue": (
        "Sum of l_extendedprice * (1 - l_discount) over the line items of the day's orders by customers of "
        "the segment, decimal."
    ),
    "order_count": "Number of distinct orders of the day and segment that have at least one line item.",
}


@asset(
    key=DAILY_REVENUE,
    ins=_silver("orders", "lineitem", "customers"),
    group_name=GROUP,
    kinds=DELTA_KINDS,
    description="Revenue and order count per order date and market segment.",
    metadata=delta_table(column_descriptions=DAILY_REVENUE_COLUMNS),
    check_specs=[_reconciliation_spec(DAILY_REVENUE, "Per order date, revenue equals silver's lineitem net price of that day's orders.")],
)
def daily_revenue(context: AssetExecutionContext, orders: DataFrame, lineitem: DataFrame, customer: DataFrame):
    frame = G.daily_revenue(orders, lineitem, customer).cache()
    try:
        yield _with_lineage(frame, DAILY_REVENUE_LINEAGE)
        silver_days = (
            orders.join(customer.select(F.col("c_custkey").alias("o_custkey")), "o_custkey", "left_semi")
            .join(lineitem, F.col("l_orderkey") == F.col("o_orderkey"))
            .groupBy("o_orderdate")
            .agg(_net_price_sum())
        )
        gold_days = frame.groupBy("o_orderdate").agg(F.sum("revenue").alias("revenue"))
        yield reconcile(
            context, gold_days, silver_days, ["o_orderdate"], ["revenue"], check_name="revenue_reconciles_with_silver",
            asset_key=DAILY_REVENUE,
        )
    finally:
        frame.unpersist()  # written and reconciled, or failed; the session outlives the step


MONTHLY_REVENUE_LINEAGE = {
    "order_month": _from("orders", "o_orderdate"),
    "revenue": NET_PRICE,
    "order_count": _from("orders", "o_orderkey"),
}
MONTHLY_REVENUE_COLUMNS = {
    "order_month": "First day of the month of o_orderdate of the completed (o_orderstatus 'F') orders counted.",
    "revenue": (
        "Sum of l_extendedprice * (1 - l_discount) over the line items of the month's completed orders, decimal."
    ),
    "order_count": "Number of distinct completed orders of the month that have at least one line item.",
}


@asset(
    key=MONTHLY_REVENUE,
    ins=_silver("orders", "lineitem"),
    group_name=GROUP,
    kinds=DELTA_KINDS,
    description="Revenue and order count per month of completed (status F) orders.",
    metadata=delta_table(schema_mode="overwrite", column_descriptions=MONTHLY_REVENUE_COLUMNS),
    check_specs=[_reconciliation_spec(MONTHLY_REVENUE, "Per month, revenue and order count equal silver's completed orders.")],
)
def monthly_revenue(context: AssetExecutionContext, orders: DataFrame, lineitem: DataFrame):
    frame = G.monthly_revenue(orders, lineitem).cache()
    try:
        yield _with_lineage(frame, MONTHLY_REVENUE_LINEAGE)
        silver_months = (
            orders.where("o_orderstatus = 'F'")
            .join(lineitem, F.col("l_orderkey") == F.col("o_orderkey"))
            .groupBy(F.date_format("o_orderdate", "yyyy-MM").alias("month"))
            .agg(_net_price_sum(), F.countDistinct("o_orderkey").alias("order_count"))
        )
        gold_months = frame.select(F.date_format("order_month", "yyyy-MM").alias("month"), "revenue", "order_count")
        yield reconcile(
            context, gold_months, silver_months, ["month"], ["revenue", "order_count"],
            check_name="revenue_reconciles_with_silver", asset_key=MONTHLY_REVENUE,
        )
    finally:
        frame.unpersist()  # written and reconciled, or failed; the session outlives the step


CUSTOMER_LIFETIME_VALUE_LINEAGE = {
    "c_custkey": _from("customers", "c_custkey"),
    "c_name": _from("customers", "c_name"),
    "c_mktsegment": _from("customers", "c_mktsegment"),
    "order_count": [],
    "total_spend": _from("orders", "o_totalprice"),
    "first_order_date": _from("orders", "o_orderdate"),
    "last_order_date": _from("orders", "o_orderdate"),
    "avg_order_value": _from("orders", "o_totalprice"),
}
CUSTOMER_LIFETIME_VALUE_COLUMNS = {
    "c_custkey": "Customer key: one row per customer of silver customers, customers without orders included.",
    "c_name": "Name of the customer.",
    "c_mktsegment": "Market segment of the customer.",
    "order_count": "Number of the customer's orders (0 when none).",
    "total_spend": "Sum of o_totalprice over the customer's orders (0 when none), decimal.",
    "first_order_date": "Date of the customer's first order (null when none).",
    "last_order_date": "Date of the customer's latest order (null when none).",
    "avg_order_value": "Average o_totalprice of the customer's orders (null when none), decimal.",
}


@asset(
    key=CUSTOMER_LIFETIME_VALUE,
    ins=_silver("customers", "orders"),
    group_name=GROUP,
    kinds=DELTA_KINDS,
    description="Per customer: orders, total and average spend, first and last order date.",
    metadata=delta_table(schema_mode="overwrite", column_descriptions=CUSTOMER_LIFETIME_VALUE_COLUMNS),
    check_specs=[
        _reconciliation_spec(CUSTOMER_LIFETIME_VALUE, "Per customer, total spend and order count equal silver's orders.")
    ],
)
def customer_lifetime_value(context: AssetExecutionContext, customer: DataFrame, orders: DataFrame):
    frame = G.customer_lifetime_value(customer, orders).cache()
    try:
        yield _with_lineage(frame, CUSTOMER_LIFETIME_VALUE_LINEAGE)
        per_customer = orders.groupBy(F.col("o_custkey").alias("c_custkey")).agg(
            F.sum("o_totalprice").alias("total_spend"), F.count(F.lit(1)).cast("long").alias("order_count")
        )
        silver_customers = customer.select("c_custkey").join(per_customer, "c_custkey", "left").select(
            "c_custkey",
            F.coalesce("total_spend", F.lit(0).cast(per_customer.schema["total_spend"].dataType)).alias("total_spend"),
            F.coalesce("order_count", F.lit(0).cast("long")).alias("order_count"),
        )
        yield reconcile(
            context, frame.select("c_custkey", "total_spend", "order_count"), silver_customers, ["c_custkey"],
            ["total_spend", "order_count"], check_name="revenue_reconciles_with_silver", asset_key=CUSTOMER_LIFETIME_VALUE,
        )
    finally:
        frame.unpersist()  # written and reconciled, or failed; the session outlives the step


gold_assets = [
    pricing_summary,
    shipping_priority,
    local_supplier_volume,
    forecasting_revenue_change,
    daily_revenue,
    monthly_revenue,
    customer_lifetime_value,
]

# Dagster's own freshness check, as for silver.
gold_checks = last_update_freshness_checks(gold_assets, max_lag_hours=GOLD_MAX_LAG_HOURS)

