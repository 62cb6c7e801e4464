"""Gold's reconciliation with silver finds a gold table that is off, by DataFusion and by Spark SQL.

The silver tables are written by ``write_deltalake``; the right gold rows are
computed by DuckDB from the same Arrow rows, then made wrong in two rows:
``daily_revenue`` has one day's revenue moved by a cent and a day silver does
not have; ``customer_lifetime_value`` (two values compared) has one customer's
order count one too high and another customer missing. The reconciliation
runs as a Dagster check through the IO manager, as in the pipeline:
DataFusion over delta-rs' read, and Spark SQL when DataFusion's memory bound
is too small or gold has more rows than a step may hold as Arrow.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import duckdb
import pyarrow as pa
import pytest
from dagster import AssetIn, AssetKey, AssetSelection, AssetSpec, DagsterInstance, asset_check, materialize
from deltalake import write_deltalake

from medallion_assets.assets import checks as table_checks
from medallion_assets.assets.checks import COMPUTED_WITH
from medallion_assets.io_manager import DeltaIOManager, TableRead
from medallion_assets.io_manager.table_read import ARROW_READ_MAX_ROWS
from medallion_assets.pipelines.tpch.gold import (
    CUSTOMER_LIFETIME_VALUE_RECONCILIATION,
    DAILY_REVENUE_RECONCILIATION,
    reconcile,
)
from medallion_assets.resources import LakeResource, SparkResource

PRICE = pa.decimal128(15, 2)


def _silver_rows() -> dict[str, pa.Table]:
    days = [dt.date(1995, 1, 1) + dt.timedelta(days=i % 3) for i in range(8)]
    return {
        # Customer 4 is not in silver: its order's revenue is no day's.
        "orders": pa.table(
            {
                "o_orderkey": pa.array(range(1, 9), pa.int64()),
                "o_custkey": pa.array([1, 2, 3, 1, 2, 3, 1, 4], pa.int64()),
                "o_orderdate": pa.array(days, pa.date32()),
                "o_totalprice": pa.array([Decimal(f"{50 + 11 * i}.{i:02d}") for i in range(8)], PRICE),
            }
        ),
        "lineitem": pa.table(
            {
                "l_orderkey": pa.array([1, 1, 2, 3, 4, 5, 5, 6, 7, 8], pa.int64()),
                "l_extendedprice": pa.array([Decimal(f"{100 + 7 * i}.{i:02d}") for i in range(10)], PRICE),
                "l_discount": pa.array([Decimal(f"0.0{i % 10}") for i in range(10)], PRICE),
            }
        ),
        # Customer 5 has no order: 0 spent in 0 orders.
        "customers": pa.table({"c_custkey": pa.array([1, 2, 3, 5], pa.int64())}),
    }


def _daily_revenue_by_duckdb(orders: pa.Table, lineitem: pa.Table, customers: pa.Table) -> pa.Table:
    return duckdb.sql(
        "SELECT o_orderdate, 'ANY' AS c_mktsegment, sum(l_extendedprice * (1 - l_discount)) AS revenue "
        "FROM orders JOIN lineitem ON l_orderkey = o_orderkey JOIN customers ON c_custkey = o_custkey "
        "GROUP BY o_orderdate ORDER BY o_orderdate"
    ).fetch_arrow_table()


def _a_cent_and_a_day_off(gold: pa.Table) -> pa.Table:
    rows = gold.to_pylist()
    rows[0]["revenue"] += Decimal("0.01")
    rows.append({"o_orderdate": dt.date(2001, 1, 1), "c_mktsegment": "ANY", "revenue": Decimal("5.00")})
    return pa.Table.from_pylist(rows, schema=gold.schema)


def _lifetime_value_by_duckdb(orders: pa.Table, lineitem: pa.Table, customers: pa.Table) -> pa.Table:
    return duckdb.sql(
        "SELECT c_custkey, coalesce(sum(o_totalprice), 0) AS total_spend, count(o_orderkey) AS order_count "
        "FROM customers LEFT JOIN orders ON o_custkey = c_custkey GROUP BY c_custkey ORDER BY c_custkey"
    ).fetch_arrow_table()


def _an_order_too_many_and_a_customer_missing(gold: pa.Table) -> pa.Table:
    rows = gold.to_pylist()
    rows[0]["order_count"] += 1
    return pa.Table.from_pylist(rows[:-1], schema=gold.schema)


#: Each gold table: its reconciliation, the Spark schema of its rows, DuckDB's rows, and a wrong copy.
GOLD_TABLES = {
    "daily_revenue": (
        DAILY_REVENUE_RECONCILIATION,
        "o_orderdate date, c_mktsegment string, revenue decimal(38,4)",
        _daily_revenue_by_duckdb,
        _a_cent_and_a_day_off,
        "revenue",
    ),
    "customer_lifetime_value": (
        CUSTOMER_LIFETIME_VALUE_RECONCILIATION,
        "c_custkey long, total_spend decimal(25,2), order_count long",
        _lifetime_value_by_duckdb,
        _an_order_too_many_and_a_customer_missing,
        "total_spend",
    ),
}


@pytest.mark.parametrize(
    "datafusion_memory_bytes, arrow_read_max_rows, way",
    [
        (table_checks.DATAFUSION_MEMORY_BYTES, ARROW_READ_MAX_ROWS, "DataFusion"),
        (1_024, ARROW_READ_MAX_ROWS, "Spark"),
        # Gold has 3 or 4 rows: more than a step may hold as Arrow, so Spark SQL reconciles, memory or not.
        (table_checks.DATAFUSION_MEMORY_BYTES, 2, "Spark"),
    ],
)
@pytest.mark.parametrize("gold_is_off", [False, True])
@pytest.mark.parametrize("table", list(GOLD_TABLES))
def test_reconciliation_counts_the_rows_gold_gets_wrong(
    spark, tmp_path, monkeypatch, datafusion_memory_bytes, arrow_read_max_rows, way, gold_is_off, table
):
    reconciliation, schema, by_duckdb, made_wrong, summed = GOLD_TABLES[table]
    silver = _silver_rows()
    for name, rows in silver.items():
        write_deltalake(str(tmp_path / "silver" / name), rows)
    right = by_duckdb(**silver)
    gold_rows = made_wrong(right) if gold_is_off else right
    monkeypatch.setattr(table_checks, "DATAFUSION_MEMORY_BYTES", datafusion_memory_bytes)
    # The check hangs on silver.orders here, where the pipeline's hangs on its gold table.
    checked = AssetKey(["silver", "orders"])

    @asset_check(
        asset=["silver", "orders"],
        name="revenue_reconciles_with_silver",
        additional_ins={
            "lineitem": AssetIn(key=["silver", "lineitem"]),
            "customer": AssetIn(key=["silver", "customers"]),
        },
    )
    def _reconciles(context, orders: TableRead, lineitem: TableRead, customer: TableRead):
        gold = spark.createDataFrame(gold_rows.to_pandas(), schema=schema)
        return reconcile(
            context,
            gold,
            {"orders": orders, "lineitem": lineitem, "customer": customer},
            reconciliation,
            check_name="revenue_reconciles_with_silver",
            asset_key=checked,
        )

    lake = LakeResource(root=str(tmp_path))
    resource = SparkResource(master="local[1]")
    result = materialize(
        [*(AssetSpec(["silver", name]) for name in silver), _reconciles],
        selection=AssetSelection.all_asset_checks(),
        resources={
            "spark": resource,
            "lake": lake,
            "io_manager": DeltaIOManager(spark=resource, lake=lake, arrow_read_max_rows=arrow_read_max_rows),
        },
        instance=DagsterInstance.ephemeral(),
    )
    [evaluation] = result.get_asset_check_evaluations()
    metadata = {name: value.value for name, value in evaluation.metadata.items()}
    assert metadata[COMPUTED_WITH] == way
    assert Decimal(metadata[f"silver_total_{summed}"]) == sum(right.column(summed).to_pylist())
    assert Decimal(metadata[f"gold_total_{summed}"]) == sum(gold_rows.column(summed).to_pylist())
    compared = {tuple(row[k] for k in reconciliation.keys) for row in [*right.to_pylist(), *gold_rows.to_pylist()]}
    if gold_is_off:
        # Two rows wrong: a value off, and a key on one side only.
        assert not evaluation.passed
        assert (metadata["passing_rows"], metadata["failing_rows"]) == (len(compared) - 2, 2)
    else:
        assert evaluation.passed
        assert (metadata["passing_rows"], metadata["failing_rows"]) == (right.num_rows, 0)
