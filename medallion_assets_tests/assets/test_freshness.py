"""The freshness checks, evaluated for real by Dagster on an ephemeral instance.

A plain Python asset stands in for a silver table (same key, no Spark): the
checks read only the instance's event log, not the table.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetObservation,
    AssetSelection,
    DagsterInstance,
    MetadataValue,
    asset,
    build_last_update_freshness_checks,
    build_sensor_context,
    build_sensor_for_freshness_checks,
    materialize,
)

from medallion_assets.assets.checks import SILVER_MAX_LAG_HOURS, freshness_checks_among
from medallion_assets.pipelines.tpch.silver import tpch_silver_checks

silver_freshness_checks = freshness_checks_among(tpch_silver_checks)
ORDERS = AssetKey(["silver", "orders"])


@asset(key=ORDERS)
def orders_stand_in() -> int:
    return 1


def run_checks(checks, instance):
    """Execute only ``checks`` (no materialization) and return their evaluations by asset."""
    result = materialize([orders_stand_in, *checks], instance=instance, selection=AssetSelection.checks(*checks))
    assert result.success
    assert not result.get_asset_materialization_events()
    return {e.asset_key: e for e in result.get_asset_check_evaluations()}


def test_silver_freshness_check_passes_right_after_a_materialization():
    with DagsterInstance.ephemeral() as instance:
        assert materialize([orders_stand_in], instance=instance).success
        evaluation = run_checks(silver_freshness_checks, instance)[ORDERS]
        assert evaluation.check_name == "freshness_check"
        assert evaluation.passed
        assert evaluation.severity == AssetCheckSeverity.WARN
        # Fresh until the last update plus the 26 h limit: what the sensor waits for.
        fresh_until = evaluation.metadata["dagster/fresh_until_timestamp"].value
        last_update = evaluation.metadata["dagster/last_updated_timestamp"].value
        assert fresh_until - last_update == pytest.approx(SILVER_MAX_LAG_HOURS * 3600)


def test_freshness_check_warns_once_the_last_update_is_older_than_the_limit():
    # The project's own check, with a last update reported 27 h ago (an observation
    # carrying Dagster's last-updated timestamp, as an external table would report it).
    with DagsterInstance.ephemeral() as instance:
        instance.report_runless_asset_event(
            AssetObservation(
                asset_key=ORDERS,
                metadata={"dagster/last_updated_timestamp": MetadataValue.timestamp(time.time() - 27 * 3600)},
            )
        )
        evaluation = run_checks(silver_freshness_checks, instance)[ORDERS]
        assert not evaluation.passed
        assert evaluation.severity == AssetCheckSeverity.WARN

    # A real materialization that ages past a tiny limit.
    tiny = build_last_update_freshness_checks(assets=[orders_stand_in], lower_bound_delta=timedelta(seconds=1))
    with DagsterInstance.ephemeral() as instance:
        assert materialize([orders_stand_in], instance=instance).success
        time.sleep(1.5)
        evaluation = run_checks(tiny, instance)[ORDERS]
        assert not evaluation.passed
        assert evaluation.severity == AssetCheckSeverity.WARN
        assert "overdue" in evaluation.description


def test_freshness_sensor_requests_a_check_only_when_it_could_be_overdue():
    sensor = build_sensor_for_freshness_checks(freshness_checks=silver_freshness_checks)
    with DagsterInstance.ephemeral() as instance:
        assert materialize([orders_stand_in], instance=instance).success
        # Never evaluated: the sensor asks for every check.
        request = sensor(build_sensor_context(instance=instance))
        assert ORDERS in {key.asset_key for key in request.asset_check_keys}
        # Evaluated and fresh for another 26 h: nothing to do for orders.
        run_checks(silver_freshness_checks, instance)
        request = sensor(build_sensor_context(instance=instance))
        asked = {key.asset_key for key in getattr(request, "asset_check_keys", None) or []}
        assert ORDERS not in asked
