"""When things run: ingest (hourly), refresh (daily), table maintenance (weekly)."""

from dagster import (
    AssetSelection,
    Config,
    JobDefinition,
    OpExecutionContext,
    PartitionsDefinition,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    job,
    op,
    schedule,
)
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from pydantic import Field

from medallion_assets.kafka import KafkaResource
from medallion_assets.pending_work import work_of_selection
from medallion_assets.project import project_feeds
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.client import DeltaTableClient

#: Bronze streams and the silver tables merged from them (with their quarantines, written by the same steps).
ingest_job = define_asset_job(
    "ingest",
    selection=AssetSelection.groups("bronze", "silver", "quarantine"),
    description="Take newly landed files into bronze and merge them into silver.",
)
#: Everything downstream of bronze, including asset checks. A partitioned gold
#: table's run covers a range of its partitions (a single-run backfill).
refresh_job = define_asset_job(
    "refresh",
    selection=AssetSelection.groups("silver", "quarantine", "gold"),
    description=(
        "Bring silver and gold up to date with bronze (every partition of a partitioned gold table in one run)."
    ),
)


def all_partitions_tags(partitions: PartitionsDefinition) -> dict[str, str]:
    """Run tags that make one run cover every partition of ``partitions``.

    Partitions whose inputs did not change are cheap: the IO manager skips
    rewriting a partition range whose inputs are the same as last time.
    """
    keys = partitions.get_partition_keys()
    return {ASSET_PARTITION_RANGE_START_TAG: keys[0], ASSET_PARTITION_RANGE_END_TAG: keys[-1]}


class MaintenanceConfig(Config):
    """Retention of the weekly VACUUM."""

    retention_hours: float = Field(
        default=168.0,
        description=(
            "Files older than this and no longer referenced are removed; Delta's rule is at least 168 (7 days)."
        ),
    )
    layers: list[str] = Field(
        default_factory=lambda: ["bronze", "silver", "gold", "quarantine"],
        description="Lake layers whose tables are compacted and vacuumed.",
    )


@op(description="OPTIMIZE (compaction) then VACUUM of every Delta table of the lake.")
def optimize_and_vacuum(
    context: OpExecutionContext, config: MaintenanceConfig, spark: SparkResource, lake: LakeResource
) -> None:
    """Compact and vacuum each table; never vacuums below Delta's 7-day retention check."""
    if config.retention_hours < 168:
        raise ValueError("retention below 168 hours can break readers and time travel; Delta refuses it too")
    session = spark.session_by_path
    client = DeltaTableClient(session, spark.delta_engine_in_use)
    context.log.info(f"Delta engine: {client.engine.name}")
    for layer in config.layers:
        for path in lake.table_paths(layer):
            if not client.exists(path):
                continue
            client.engine.compact(session, path)
            client.engine.vacuum(session, path, retention_hours=config.retention_hours)
            context.log.info(f"maintained {layer}/{path.rstrip('/').rsplit('/', 1)[-1]}")


@job(description="Weekly OPTIMIZE and VACUUM of the lake's tables.")
def table_maintenance():
    optimize_and_vacuum()


@schedule(
    job=ingest_job,
    cron_schedule="0 * * * *",
    name="ingest_hourly",
    description=(
        "Hourly, on the hour: the ingest job, newly landed files into bronze and merged into silver; "
        "skipped, with the reason, when nothing landed and silver took in all of bronze."
    ),
)
def ingest_schedule(
    context: ScheduleEvaluationContext, lake: LakeResource, kafka: KafkaResource
) -> RunRequest | SkipReason:
    """A run of the ingest job when it has work, read without Spark (:mod:`medallion_assets.pending_work`).

    Work is a landed file a stream has not taken, a snapshot not loaded, a
    message on the Kafka topic past its stream's checkpoint (``kafka``: the
    broker the runs read), or a silver table that has not taken in its bronze
    table's newest version. Otherwise a :class:`SkipReason` the UI shows on the tick.
    """
    job = context.repository_def.get_job(ingest_job.name)
    feeds = project_feeds()
    work = work_of_selection(
        lake,
        feeds,
        job.asset_layer.asset_graph,
        job.asset_layer.selected_asset_keys,
        kafka=kafka,
    )
    if work.nothing_new:
        return SkipReason(f"ingest: {work.describe()}")
    return RunRequest(tags={"medallion/work": work.describe(limit=3)[:200]})


@schedule(
    job=refresh_job,
    cron_schedule="30 2 * * *",
    name="refresh_daily",
    description=(
        "Daily at 02:30: the refresh job, silver and gold, every partition of a partitioned gold table in one run; "
        "skipped, with the reason, when every table took in its inputs' newest versions."
    ),
)
def refresh_schedule(context: ScheduleEvaluationContext, lake: LakeResource) -> RunRequest | SkipReason:
    """Daily: silver and gold, every partition of the partitioned gold table in one run, when it has work.

    The refresh job has no bronze step to stand down in its run (a silver step's
    inputs are loaded, and the session started, before its body can decide), so
    the schedule asks instead, without Spark (:mod:`medallion_assets.pending_work`):
    work is a table whose marks name an older version of an input table than its
    newest. Otherwise a :class:`SkipReason` the UI shows on the tick.
    """
    job = context.repository_def.get_job(refresh_job.name)
    work = work_of_selection(
        lake, project_feeds(), job.asset_layer.asset_graph, job.asset_layer.selected_asset_keys, kafka=None
    )
    if work.nothing_new:
        return SkipReason(f"refresh: {work.describe()}")
    partitions = job.partitions_def
    tags = all_partitions_tags(partitions) if partitions is not None else {}
    return RunRequest(tags={**tags, "medallion/work": work.describe(limit=3)[:200]})


maintenance_schedule = ScheduleDefinition(
    job=table_maintenance,
    cron_schedule="0 4 * * 0",
    name="maintenance_weekly",
    description="Weekly, Sunday 04:00: OPTIMIZE then VACUUM of every Delta table of the lake.",
)

jobs: list[JobDefinition | UnresolvedAssetJobDefinition] = [ingest_job, refresh_job, table_maintenance]
schedules = [ingest_schedule, refresh_schedule, maintenance_schedule]
