"""The one Definitions object of the project.

Built lazily (Dagster's ``@definitions``), so importing this module reads no
environment and starts nothing. ``MEDALLION_DEPLOYMENT`` picks the resources:
``local`` (default: embedded ``local[*]`` Spark), ``cluster`` (master from
``SPARK_MASTER_URL``) or ``connect`` (Spark Connect at ``SPARK_REMOTE``); the
asset code is the same in all three. ``MEDALLION_DELTA_ENGINE``,
``DELTA_SPARK_JARS`` and ``MEDALLION_DELTA_SPARK_MAVEN`` choose the Delta engine
(:mod:`medallion_assets.storage.session`). ``MEDALLION_SIMULATOR=off`` leaves the demo
producers out (TPC-H's ``landing/simulated_batch``, :data:`PRODUCER_HOOK`);
``MEDALLION_DEMO=off`` leaves out the project's own pipelines too (TPC-H), so
only the ``MEDALLION_PIPELINES`` packages' feeds and assets are there. Without
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
from types import ModuleType
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

from medallion_assets.assets.bronze import bronze_assets
from medallion_assets.assets.checks import feed_checks, freshness_sensor
from medallion_assets.assets.silver import silver_assets
from medallion_assets.continuous import bronze_streams_continuous
from medallion_assets.feeds import KafkaTopic
from medallion_assets.io_manager import DeltaIOManager
from medallion_assets.jobs import ingest_job, jobs, schedules
from medallion_assets.project import pipeline_hooks, pipeline_modules, project_feeds
from medallion_assets.resources import io_manager_settings, kafka_resource, lake_resource, spark_resource
from medallion_assets.sensors import build_landing_sensor, stream_health_checks, stream_sensors
from medallion_assets.settings import Deployment, Settings, pipeline_packages, read_settings

# Dagster's logger: its handler shows INFO in `dagster dev` and `dagster definitions validate`.
log = get_dagster_logger("medallion_assets.definitions")

#: The function a pipeline module defines when one of its assets reads a feed the
#: definitions may leave out: ``assets_without(left_out: frozenset[AssetKey])``
#: returns that module's replacements for its assets reading those bronze tables.
VARIANT_HOOK = "assets_without"

#: The function a pipeline module defines when one of its assets is a demo producer, which
#: lands files for feeds in place of a real landing zone: ``landing_producers()`` returns
#: ``{the asset's key: names of the feeds it lands}``. The asset is loaded from the module like
#: its others, and kept only with ``simulator``, then drawn upstream of those feeds' bronze assets.
PRODUCER_HOOK = "landing_producers"


def resources_for(deployment: Deployment | None = None, *, settings: Settings | None = None) -> dict[str, Any]:
    """Every resource the assets need, for one deployment, configured from ``settings``.

    Args:
        deployment: ``local``, ``cluster`` or ``connect`` (default: the settings').
        settings: the checked settings (default: :func:`~medallion_assets.settings.read_settings`'s).
    """
    settings = settings or read_settings()
    spark = spark_resource(deployment, settings=settings)
    lake = lake_resource(settings)
    io_manager = DeltaIOManager(spark=spark, lake=lake, **io_manager_settings(settings))
    return {"spark": spark, "lake": lake, "kafka": kafka_resource(settings), "io_manager": io_manager}


def build_definitions(
    deployment: Deployment | None = "local",
    *,
    simulator: bool | None = None,
    kafka: bool = True,
    pipelines: Sequence[str] | None = None,
    settings: Settings | None = None,
) -> Definitions:
    """The project's Definitions for ``deployment``.

    Bronze, silver, quarantine, their checks and the stream sensors are built
    from the feeds declared in the pipeline packages (Python modules and
    ``defs.yaml`` feed components); the pipelines' own assets and checks (gold,
    TPC-H's order step) are loaded from the same modules. The jobs and
    schedules select by asset group, so they hold whatever feeds are there.

    Args:
        deployment: ``local``, ``cluster`` or ``connect`` (:func:`resources_for`); ``None``: the settings'.
        simulator: include the pipelines' demo producers (:data:`PRODUCER_HOOK`; TPC-H's
            ``landing/simulated_batch``), upstream of the feeds they land. No job or
            schedule selects them; a deployment with a real landing zone leaves them
            out, and then nothing shows them. ``None`` (the default): included when a
            pipeline module offers one.
        kafka: include the feeds read from Kafka (``KafkaTopic``): their bronze
            asset, checkpoint sensor and ``stream_health`` check. Without them a
            pipeline asset that reads their bronze table is swapped for its
            module's variant (:data:`VARIANT_HOOK`); a module without one keeps
            the Kafka feed it reads. ``defs()`` sets it from
            ``MEDALLION_KAFKA_BOOTSTRAP_SERVERS``.
        pipelines: the pipeline packages (default: the environment's,
            :func:`~medallion_assets.settings.pipeline_packages`). Without
            ``medallion_assets.pipelines`` (``MEDALLION_DEMO=off``) TPC-H is left
            out, and with it its simulator, which lands TPC-H's files.
        settings: the checked settings the resources are configured from (default:
            :func:`~medallion_assets.settings.read_settings`'s).

    Raises:
        ValueError: ``simulator`` when no pipeline module offers a producer.
    """
    if pipelines is None:
        pipelines = settings.pipeline_packages if settings is not None else pipeline_packages()
    packages = tuple(pipelines)
    modules = list(pipeline_modules(packages))
    producers = {key: landed for hook in pipeline_hooks(modules, PRODUCER_HOOK) for key, landed in hook().items()}
    if simulator is None:
        simulator = bool(producers)
    if simulator and not producers:
        raise ValueError(
            f"the simulator lands files for the pipelines that offer a producer ({PRODUCER_HOOK}()), and none of "
            f"the pipelines {', '.join(packages) or '(none)'} does: pass simulator=False"
        )
    declared = project_feeds(packages)
    left_out = {} if kafka else {f.bronze_key: f.name for f in declared if isinstance(f.source, KafkaTopic)}
    pipeline_assets = [
        a for a in _pipeline_assets(modules, left_out) if simulator or not set(a.keys) & producers.keys()
    ]
    feeds = tuple(f for f in declared if f.bronze_key not in left_out)
    if left_out:
        _say_once(
            f"Kafka feeds left out: {', '.join(left_out.values())} "
            "(set MEDALLION_KAFKA_BOOTSTRAP_SERVERS to include them)"
        )
    landed_by: dict[str, list[AssetKey]] = {}
    if simulator:
        for key, landed in producers.items():
            for name in landed:
                landed_by.setdefault(name, []).append(key)
    assets = [
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
        resources=resources_for(deployment, settings=settings),
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
    modules_of: dict[int, ModuleType] = {}
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
        if module is None or getattr(module, VARIANT_HOOK, None) is None:
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
    settings = read_settings()
    return build_definitions(
        None,
        simulator=settings.simulator,
        kafka=settings.kafka,
        pipelines=settings.pipeline_packages,
        settings=settings,
    )
