"""The one Definitions object of the project.

Built lazily (Dagster's ``@definitions``), so importing this module reads no
environment and starts nothing. ``MEDALLION_DEPLOYMENT`` picks the resources:
``local`` (default: embedded ``local[*]`` Spark), ``cluster`` (master from
``SPARK_MASTER_URL``) or ``connect`` (Spark Connect at ``SPARK_REMOTE``); the
asset code is the same in all three. ``MEDALLION_DELTA_ENGINE``,
``DELTA_SPARK_JARS`` and ``MEDALLION_DELTA_SPARK_MAVEN`` choose the Delta engine
(:mod:`medallion_assets.engine`). ``MEDALLION_SIMULATOR=off`` leaves the demo
feed (``landing/simulated_batch``) out.
"""

from __future__ import annotations

import os
from typing import Any

from dagster import (
    Definitions,
    build_sensor_for_freshness_checks,
    definitions,
    in_process_executor,
    load_asset_checks_from_modules,
    load_assets_from_modules,
)

from medallion_assets.assets import landing
from medallion_assets.io_manager import DeltaIOManager
from medallion_assets.jobs import jobs, schedules
from medallion_assets.resources import kafka_resource, lake_resource, spark_resource


def resources_for(deployment: str) -> dict[str, Any]:
    """Every resource the assets need, for one deployment."""
    spark = spark_resource(deployment)
    lake = lake_resource()
    return {"spark": spark, "lake": lake, "kafka": kafka_resource(), "io_manager": DeltaIOManager(spark=spark, lake=lake)}


def build_definitions(deployment: str = "local", *, simulator: bool = True) -> Definitions:
    """The project's Definitions for ``deployment``.

    Bronze, silver, quarantine, their checks and the stream sensors are built
    from the feeds declared in :mod:`medallion_assets.pipelines`; the
    pipelines' own assets and checks (gold, TPC-H's order step) are loaded
    from the same modules.

    Args:
        deployment: ``local``, ``cluster`` or ``connect`` (:func:`resources_for`).
        simulator: include ``landing/simulated_batch``, the demo feed, upstream of
            the feeds it lands. No job or schedule selects it; a deployment with
            a real landing zone leaves it out, and then nothing shows it.
    """
    from medallion_assets.assets.bronze import bronze_assets
    from medallion_assets.assets.checks import feed_checks, freshness_checks_among
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.continuous import bronze_streams_continuous
    from medallion_assets.feeds import pipeline_modules, project_feeds
    from medallion_assets.jobs import ingest_job
    from medallion_assets.sensors import build_landing_sensor, stream_health_checks, stream_sensors

    feeds = project_feeds()
    modules = list(pipeline_modules())
    landed_by = {name: [landing.simulated_batch.key] for name in landing.simulated_feeds()} if simulator else {}
    assets = [
        *([landing.simulated_batch] if simulator else []),
        *bronze_assets(feeds, landed_by=landed_by),
        *silver_assets(feeds),
        *load_assets_from_modules(modules),
    ]
    checks = [
        *feed_checks(feeds), *load_asset_checks_from_modules(modules), *stream_health_checks(feeds),
    ]
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[*jobs, bronze_streams_continuous],
        schedules=schedules,
        # Continuous mode: checkpoint sensors follow the streams; triggered mode: the landing sensor.
        # The freshness sensor runs the freshness checks once one could be overdue, so a
        # table that stops being updated gets a failed (WARN) check without a run of it.
        sensors=[
            *stream_sensors(feeds),
            build_landing_sensor(ingest_job, feeds=feeds),
            build_sensor_for_freshness_checks(freshness_checks=freshness_checks_among(checks)),
        ],
        resources=resources_for(deployment),
        # One process for the whole run: every asset shares one SparkSession (one JVM)
        # instead of a JVM per asset, which is what the multiprocess executor would cost.
        executor=in_process_executor,
    )


@definitions
def defs() -> Definitions:
    """Loaded by ``dagster dev`` / ``dagster definitions validate``."""
    simulator = os.environ.get("MEDALLION_SIMULATOR", "on").strip().lower() not in ("0", "off", "false", "no")
    return build_definitions(os.environ.get("MEDALLION_DEPLOYMENT", "local"), simulator=simulator)
