"""A failed ``expect_or_fail`` blocks: silver is not written, gold does not run, quarantine has the rows."""

from __future__ import annotations

import json

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize

from medallion_assets.assets import bronze, gold, silver
from medallion_assets.definitions import resources_for
from medallion_assets_tests.delta.readers import read_with_deltalake

pytestmark = pytest.mark.slow


def _event(key: int, total: str, event_id: str) -> str:
    item = {
        "l_linenumber": 1, "l_partkey": 1, "l_suppkey": 1, "l_quantity": "1", "l_extendedprice": "10.00",
        "l_discount": "0.05", "l_tax": "0.01", "l_returnflag": "N", "l_linestatus": "O",
        "l_shipdate": "1996-03-13", "l_commitdate": "1996-02-12", "l_receiptdate": "1996-03-22",
        "l_shipinstruct": "NONE", "l_shipmode": "TRUCK", "l_comment": "x",
    }
    order = {
        "o_orderkey": key, "o_custkey": 1, "o_orderstatus": "F", "o_totalprice": total,
        "o_orderdate": "1996-01-02", "o_orderpriority": "5-LOW", "o_clerk": "Clerk#000000951",
        "o_shippriority": 0, "o_comment": "c", "lineitems": [item],
    }
    return json.dumps({"event_id": event_id, "event_time": "1996-01-02T10:22:31Z", "op": "upsert", "order": order})


def test_failed_expectation_blocks_downstream_and_quarantines(spark, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    orders_dir = lake / "landing" / "orders"
    orders_dir.mkdir(parents=True)
    lines = [_event(1, "100.00", "e1"), _event(2, "-5.00", "e2"), _event(3, "7.50", "e3")]
    (orders_dir / "batch-00001-001.json").write_text("\n".join(lines) + "\n", encoding="utf-8")

    downstream = [gold.monthly_revenue, gold.pricing_summary, gold.forecasting_revenue_change]
    result = materialize(
        [bronze.orders_raw, silver.orders_and_lineitem, *downstream],
        resources=resources_for("local"),
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )

    # The blocking check failed with the bad row counted.
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "orders_total_price_non_negative"]
    assert not evaluation.passed
    assert evaluation.metadata["failing_rows"].value == 1
    assert evaluation.metadata["passing_rows"].value == 2

    # Nothing past the check was written or run.
    materialized = {e.asset_key for e in result.get_asset_materialization_events()}
    assert AssetKey(["quarantine", "orders"]) in materialized
    assert AssetKey(["bronze", "orders_raw"]) in materialized
    assert not {AssetKey(["silver", "orders"]), AssetKey(["silver", "lineitem"])} & materialized
    assert not {a.key for a in downstream} & materialized
    assert not (lake / "silver" / "orders").exists()
    assert not (lake / "gold").exists()
    started = {
        e.step_key for e in result.all_events if e.event_type == DagsterEventType.STEP_START and e.step_key
    }
    assert not {step for step in started if step.startswith("gold__")}, started

    # Quarantine holds the bad row with its reason.
    quarantine = read_with_deltalake(lake / "quarantine" / "orders").to_pylist()
    [bad] = [row for row in quarantine if "orders_total_price_non_negative" in row["reason"]]
    assert json.loads(bad["record"])["o_orderkey"] == 2
    assert "o_totalprice >= 0" in bad["reason"]
    assert bad["table_name"] == "orders"
    assert bad["_source_file"].endswith("batch-00001-001.json")
