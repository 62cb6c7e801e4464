"""A failed ``expect_or_fail`` blocks: silver is not written, gold does not run, quarantine has the rows."""

from __future__ import annotations

import json

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize

from medallion_assets.assets import bronze, gold, silver
from medallion_assets.definitions import resources_for
from medallion_assets_tests.delta.readers import read_with_deltalake
from medallion_assets_tests.order_events import order_event_line

pytestmark = [pytest.mark.slow, pytest.mark.both_engines]


def test_failed_expectation_blocks_downstream_and_quarantines(spark, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    orders_dir = lake / "landing" / "orders"
    orders_dir.mkdir(parents=True)
    lines = [order_event_line(1, "e1", total="100.00"), order_event_line(2, "e2", total="-5.00"),
             order_event_line(3, "e3", total="7.50")]
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
