"""Gold's reconciliation with silver finds a gold table that is off, by DataFusion and by Spark SQL.

The silver tables are written by ``write_deltalake``; the right gold rows
(revenue per order date) are computed by DuckDB from the same Arrow rows, then
one day's revenue is moved by a cent and a day silver does not have is added.
The reconciliation runs as a Dagster check through the IO manager, as in the
pipeline: DataFusion over delta-rs' read, and Spark SQL when DataFusion's
memory bound is too small.
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
from medallion_assets.pipelines.tpch.gold import DAILY_REVENUE_RECONCILIATION, reconcile
from medallion_assets.resources import LakeResource, SparkResource

PRICE = pa.decimal128(15, 2)


def _silver_rows() -> dict[str, pa.Table]:
    days = [dt.date(1995, 1, 1) + dt.timedelta(days=i % 3) for i in range(8)]
    return {
        # Customer 4 is not in silver: its order's revenue is no day's.
        "orders": pa.table({"o_orderkey": pa.array(range(1, 9), pa.int64()),
                            "o_custkey": pa.array([1, 2, 3, 1, 2, 3, 1, 4], pa.int64()),
                            "o_orderdate": pa.array(days, pa.date32())}),
        "lineitem": pa.table({"l_orderkey": pa.array([1, 1, 2, 3, 4, 5, 5, 6, 7, 8], pa.int64()),
                              "l_extendedprice": pa.array([Decimal(f"{100 + 7 * i}.{i:02d}") for i in range(10)], PRICE),
                              "l_discount": pa.array([Decimal(f"0.0{i % 10}") for i in range(10)], PRICE)}),
        "customers": pa.table({"c_custkey": pa.array([1, 2, 3], pa.int64())}),
    }


def _gold_by_duckdb(silver: dict[str, pa.Table]) -> pa.Table:
    orders, lineitem, customers = silver["orders"], silver["lineitem"], silver["customers"]  # noqa: F841 (DuckDB reads them)
    return duckdb.sql(
        "SELECT o_orderdate, 'ANY' AS c_mktsegment, sum(l_extendedprice * (1 - l_discount)) AS revenue "
        "FROM orders JOIN lineitem ON l_orderkey = o_orderkey JOIN customers ON c_custkey = o_custkey "
        "GROUP BY o_orderdate ORDER BY o_orderdate"
    ).fetch_arrow_table()


def _off_by_a_cent_and_a_day(gold: pa.Table) -> pa.Table:
    rows = gold.to_pylist()
    rows[0]["revenue"] += Decimal("0.01")
    rows.append({"o_orderdate": dt.date(2001, 1, 1), "c_mktsegment": "ANY", "revenue": Decimal("5.00")})
    return pa.Table.from_pylist(rows, schema=gold.schema)


@pytest.mark.parametrize("datafusion_memory_bytes, way",
                         [(table_checks.DATAFUSION_MEMORY_BYTES, "DataFusion"), (1_024, "Spark")])
@pytest.mark.parametrize("gold_is_off", [False, True])
def test_reconciliation_counts_the_days_gold_gets_wrong(spark, tmp_path, monkeypatch, datafusion_memory_bytes, way,
                                                        gold_is_off):
    silver = _silver_rows()
    for name, rows in silver.items():
        write_deltalake(str(tmp_path / "silver" / name), rows)
    right = _gold_by_duckdb(silver)
    gold_rows = _off_by_a_cent_and_a_day(right) if gold_is_off else right
    monkeypatch.setattr(table_checks, "DATAFUSION_MEMORY_BYTES", datafusion_memory_bytes)
    # The check hangs on silver.orders here, where the pipeline's hangs on its gold table.
    checked = AssetKey(["silver", "orders"])

    @asset_check(asset=["silver", "orders"], name="revenue_reconciles_with_silver",
                 additional_ins={"lineitem": AssetIn(key=["silver", "lineitem"]),
                                 "customer": AssetIn(key=["silver", "customers"])})
    def _reconciles(context, orders: TableRead, lineitem: TableRead, customer: TableRead):
        gold = spark.createDataFrame(gold_rows.to_pandas(), schema="o_orderdate date, c_mktsegment string, revenue decimal(38,4)")
        return reconcile(context, gold, {"orders": orders, "lineitem": lineitem, "customer": customer},
                         DAILY_REVENUE_RECONCILIATION, check_name="revenue_reconciles_with_silver", asset_key=checked)

    lake = LakeResource(root=str(tmp_path))
    resource = SparkResource(master="local[1]")
    result = materialize(
        [*(AssetSpec(["silver", name]) for name in silver), _reconciles],
        selection=AssetSelection.all_asset_checks(),
        resources={"spark": resource, "lake": lake, "io_manager": DeltaIOManager(spark=resource, lake=lake)},
        instance=DagsterInstance.ephemeral(),
    )
    [evaluation] = result.get_asset_check_evaluations()
    metadata = {name: value.value for name, value in evaluation.metadata.items()}
    assert metadata[COMPUTED_WITH] == way
    silver_total = sum(right.column("revenue").to_pylist())
    gold_total = sum(gold_rows.column("revenue").to_pylist())
    assert Decimal(metadata["silver_total_revenue"]) == silver_total
    assert Decimal(metadata["gold_total_revenue"]) == gold_total
    if gold_is_off:
        # The day a cent off, and the day silver has no order of.
        assert not evaluation.passed
        assert (metadata["passing_rows"], metadata["failing_rows"]) == (right.num_rows - 1, 2)
    else:
        assert evaluation.passed
        assert (metadata["passing_rows"], metadata["failing_rows"]) == (right.num_rows, 0)
