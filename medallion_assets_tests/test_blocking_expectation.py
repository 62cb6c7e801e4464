"""A failed ``expect_or_fail`` blocks: silver is not written, gold does not run, quarantine has the rows."""

from __future__ import annotations

import json

import pytest
from dagster import AssetKey, DagsterEventType, DagsterInstance, materialize

from medallion_assets.definitions import resources_for
from medallion_assets.pipelines.tpch import gold, silver
from medallion_assets_tests.support import tpch_assets as bronze
from medallion_assets_tests.support.order_events import order_event_line
from medallion_assets_tests.support.readers import read_with_deltalake

pytestmark = [pytest.mark.slow, pytest.mark.both_engines]


def test_failed_expectation_blocks_downstream_and_quarantines(spark, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    orders_dir = lake / "landing" / "orders"
    orders_dir.mkdir(parents=True)
    lines = [
        order_event_line(1, "e1", total="100.00"),
        order_event_line(2, "e2", total="-5.00"),
        order_event_line(3, "e3", total="7.50"),
    ]
    (orders_dir / "batch-00001-001.json").write_text("\n".join(lines) + "\n", encoding="utf-8")

    downstream = [gold.monthly_revenue, gold.pricing_summary, gold.forecasting_revenue_change]
    instance = DagsterInstance.ephemeral()
    result = materialize(
        [bronze.orders_raw, bronze.orders_kafka, silver.orders_and_lineitem, *downstream],
        resources=resources_for("local"),
        instance=instance,
        raise_on_error=False,
    )

    # The blocking check failed with the bad row counted.
    [evaluation] = [
        e for e in result.get_asset_check_evaluations() if e.check_name == "orders_total_price_non_negative"
    ]
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
    started = {e.step_key for e in result.all_events if e.event_type == DagsterEventType.STEP_START and e.step_key}
    assert not {step for step in started if step.startswith("gold__")}, started

    # Quarantine holds the bad row with its reason.
    quarantine = read_with_deltalake(lake / "quarantine" / "orders").to_pylist()
    [bad] = [row for row in quarantine if "orders_total_price_non_negative" in row["reason"]]
    assert json.loads(bad["record"])["o_orderkey"] == 2
    assert "o_totalprice >= 0" in bad["reason"]
    assert bad["table_name"] == "orders"
    assert bad["_source_file"].endswith("batch-00001-001.json")

    # The producer corrects order 2. The blocked increment was not consumed (only
    # quarantine was written): the next run reads it again with the correction,
    # so orders 1 and 3 reach silver too.
    correction = order_event_line(2, "e4", event_time="1996-01-03T08:00:00Z", total="5.00")
    (orders_dir / "batch-00002-001.json").write_text(correction + "\n", encoding="utf-8")
    second = materialize(
        [bronze.orders_raw, bronze.orders_kafka, silver.orders_and_lineitem],
        resources=resources_for("local"),
        instance=instance,
    )
    assert second.success
    orders = read_with_deltalake(lake / "silver" / "orders").to_pylist()
    assert sorted((row["o_orderkey"], str(row["o_totalprice"])) for row in orders) == [
        (1, "100.00"),
        (2, "5.00"),
        (3, "7.50"),
    ]
