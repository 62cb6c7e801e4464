"""The one Definitions object of the project.

Built lazily (Dagster's ``@definitions``), so importing this module reads no
environment and starts nothing. ``MEDALLION_DEPLOYMENT`` picks the resources:
``local`` (default: embedded ``local[*]`` Spark), ``cluster`` (master from
``SPARK_MASTER_URL``) or ``connect`` (Spark Connect at ``SPARK_REMOTE``); the
asset code is the same in all three. ``MEDALLION_DELTA_ENGINE``,
``DELTA_SPARK_JARS`` and ``MEDALLION_DELTA_SPARK_MAVEN`` choose the Delta engine
(:mod:`medallion_assets.storage.session`). ``MEDALLION_SIMULATOR=off`` leaves the demo
feed (``landing/simulated_batch``) out; ``MEDALLION_DEMO=off`` leaves out the
project's own pipelines too (TPC-H), so only the ``MEDALLION_PIPELINES``
packages' feeds and assets are there. Without
``MEDALLION_KAFKA_BOOTSTRAP_SERVERS`` the feeds read from Kafka are left out too
(their bronze asset, checkpoint sensor and ``stream_health`` check; a pipeline
step that also reads them loads in its variant without them), and one INFO
line at load says so.

Every environment variable is checked when the definitions load, before
anything starts (:mod:`medallion_assets.settings`): a wrong value stops the
load with one line naming the variable, its value and the fix
(docs/settings.md lists them all).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetKey,
    AssetsDefinition,
    Definitions,
    definitions,
    get_dagster_logger,
    in_process_executor,
    load_asset_checks_from_modules,
    load_assets_from_modules,
)

from medallion_assets.assets import landing
from medallion_assets.io_manager import DeltaIOManager
from medallion_assets.jobs import jobs, schedules
from medallion_assets.resources import io_manager_settings, kafka_resource, lake_resource, spark_resource

# Dagster's logger: its handler shows INFO in `dagster dev` and `dagster definitions validate`.
log = get_dagster_logger("medallion_assets.definitions")

#: The function a pipeline module defines when one of its assets reads a feed the
#: definitions may leave out: ``assets_without(left_out: frozenset[AssetKey])``
#: returns that module's replacements for its assets reading those bronze tables.
VARIANT_HOOK = "assets_without"


def resources_for(deployment: str) -> dict[str, Any]:
    """Every resource the assets need, for one deployment."""
    spark = spark_resource(deployment)
    lake = lake_resource()
    io_manager = DeltaIOManager(spark=spark, lake=lake, **io_manager_settings())
    return {"spark": spark, "lake": lake, "kafka": kafka_resource(), "io_manager": io_manager}


def build_definitions(
    deployment: str = "local",
    *,
    simulator: bool | None = None,
    kafka: bool = True,
    pipelines: Sequence[str] | None = None,
) -> Definitions:
    """The project's Definitions for ``deployment``.

    Bronze, silver, quarantine, their checks and the stream sensors are built
    from the feeds declared in the pipeline packages (Python modules and
    ``defs.yaml`` feed components); the pipelines' own assets and checks (gold,
    TPC-H's order step) are loaded from the same modules. The jobs and
    schedules select by asset group, so they hold whatever feeds are there.

    Args:
        deployment: ``local``, ``cluster`` or ``connect`` (:func:`resources_for`).
        simulator: include ``landing/simulated_batch``, the demo feed, upstream of
            the feeds it lands. No job or schedule selects it; a deployment with
            a real landing zone leaves it out, and then nothing shows it.
            ``None`` (the default): included when TPC-H's pipelines are.
        kafka: include the feeds read from Kafka (``KafkaTopic``): their bronze
            asset, checkpoint sensor and ``stream_health`` check. Without them a
            pipeline asset that reads their bronze table is swapped for its
            module's variant (:data:`VARIANT_HOOK`); a module without one keeps
            the Kafka feed it reads. ``defs()`` sets it from
            ``MEDALLION_KAFKA_BOOTSTRAP_SERVERS``.
        pipelines: the pipeline packages (default: the environment's,
            :func:`~medallion_assets.settings.pipeline_packages`). Without
            ``medallion_assets.pipelines`` (``MEDALLION_DEMO=off``) TPC-H is left
            out, and with it the simulator, which lands TPC-H's files.

    Raises:
        ValueError: ``simulator`` without the project's own pipelines.
    """
    from medallion_assets.assets.bronze import bronze_assets
    from medallion_assets.assets.checks import feed_checks, freshness_sensor
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.continuous import bronze_streams_continuous
    from medallion_assets.feeds import KafkaTopic, pipeline_modules, project_feeds
    from medallion_assets.jobs import ingest_job
    from medallion_assets.sensors import build_landing_sensor, stream_health_checks, stream_sensors
    from medallion_assets.settings import PROJECT_PIPELINES, pipeline_packages

    packages = tuple(pipeline_packages() if pipelines is None else pipelines)
    if simulator is None:
        simulator = PROJECT_PIPELINES in packages
    if simulator and PROJECT_PIPELINES not in packages:
        raise ValueError(
            f"the simulator lands TPC-H's files, and the pipelines {', '.join(packages) or '(none)'} "
            f"leave out {PROJECT_PIPELINES}, whose feeds read them: pass simulator=False"
        )
    modules = list(pipeline_modules(packages))
    declared = project_feeds(packages)
    left_out = {} if kafka else {f.bronze_key: f.name for f in declared if isinstance(f.source, KafkaTopic)}
    pipeline_assets = _pipeline_assets(modules, left_out)
    feeds = tuple(f for f in declared if f.bronze_key not in left_out)
    if left_out:
        _say_once(
            f"Kafka feeds left out: {', '.join(left_out.values())} "
            "(set MEDALLION_KAFKA_BOOTSTRAP_SERVERS to include them)"
        )
    landed_by = {name: [landing.simulated_batch.key] for name in landing.simulated_feeds()} if simulator else {}
    assets = [
        *([landing.simulated_batch] if simulator else []),
        *bronze_assets(feeds, landed_by=landed_by),
        *silver_assets(feeds),
        *pipeline_assets,
    ]
    checks = [
        *feed_checks(feeds),
        *load_asset_checks_from_modules(modules),
        *stream_health_checks(feeds),
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
            freshness_sensor(checks),
        ],
        resources=resources_for(deployment),
        # One process for the whole run: every asset shares one SparkSession (one JVM)
        # instead of a JVM per asset, which is what the multiprocess executor would cost.
        executor=in_process_executor,
    )


def _pipeline_assets(modules: Sequence[Any], left_out: dict[AssetKey, str]) -> list:
    """The pipeline modules' own assets, without reading the bronze tables of ``left_out``.

    An asset that reads one is replaced by its module's :data:`VARIANT_HOOK`
    result; where the module has no such function, the feed it reads stays in
    (removed from ``left_out``), so the asset still has its upstream.
    """
    loaded = load_assets_from_modules(modules)
    readers = [a for a in loaded if isinstance(a, AssetsDefinition) and set(a.dependency_keys) & left_out.keys()]
    if not readers:
        return list(loaded)
    modules_of = {}
    for asset in readers:
        # load_assets_from_modules hands out copies: the module is the one declaring these keys.
        module = next(
            (
                m
                for m in modules
                if any(isinstance(value, AssetsDefinition) and value.keys == asset.keys for value in vars(m).values())
            ),
            None,
        )
        if getattr(module, VARIANT_HOOK, None) is None:
            for key in set(asset.dependency_keys) & left_out.keys():
                _say_once(
                    f"Kafka feed kept: {left_out.pop(key)} ("
                    f"{', '.join(sorted(k.to_user_string() for k in asset.keys))} reads it and its module "
                    f"has no {VARIANT_HOOK}())"
                )
        else:
            modules_of[id(asset)] = module
    replaced = [a for a in readers if id(a) in modules_of and set(a.dependency_keys) & left_out.keys()]
    hooks = {modules_of[id(a)].__name__: getattr(modules_of[id(a)], VARIANT_HOOK) for a in replaced}
    variants = [variant for hook in hooks.values() for variant in hook(frozenset(left_out))]
    return [a for a in loaded if not any(a is r for r in replaced)] + variants


_said: set[str] = set()


def _say_once(line: str) -> None:
    # Dagster may load the definitions more than once per process: one line is enough.
    if line not in _said:
        _said.add(line)
        log.info(line)


@definitions
def defs() -> Definitions:
    """Loaded by ``dagster dev`` / ``dagster definitions validate``.

    Checks every setting first (:func:`~medallion_assets.settings.read_settings`):
    a wrong one stops the load with a :class:`~medallion_assets.settings.SettingsError`
    naming the variable, before any resource or session exists.
    """
    from medallion_assets.settings import read_settings

    settings = read_settings()
    return build_definitions(
        settings.deployment, simulator=settings.simulator, kafka=settings.kafka, pipelines=settings.pipeline_packages
    )
