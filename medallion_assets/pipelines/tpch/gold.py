"""Gold: business tables and the TPC-H answers, computed from silver.

Thin: each asset calls a function of :mod:`.gold_transforms`. Every gold table is
rewritten whole (the IO manager skips the rewrite when its silver inputs did
not change). None is a Dagster-partitioned asset: Dagster runs partitioned and
unpartitioned assets of one "Materialize all" as separate runs of a backfill,
which on a laptop means two Spark drivers; whole tables keep it one run, one
JVM. A user's own time-window partitioned asset is supported by the IO manager
(``delta_table(partition_expr=...)``, replaceWhere over the run's window).

The revenue tables carry a reconciliation check against silver, computed in
the same step from the same silver versions, by DataFusion over delta-rs'
read of them (Spark SQL where delta-rs cannot read a table, or where the gold
table has more rows than the IO manager's ``arrow_read_max_rows`` lets a step
hold as Arrow); every gold table has Dagster's last-update freshness check.

Each asset declares its column lineage next to it (output column -> the silver
columns its values are computed from; filters and join keys are not listed,
and a row count depends on no column) and attaches it to every materialization
as ``dagster/column_lineage``, beside the IO manager's own table metadata.
Next to it too, what each column is (``delta_table(column_descriptions=...)``):
the IO manager puts it in the materialization's ``dagster/column_schema``.
"""
# No ``from __future__ import annotations``: Dagster reads the annotations at runtime.

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
from dagster import (
    AssetCheckExecutionContext,
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

from medallion_assets.assets.checks import COMPUTED_WITH, counted, last_update_freshness_checks, one_row
from medallion_assets.io_manager import DELTA_KINDS, TableRead, check_once_per_version, delta_table
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


@dataclass(frozen=True)
class Reconciliation:
    """How a gold table reconciles with silver: two aggregates to ``keys`` and ``values``, compared per key.

    Written in SQL, not taken from the transforms: the reconciliation must not
    share the code it checks, and DataFusion runs it over delta-rs' read of the
    versions the step read, so the sums are computed by another engine than
    the one that computed gold; Spark SQL runs the same queries where delta-rs
    cannot read a table (:func:`~medallion_assets.assets.checks.counted`).

    Attributes:
        gold_sql: the gold rows (``{gold}``) aggregated to ``keys`` and ``values``.
        silver_sql: the silver tables (``{orders}``: each by its name among the
            step's silver inputs) aggregated to the same.
        keys: the columns a row is compared on.
        values: the columns compared, exactly (decimal sums included).
    """

    gold_sql: str
    silver_sql: str
    keys: Sequence[str]
    values: Sequence[str]

    def sql(self) -> str:
        """Rows compared, failing rows, and each value's total on either side, in one row."""
        matched = " AND ".join(f"g.{k} = s.{k}" for k in self.keys)
        # Parenthesized: DataFusion binds AND tighter than IS NOT DISTINCT FROM.
        same = " AND ".join(f"(g.{v} IS NOT DISTINCT FROM s.{v})" for v in self.values)
        totals = ", ".join(f"sum(g.{v}) AS gold_{v}, sum(s.{v}) AS silver_{v}" for v in self.values)
        return (
            f"WITH g AS ({self.gold_sql}), s AS ({self.silver_sql}) "
            f"SELECT count(*) AS rows, coalesce(sum(CASE WHEN {same} THEN 0 ELSE 1 END), 0) AS failing, {totals} "
            f"FROM g FULL OUTER JOIN s ON {matched}"
        )


def reconcile(
    context: AssetExecutionContext | AssetCheckExecutionContext,
    gold: DataFrame,
    silver: Mapping[str, TableRead],
    reconciliation: Reconciliation,
    *,
    check_name: str,
    asset_key: AssetKey,
) -> AssetCheckResult:
    """Compare a gold table's rows (``gold``, before or after its write) with silver's own aggregate.

    A key present on one side only, or with a different value, is a failing
    row. Evaluated again only when a silver table the step read changed
    (:func:`check_once_per_version`).
    """
    names = list(silver)
    sql = reconciliation.sql()
    # DataFusion reads silver where it lies, but gold's rows come to it in hand, as Arrow: as many as the IO
    # manager lets a step hold (``arrow_read_max_rows``), one more to see that there are more. Past that
    # (a customer table's one row per customer grows with the data), Spark SQL reconciles both sides.
    in_hand_max_rows = min(read.max_arrow_rows for read in silver.values())

    def gold_in_hand() -> pa.Table | None:
        rows = gold.limit(in_hand_max_rows + 1).toArrow()
        if rows.num_rows <= in_hand_max_rows:
            return rows
        context.log.info(
            f"{check_name} reconciled by Spark SQL: {asset_key.to_user_string()} has more than "
            f"arrow_read_max_rows={in_hand_max_rows} rows to hold as Arrow"
        )
        return None

    def evaluate() -> AssetCheckResult:
        tables = [silver[name].delta_table() for name in names]
        # Gold is collected only when DataFusion is to reconcile: every silver table is one delta-rs reads.
        gold_rows = gold_in_hand() if all(table is not None for table in tables) else None
        row, computed_with = counted(
            context,
            lambda: tables if gold_rows is not None else [None],
            lambda: [silver[name].frame for name in names],
            lambda *read: one_row(
                sql,
                {**dict(zip(names, read, strict=False)), "gold": gold if isinstance(read[0], DataFrame) else gold_rows},
            ),
        )
        failing = int(row["failing"])
        metadata: dict[str, Any] = {
            "passing_rows": int(row["rows"]) - failing,
            "failing_rows": failing,
            "keys": MetadataValue.json(list(reconciliation.keys)),
            COMPUTED_WITH: computed_with,
        }
        for v in reconciliation.values:
            for side in ("gold", "silver"):
                value = row[f"{side}_{v}"]
                metadata[f"{side}_total_{v}"] = MetadataValue.text(str(value if value is not None else Decimal(0)))
        return AssetCheckResult(
            asset_key=asset_key,
            check_name=check_name,
            passed=failing == 0,
            severity=AssetCheckSeverity.ERROR,
            metadata=metadata,
        )

    return check_once_per_version(context, AssetCheckKey(asset_key, check_name), evaluate)


#: Per order date: gold's revenue of every segment against silver's line items of that day's orders.
DAILY_REVENUE_RECONCILIATION = Reconciliation(
    gold_sql="SELECT o_orderdate, sum(revenue) AS revenue FROM {gold} GROUP BY o_orderdate",
    silver_sql=(
        "SELECT o_orderdate, sum(l_extendedprice * (1 - l_discount)) AS revenue "
        "FROM {orders} JOIN {lineitem} ON l_orderkey = o_orderkey "
        "WHERE o_custkey IN (SELECT c_custkey FROM {customer}) GROUP BY o_orderdate"
    ),
    keys=["o_orderdate"],
    values=["revenue"],
)

#: Per month: gold's revenue and orders against silver's completed orders.
MONTHLY_REVENUE_RECONCILIATION = Reconciliation(
    gold_sql="SELECT order_month AS month, revenue, order_count FROM {gold}",
    silver_sql=(
        "SELECT CAST(date_trunc('month', o_orderdate) AS DATE) AS month, "
        "sum(l_extendedprice * (1 - l_discount)) AS revenue, count(DISTINCT o_orderkey) AS order_count "
        "FROM {orders} JOIN {lineitem} ON l_orderkey = o_orderkey "
        "WHERE o_orderstatus = 'F' GROUP BY CAST(date_trunc('month', o_orderdate) AS DATE)"
    ),
    keys=["month"],
    values=["revenue", "order_count"],
)

#: Per customer: gold's spend and orders against silver's orders; a customer without orders spends 0 in 0.
CUSTOMER_LIFETIME_VALUE_RECONCILIATION = Reconciliation(
    gold_sql="SELECT c_custkey, total_spend, order_count FROM {gold}",
    silver_sql=(
        "SELECT c.c_custkey, coalesce(sum(o.o_totalprice), 0) AS total_spend, count(o.o_custkey) AS order_count "
        "FROM {customer} AS c LEFT JOIN {orders} AS o ON o.o_custkey = c.c_custkey GROUP BY c.c_custkey"
    ),
    keys=["c_custkey"],
    values=["total_spend", "order_count"],
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
    customer: DataFrame,
    orders: DataFrame,
    lineitem: DataFrame,
    supplier: DataFrame,
    nation: DataFrame,
    region: DataFrame,
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
    check_specs=[
        _reconciliation_spec(
            DAILY_REVENUE, "Per order date, revenue equals silver's lineitem net price of that day's orders."
        )
    ],
)
def daily_revenue(context: AssetExecutionContext, orders: TableRead, lineitem: TableRead, customer: TableRead):
    frame = G.daily_revenue(orders.frame, lineitem.frame, customer.frame).cache()
    try:
        yield _with_lineage(frame, DAILY_REVENUE_LINEAGE)
        yield reconcile(
            context,
            frame,
            {"orders": orders, "lineitem": lineitem, "customer": customer},
            DAILY_REVENUE_RECONCILIATION,
            check_name="revenue_reconciles_with_silver",
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
    check_specs=[
        _reconciliation_spec(MONTHLY_REVENUE, "Per month, revenue and order count equal silver's completed orders.")
    ],
)
def monthly_revenue(context: AssetExecutionContext, orders: TableRead, lineitem: TableRead):
    frame = G.monthly_revenue(orders.frame, lineitem.frame).cache()
    try:
        yield _with_lineage(frame, MONTHLY_REVENUE_LINEAGE)
        yield reconcile(
            context,
            frame,
            {"orders": orders, "lineitem": lineitem},
            MONTHLY_REVENUE_RECONCILIATION,
            check_name="revenue_reconciles_with_silver",
            asset_key=MONTHLY_REVENUE,
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
        _reconciliation_spec(
            CUSTOMER_LIFETIME_VALUE, "Per customer, total spend and order count equal silver's orders."
        )
    ],
)
def customer_lifetime_value(context: AssetExecutionContext, customer: TableRead, orders: TableRead):
    frame = G.customer_lifetime_value(customer.frame, orders.frame).cache()
    try:
        yield _with_lineage(frame, CUSTOMER_LIFETIME_VALUE_LINEAGE)
        yield reconcile(
            context,
            frame,
            {"customer": customer, "orders": orders},
            CUSTOMER_LIFETIME_VALUE_RECONCILIATION,
            check_name="revenue_reconciles_with_silver",
            asset_key=CUSTOMER_LIFETIME_VALUE,
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
