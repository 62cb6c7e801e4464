"""The Definitions load, validate, and wire one in-process executor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DefaultSensorStatus

from medallion_assets.definitions import build_definitions, resources_for


def test_definitions_hold_layers_jobs_and_checks():
    defs = build_definitions("local")
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"bronze/orders_raw", "silver/orders", "silver/lineitem", "silver/customers", "quarantine/orders"} <= keys
    assert {job.name for job in defs.jobs} >= {"ingest", "refresh", "table_maintenance"}
    gold = {
        "gold/pricing_summary", "gold/shipping_priority", "gold/local_supplier_volume",
        "gold/forecasting_revenue_change", "gold/daily_revenue", "gold/monthly_revenue", "gold/customer_lifetime_value",
    }
    assert gold <= keys
    checks = {(k.asset_key.to_user_string(), k.name) for k in defs.resolve_asset_graph().asset_check_keys}
    assert {
        ("silver/orders", "orders_key_unique"),
        ("silver/lineitem", "lineitem_references_orders"),
        ("silver/orders", "orders_references_customers"),
        ("silver/customers", "customers_references_nation"),
        ("gold/monthly_revenue", "revenue_reconciles_with_silver"),
        ("gold/daily_revenue", "freshness_check"),
        ("silver/orders", "freshness_check"),
        ("silver/orders", "orders_key_present"),
    } <= checks
    # Every freshness check is evaluated by the freshness sensor, off by default like the others.
    sensor = defs.resolve_sensor_def("freshness_checks_sensor")
    assert sensor.default_status == DefaultSensorStatus.STOPPED
    freshness = {k for k in defs.resolve_asset_graph().asset_check_keys if k.name == "freshness_check"}
    assert {k.asset_key.to_user_string() for k in freshness} >= gold | {"silver/orders", "silver/lineitem", "silver/customers"}
    assert set(sensor.asset_selection.resolve_checks(defs.resolve_asset_graph())) == freshness
    refresh = defs.resolve_job_def("refresh")
    assert {"silver/orders", "gold/daily_revenue"} <= {k.to_user_string() for k in refresh.asset_layer.executable_asset_keys}


def test_every_delta_table_asset_shows_its_storage_kind():
    graph = build_definitions("local").resolve_asset_graph()
    without = sorted(
        key.to_user_string() for key in graph.materializable_asset_keys
        if key.path[0] != "landing" and "dagster/kind/delta" not in (graph.get(key).tags or {})
    )
    assert without == []


def test_the_simulator_is_in_no_job_and_can_be_left_out():
    simulated = "landing/simulated_batch"
    defs = build_definitions("local")
    assert simulated in {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    for job in defs.jobs:
        selected = {key.to_user_string() for key in defs.resolve_job_def(job.name).asset_layer.executable_asset_keys} if hasattr(job, "selection") else set()
        assert simulated not in selected, f"job {job.name} runs the simulator"
    production = build_definitions("local", simulator=False)
    # Bronze still names the landing zone as its upstream: a key nothing can materialize.
    assert simulated not in {key.to_user_string() for key in production.resolve_asset_graph().materializable_asset_keys}
    assert {job.name for job in production.jobs} == {job.name for job in defs.jobs}


def test_unknown_deployment_is_refused():
    with pytest.raises(ValueError):
        resources_for("mainframe")


def test_dagster_definitions_validate_passes(tmp_path):
    project = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [str(Path(sys.executable).with_name("dagster")), "definitions", "validate"],
        cwd=project,
        env={"PATH": str(Path(sys.executable).parent), "DAGSTER_HOME": str(tmp_path), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
