"""Reports over gold computed with pandas: read and stored by delta-rs, no Spark session.

An asset whose input is annotated ``pandas.DataFrame`` gets the table from the
Delta IO manager's pandas handler (:mod:`medallion_assets.io_manager.arrow_handlers`),
and a returned pandas DataFrame is stored as a Delta table the same way; the
step starts no JVM. Gold tables are small: this is where a report belongs.
"""
# No ``from __future__ import annotations``: Dagster reads the annotations at runtime.

import pandas as pd
from dagster import AssetIn, AssetKey, Output, TableColumnDep, TableColumnLineage, asset

from medallion_assets.assets.checks import last_update_freshness_checks
from medallion_assets.io_manager import delta_table
from medallion_assets.pipelines.tpch.gold import GOLD_MAX_LAG_HOURS

PRICING_SUMMARY = AssetKey(["gold", "pricing_summary"])

PRICING_SUMMARY_REPORT_COLUMNS = {
    "l_returnflag": "Return flag of the group's line items (R, A or N).",
    "l_linestatus": "Line status of the group's line items (O open, F fulfilled).",
    "line_items": "Line items of the group shipped by 1998-09-02 (gold.pricing_summary's count_order).",
    "revenue": "The group's discounted revenue (gold.pricing_summary's sum_disc_price), rounded to cents.",
    "revenue_share": "The group's share of the discounted revenue of all groups, a fraction rounded to 6 places.",
}

PRICING_SUMMARY_REPORT_LINEAGE = {
    "l_returnflag": [TableColumnDep(PRICING_SUMMARY, "l_returnflag")],
    "l_linestatus": [TableColumnDep(PRICING_SUMMARY, "l_linestatus")],
    "line_items": [TableColumnDep(PRICING_SUMMARY, "count_order")],
    "revenue": [TableColumnDep(PRICING_SUMMARY, "sum_disc_price")],
    "revenue_share": [TableColumnDep(PRICING_SUMMARY, "sum_disc_price")],
}


def pricing_summary_shares(pricing_summary: pd.DataFrame) -> pd.DataFrame:
    """Each (return flag, line status) group's revenue and its share of all groups' revenue.

    Args:
        pricing_summary: ``gold.pricing_summary`` (TPC-H Q1), at least its flag,
            status, ``count_order`` and ``sum_disc_price`` columns.

    Returns:
        One row per group, sorted by flag and status; shares sum to 1 (to rounding).
    """
    # Decimals arrive as Python Decimal objects: float is exact enough for a share.
    revenue = pricing_summary["sum_disc_price"].astype("float64")
    total = revenue.sum()
    report = pd.DataFrame(
        {
            "l_returnflag": pricing_summary["l_returnflag"].astype(str),
            "l_linestatus": pricing_summary["l_linestatus"].astype(str),
            "line_items": pricing_summary["count_order"].astype("int64"),
            "revenue": revenue.round(2),
            "revenue_share": (revenue / total).round(6) if total else 0.0,
        }
    )
    return report.sort_values(["l_returnflag", "l_linestatus"], ignore_index=True)


@asset(
    key=["gold", "pricing_summary_report"],
    ins={
        "pricing_summary": AssetIn(
            key=PRICING_SUMMARY,
            metadata={"delta/columns": ["l_returnflag", "l_linestatus", "count_order", "sum_disc_price"]},
        )
    },
    group_name="gold",
    kinds={"pandas", "delta"},
    description="Share of discounted revenue per return flag and line status (TPC-H Q1), computed with pandas.",
    metadata=delta_table(column_descriptions=PRICING_SUMMARY_REPORT_COLUMNS),
)
def pricing_summary_report(pricing_summary: pd.DataFrame) -> Output[pd.DataFrame]:
    lineage = TableColumnLineage(deps_by_column=PRICING_SUMMARY_REPORT_LINEAGE)
    return Output(pricing_summary_shares(pricing_summary), metadata={"dagster/column_lineage": lineage})


# Dagster's own freshness check, as for the other gold tables.
report_checks = last_update_freshness_checks([pricing_summary_report], max_lag_hours=GOLD_MAX_LAG_HOURS)
