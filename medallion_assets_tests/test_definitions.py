"""The Definitions load, validate, and wire one in-process executor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetKey, DefaultSensorStatus, Definitions
from deltalake import write_deltalake

from medallion_assets.definitions import build_definitions, resources_for
from medallion_assets.resources import LakeResource


def test_definitions_hold_layers_jobs_and_checks():
    defs = build_definitions("local")
    keys = {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"bronze/orders_raw", "silver/orders", "silver/lineitem", "silver/customers", "quarantine/orders"} <= keys
    assert {job.name for job in defs.jobs} >= {"ingest", "refresh", "table_maintenance"}
    gold = {
        "gold/pricing_summary",
        "gold/shipping_priority",
        "gold/local_supplier_volume",
        "gold/forecasting_revenue_change",
        "gold/daily_revenue",
        "gold/monthly_revenue",
        "gold/customer_lifetime_value",
        "gold/pricing_summary_report",
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
    assert {k.asset_key.to_user_string() for k in freshness} >= gold | {
        "silver/orders",
        "silver/lineitem",
        "silver/customers",
    }
    assert set(sensor.asset_selection.resolve_checks(defs.resolve_asset_graph())) == freshness
    refresh = defs.resolve_job_def("refresh")
    assert {"silver/orders", "gold/daily_revenue"} <= {
        k.to_user_string() for k in refresh.asset_layer.executable_asset_keys
    }


def test_every_delta_table_asset_shows_its_storage_kind():
    graph = build_definitions("local").resolve_asset_graph()
    without = sorted(
        key.to_user_string()
        for key in graph.materializable_asset_keys
        if key.path[0] != "landing" and "dagster/kind/delta" not in (graph.get(key).tags or {})
    )
    assert without == []


def test_the_simulator_is_in_no_job_and_can_be_left_out():
    simulated = "landing/simulated_batch"
    defs = build_definitions("local")
    assert simulated in {key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys()}
    for job in defs.jobs:
        selected = (
            {key.to_user_string() for key in defs.resolve_job_def(job.name).asset_layer.executable_asset_keys}
            if hasattr(job, "selection")
            else set()
        )
        assert simulated not in selected, f"job {job.name} runs the simulator"
    production = build_definitions("local", simulator=False)
    # Bronze still names the landing zone as its upstream: a key nothing can materialize.
    assert simulated not in {key.to_user_string() for key in production.resolve_asset_graph().materializable_asset_keys}
    assert {job.name for job in production.jobs} == {job.name for job in defs.jobs}


def test_kafka_feeds_are_left_out_without_a_broker(monkeypatch):
    from medallion_assets.definitions import defs

    def shown(d):
        graph = d.resolve_asset_graph()
        return (
            {k.to_user_string() for k in graph.get_all_asset_keys()},
            {s.name for s in d.sensors},
            {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys},
            {k.to_user_string() for k in graph.get(AssetKey(["silver", "orders"])).parent_keys},
        )

    assets, sensors, checks, order_inputs = shown(build_definitions("local", kafka=True))
    assets_without, sensors_without, checks_without, order_inputs_without = shown(
        build_definitions("local", kafka=False)
    )
    assert assets - assets_without == {"bronze/orders_kafka"} and assets_without < assets
    assert sensors - sensors_without == {"orders_kafka_checkpoint_sensor"} and sensors_without < sensors
    assert {asset for asset, _ in checks - checks_without} == {"bronze/orders_kafka"} and checks_without < checks
    # TPC-H's order step still loads, on the landed files alone.
    assert order_inputs == {"bronze/orders_raw", "bronze/orders_kafka"} and order_inputs_without == {
        "bronze/orders_raw"
    }
    # The loaded definitions take it from MEDALLION_KAFKA_BOOTSTRAP_SERVERS.
    monkeypatch.delenv("MEDALLION_KAFKA_BOOTSTRAP_SERVERS", raising=False)
    assert shown(defs())[0] == assets_without


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


def test_every_schedule_says_what_it_runs_and_when():
    from medallion_assets.jobs import schedules

    assert [schedule.name for schedule in schedules if not (schedule.description or "").strip()] == []


TEAM_FEED = """
from pyspark.sql.types import LongType, TimestampType

from medallion_assets.expectations import expect_or_drop
from medallion_assets.feeds import ApplyChanges, Feed, Field, LandingFiles

SUBSCRIPTIONS = Feed(
    name="subscriptions_raw",
    description="Subscription changes as CSV.",
    source=LandingFiles(folder="subscriptions", format="csv"),
    fields=(Field("key", description="The subscription."), Field("seats", LongType(), description="Seats."),
            Field("changed_at", TimestampType(), description="When it changed.")),
    silver=ApplyChanges(table="subscriptions", keys=("key",), sequence_by=("changed_at",)),
    expectations=(expect_or_drop("subscriptions_seats_positive", "seats > 0"),),
)
"""


def test_with_the_demo_off_the_definitions_hold_only_the_teams_feed(tmp_path, monkeypatch):
    from dagster import build_schedule_context

    from medallion_assets.check_gate import CheckGateUsageError, gate
    from medallion_assets.continuous import ContinuousStreamsConfig
    from medallion_assets.definitions import defs

    (tmp_path / "team_feeds").mkdir()
    (tmp_path / "team_feeds" / "__init__.py").write_text("")
    (tmp_path / "team_feeds" / "subscriptions.py").write_text(TEAM_FEED)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MEDALLION_DEMO", "off")
    monkeypatch.setenv("MEDALLION_PIPELINES", "team_feeds")
    for name in ("MEDALLION_SIMULATOR", "MEDALLION_KAFKA_BOOTSTRAP_SERVERS"):
        monkeypatch.delenv(name, raising=False)
    try:
        loaded = defs()
        Definitions.validate_loadable(loaded)
        repo = loaded.get_repository_def()
        graph = repo.asset_graph
        feed_assets = {"bronze/subscriptions_raw", "silver/subscriptions", "quarantine/subscriptions"}
        assert {k.to_user_string() for k in graph.get_all_asset_keys()} == feed_assets
        assert {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys} == {
            ("bronze/subscriptions_raw", "stream_health"),
            ("silver/subscriptions", "subscriptions_seats_positive"),
            ("silver/subscriptions", "subscriptions_key_unique"),
            ("silver/subscriptions", "subscriptions_rejected_rows"),
            ("silver/subscriptions", "freshness_check"),
        }
        assert {s.name for s in repo.sensor_defs} == {
            "subscriptions_raw_checkpoint_sensor",
            "landing_sensor",
            "freshness_checks_sensor",
        }

        # The jobs and schedules hold the team's assets and still run.
        def selected(job):
            return {k.to_user_string() for k in repo.get_job(job).asset_layer.executable_asset_keys}

        assert selected("ingest") == feed_assets
        assert selected("refresh") == feed_assets - {"bronze/subscriptions_raw"}
        assert {s.name for s in repo.schedule_defs} == {"ingest_hourly", "refresh_daily", "maintenance_weekly"}
        # The daily refresh asks the lake: bronze has a table silver has not taken in.
        refreshed = tmp_path / "refresh-lake"
        write_deltalake(str(refreshed / "bronze" / "subscriptions_raw"), pa.table({"value": ["x"]}))
        lake = LakeResource(root=str(refreshed))
        with build_schedule_context(repository_def=repo, resources={"lake": lake}) as context:
            assert repo.get_schedule_def("refresh_daily").evaluate_tick(context).run_requests
        assert ContinuousStreamsConfig().streams == ["subscriptions_raw"]
        # Built directly, the simulator follows the pipelines that offer a producer (TPC-H's), and is refused without.
        direct = build_definitions("local", pipelines=("team_feeds",)).resolve_asset_graph()
        assert {k.to_user_string() for k in direct.get_all_asset_keys()} == feed_assets
        with pytest.raises(ValueError, match="none of the pipelines team_feeds does: pass simulator=False"):
            build_definitions("local", simulator=True, pipelines=("team_feeds",))
        # The check gate's default sample is TPC-H's: without the demo it asks for the team's landing.
        with pytest.raises(CheckGateUsageError, match="MEDALLION_DEMO=off .* give --landing DIR"):
            gate(lake_root=tmp_path / "lake")
        assert not (tmp_path / "lake").exists()
    finally:
        for name in [m for m in sys.modules if m == "team_feeds" or m.startswith("team_feeds.")]:
            del sys.modules[name]
