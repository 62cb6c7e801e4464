"""Gold: business tables and the TPC-H answers, computed from silver.

Amounts stay decimals end to end (Spark decimal arithmetic), so the TPC-H
answers compare exactly with DuckDB's. Output column names and row order of
the TPC-H queries are those of DuckDB's ``tpch`` extension.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType


def _date(value: str | dt.date) -> Column:
    return F.lit(dt.date.fromisoformat(value) if isinstance(value, str) else value)


def _net_price() -> Column:
    """``l_extendedprice * (1 - l_discount)``: what the customer pays before tax."""
    return F.col("l_extendedprice") * (F.lit(Decimal("1")) - F.col("l_discount"))


def pricing_summary(lineitem: DataFrame, delta_days: int = 90) -> DataFrame:
    """TPC-H Q1, the pricing summary report.

    Args:
        lineitem: Silver ``lineitem``.
        delta_days: Days before 1998-12-01 of the last ship date counted (the
            validation value is 90).

    Returns:
        One row per (``l_returnflag``, ``l_linestatus``), sorted by them.
    """
    cutoff = dt.date(1998, 12, 1) - dt.timedelta(days=delta_days)
    shipped = lineitem.where(F.col("l_shipdate") <= _date(cutoff))
    keys = ["l_returnflag", "l_linestatus"]
    # What the report means, one aggregate over the line items. Only its schema is used: exact decimal
    # products per line item dominate the query (docs/decisions/0003-gold-recomputed-whole.md), so the
    # amounts are summed per discount and tax first (11 and 9 values), and the
    # products are taken per group. Sums of decimals are exact, so the answer is the same to the last digit.
    as_defined = (
        shipped.groupBy(*keys)
        .agg(
            F.sum("l_quantity").alias("sum_qty"),
            F.sum("l_extendedprice").alias("sum_base_price"),
            F.sum(_net_price()).alias("sum_disc_price"),
            F.sum(_net_price() * (F.lit(Decimal("1")) + F.col("l_tax"))).alias("sum_charge"),
            F.avg("l_quantity").alias("avg_qty"),
            F.avg("l_extendedprice").alias("avg_price"),
            F.avg("l_discount").alias("avg_disc"),
            F.count(F.lit(1)).alias("count_order"),
            # Not a column of the report: the type of the sum avg_disc divides, as sum_qty's is avg_qty's.
            F.sum("l_discount").alias("sum_disc"),
        )
        .schema
    )
    per_rate = shipped.groupBy(*keys, "l_discount", "l_tax").agg(
        F.sum("l_quantity").alias("quantity"),
        F.sum("l_extendedprice").alias("base_price"),
        F.sum("l_discount").alias("discount"),
        F.count(F.lit(1)).alias("line_items"),
    )
    net_price = F.col("base_price") * (F.lit(Decimal("1")) - F.col("l_discount"))

    def typed(total: Column, name: str) -> Column:
        return total.cast(as_defined[name].dataType).alias(name)

    def average(column: str, sum_name: str, name: str) -> Column:
        # As Spark averages a decimal: the sum over the line items, divided by the count as decimal(20, 0).
        line_item_sum = F.sum(column).cast(as_defined[sum_name].dataType)
        return typed(line_item_sum / F.sum("line_items").cast(DecimalType(20, 0)), name)

    return (
        per_rate.groupBy(*keys)
        .agg(
            typed(F.sum("quantity"), "sum_qty"),
            typed(F.sum("base_price"), "sum_base_price"),
            typed(F.sum(net_price), "sum_disc_price"),
            typed(F.sum(net_price * (F.lit(Decimal("1")) + F.col("l_tax"))), "sum_charge"),
            average("quantity", "sum_qty", "avg_qty"),
            average("base_price", "sum_base_price", "avg_price"),
            average("discount", "sum_disc", "avg_disc"),
            # Never null (a group has a line item); coalesced so that the column stays non-nullable, as a count is.
            typed(F.coalesce(F.sum("line_items"), F.lit(0)), "count_order"),
        )
        .orderBy(*keys)
    )


def shipping_priority(
    customer: DataFrame,
    orders: DataFrame,
    lineitem: DataFrame,
    segment: str = "BUILDING",
    as_of: str | dt.date = "1995-03-15",
    limit: int = 10,
) -> DataFrame:
    """TPC-H Q3: the unshipped orders of a market segment with most revenue.

    Args:
        customer: Silver ``customer``.
        orders: Silver ``orders``.
        lineitem: Silver ``lineitem``.
        segment: Market segment (validation value ``BUILDING``).
        as_of: Orders placed before and shipped after this date.
        limit: Number of orders returned.

    Returns:
        ``l_orderkey``, ``revenue``, ``o_orderdate``, ``o_shippriority``, by
        revenue descending, then order date.
    """
    segment_customers = customer.where(F.col("c_mktsegment") == F.lit(segment)).select("c_custkey")
    open_orders = orders.where(F.col("o_orderdate") < _date(as_of)).select(
        "o_orderkey", "o_custkey", "o_orderdate", "o_shippriority"
    )
    unshipped = lineitem.where(F.col("l_shipdate") > _date(as_of)).select("l_orderkey", "l_extendedprice", "l_discount")
    return (
        segment_customers.join(open_orders, F.col("c_custkey") == F.col("o_custkey"), how="inner")
        .join(unshipped, F.col("l_orderkey") == F.col("o_orderkey"), how="inner")
        .groupBy("l_orderkey", "o_orderdate", "o_shippriority")
        .agg(F.sum(_net_price()).alias("revenue"))
        .select("l_orderkey", "revenue", "o_orderdate", "o_shippriority")
        .orderBy(F.col("revenue").desc(), F.col("o_orderdate").asc())
        .limit(limit)
    )


def local_supplier_volume(
    customer: DataFrame,
    orders: DataFrame,
    lineitem: DataFrame,
    supplier: DataFrame,
    nation: DataFrame,
    region: DataFrame,
    region_name: str = "ASIA",
    year: int = 1994,
) -> DataFrame:
    """TPC-H Q5: revenue of suppliers selling to customers of their own nation.

    Args:
        customer, orders, lineitem, supplier, nation, region: Silver tables.
        region_name: Region of the nations (validation value ``ASIA``).
        year: Year of the order dates (validation value 1994).

    Returns:
        ``n_name``, ``revenue``, by revenue descending.
    """
    nations = region.where(F.col("r_name") == F.lit(region_name)).join(
        nation, F.col("n_regionkey") == F.col("r_regionkey"), how="inner"
    )
    year_orders = orders.where(
        (F.col("o_orderdate") >= _date(dt.date(year, 1, 1))) & (F.col("o_orderdate") < _date(dt.date(year + 1, 1, 1)))
    )
    return (
        year_orders.join(customer, F.col("c_custkey") == F.col("o_custkey"), how="inner")
        .join(lineitem, F.col("l_orderkey") == F.col("o_orderkey"), how="inner")
        # Local suppliers only: the supplier's nation is the customer's.
        .join(
            supplier,
            (F.col("l_suppkey") == F.col("s_suppkey")) & (F.col("c_nationkey") == F.col("s_nationkey")),
            how="inner",
        )
        .join(nations, F.col("s_nationkey") == F.col("n_nationkey"), how="inner")
        .groupBy("n_name")
        .agg(F.sum(_net_price()).alias("revenue"))
        .orderBy(F.col("revenue").desc())
    )


def forecasting_revenue_change(
    lineitem: DataFrame,
    year: int = 1994,
    discount: Decimal = Decimal("0.06"),
    quantity: int = 24,
) -> DataFrame:
    """TPC-H Q6: revenue gained by dropping small discounts.

    Args:
        lineitem: Silver ``lineitem``.
        year: Ship year (validation value 1994).
        discount: Centre of the discount band, ±0.01 (validation value 0.06).
        quantity: Quantities below this count (validation value 24).

    Returns:
        One row, ``revenue``.
    """
    band = Decimal("0.01")
    return lineitem.where(
        (F.col("l_shipdate") >= _date(dt.date(year, 1, 1)))
        & (F.col("l_shipdate") < _date(dt.date(year + 1, 1, 1)))
        & F.col("l_discount").between(F.lit(discount - band), F.lit(discount + band))
        & (F.col("l_quantity") < F.lit(quantity))
    ).agg(F.sum(F.col("l_extendedprice") * F.col("l_discount")).alias("revenue"))


def daily_revenue(orders: DataFrame, lineitem: DataFrame, customer: DataFrame) -> DataFrame:
    """Revenue per order date and market segment.

    Returns:
        ``o_orderdate``, ``c_mktsegment``, ``revenue`` (sum of
        ``l_extendedprice * (1 - l_discount)``), ``order_count`` (orders with
        at least one line item), sorted by date and segment.
    """
    # Line items are summed per order before the joins: the join then carries one row per
    # order instead of one per line item, and each order is counted once without a distinct
    # count (docs/decisions/0003-gold-recomputed-whole.md).
    per_order = lineitem.groupBy("l_orderkey").agg(F.sum(_net_price()).alias("revenue"))
    revenue_type = per_order.schema["revenue"].dataType  # one sum's type, as if summed from the line items
    return (
        orders.join(per_order, F.col("l_orderkey") == F.col("o_orderkey"), how="inner")
        .join(customer, F.col("c_custkey") == F.col("o_custkey"), how="inner")
        .groupBy("o_orderdate", "c_mktsegment")
        .agg(F.sum("revenue").cast(revenue_type).alias("revenue"), F.count(F.lit(1)).alias("order_count"))
        .select("o_orderdate", "c_mktsegment", "revenue", "order_count")
        .orderBy("o_orderdate", "c_mktsegment")
    )


def monthly_revenue(orders: DataFrame, lineitem: DataFrame) -> DataFrame:
    """Revenue per month of completed orders (``o_orderstatus = 'F'``).

    Returns:
        ``order_month`` (first day of the month of ``o_orderdate``),
        ``revenue``, ``order_count``, sorted by month.
    """
    completed = orders.where(F.col("o_orderstatus") == F.lit("F")).select(
        "o_orderkey", F.trunc("o_orderdate", "month").alias("order_month")
    )
    return (
        completed.join(lineitem, F.col("l_orderkey") == F.col("o_orderkey"), how="inner")
        .groupBy("order_month")
        .agg(F.sum(_net_price()).alias("revenue"), F.count_distinct("o_orderkey").alias("order_count"))
        .select("order_month", "revenue", "order_count")
        .orderBy("order_month")
    )


def customer_lifetime_value(customer: DataFrame, orders: DataFrame) -> DataFrame:
    """Per customer: how much and how long they have ordered.

    Customers without orders are kept (count 0, spend 0, dates and average
    null), so the table has one row per customer.

    Returns:
        ``c_custkey``, ``c_name``, ``c_mktsegment``, ``order_count``,
        ``total_spend`` (sum of ``o_totalprice``), ``first_order_date``,
        ``last_order_date``, ``avg_order_value``, sorted by ``c_custkey``.
    """
    per_customer = orders.groupBy("o_custkey").agg(
        F.count(F.lit(1)).alias("order_count"),
        F.sum("o_totalprice").alias("total_spend"),
        F.min("o_orderdate").alias("first_order_date"),
        F.max("o_orderdate").alias("last_order_date"),
        F.avg("o_totalprice").alias("avg_order_value"),
    )
    joined = customer.join(per_customer, F.col("c_custkey") == F.col("o_custkey"), how="left")
    return joined.select(
        "c_custkey",
        "c_name",
        "c_mktsegment",
        F.coalesce(F.col("order_count"), F.lit(0)).cast("long").alias("order_count"),
        F.coalesce(
            F.col("total_spend"), F.lit(Decimal("0.00")).cast(per_customer.schema["total_spend"].dataType)
        ).alias("total_spend"),
        "first_order_date",
        "last_order_date",
        "avg_order_value",
    ).orderBy("c_custkey")
