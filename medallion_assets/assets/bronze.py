"""Bronze: each feed's deliveries as delivered, plus where and when they came in.

Built from the feeds' declarations (:mod:`medallion_assets.feeds`): a feed of
landed files streams them in (``availableNow``: each run takes the files its
checkpoint has not seen); a Kafka feed streams the topic's messages into a
table of its own (each run takes the offsets its checkpoint has not
committed, and the table exists, empty, where the deployment has no Kafka);
a snapshot feed loads its newest landed Parquet file, or, declared with
``ApplyChanges``, appends the changes of each snapshot newer than the last
applied one and names the late or replayed ones it ignored
(:func:`~medallion_assets.ingest.apply_snapshots`).
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Config,
    MaterializeResult,
    MetadataValue,
    Output,
    asset,
)
from pydantic import Field

from medallion_assets.feeds import Feed, KafkaTopic, LandingSnapshots
from medallion_assets.ingest import (
    apply_snapshots,
    ensure_bronze_table,
    full_refresh_stream,
    load_snapshot,
    start_bronze_stream,
    start_kafka_stream,
)
from medallion_assets.io_manager import (
    DELTA_KINDS,
    SOURCE,
    delta_table,
    latest_materialization_metadata,
    table_metadata,
)
from medallion_assets.kafka import KafkaResource
from medallion_assets.pending_work import RunWork, work_of_selection
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.client import DeltaTableClient
from medallion_assets.transforms.bronze import bronze_column_descriptions


class BronzeStreamConfig(Config):
    """Run options of a streaming bronze asset."""

    full_refresh: bool = Field(
        default=False,
        description="Drop the stream's checkpoint and table first and re-ingest all of landing/. "
        "Refused unless the feed is declared with allow_full_refresh=True.",
    )


def _run_to_end(
    query, client: DeltaTableClient, path: str, feed: Feed, spark: SparkResource, context: AssetExecutionContext
) -> tuple[dict, list[dict]]:
    """Wait for an ``availableNow`` query; the table's metadata with what this run took in, and its progress."""
    query.awaitTermination()
    progress = [p for p in query.recentProgress if p.get("numInputRows")]
    metadata = (
        {
            **table_metadata(
                client,
                path,
                column_descriptions=bronze_column_descriptions(feed),
                earlier=latest_materialization_metadata(context.instance, context.asset_key),
            ),
            **_catalog_entry(spark, client, feed, path),
        }
        if client.exists(path)
        else {"dagster/row_count": 0}
    )
    return {
        **metadata,
        "new_rows": sum(int(p["numInputRows"]) for p in progress),
        "micro_batches": len(progress),
    }, progress


#: The answer of the run this process executes (run id -> its work), the latest run's only.
_work_of_run: dict[str, RunWork] = {}


def _run_has_nothing_new(
    context: AssetExecutionContext, lake: LakeResource, kafka: KafkaResource, feeds: tuple[Feed, ...]
) -> bool:
    """Whether nothing in this run has work, read without Spark (:mod:`medallion_assets.pending_work`).

    Then the bronze step produces no output, starts no session, and says why in
    the run's log: Dagster skips every step downstream of it in the run, which is
    right only because the answer covers the whole run (a step joining two feeds
    runs whenever either had news). The run's first bronze step asks, with the
    run's own resources (``kafka``: the broker whose end offsets a Kafka feed's
    checkpoint is compared with); every other bronze step of the run takes the
    same answer, so the run stands down or works as a whole.
    """
    work = _work_of_run.get(context.run_id)
    if work is None:
        # Asked once per run, by its first bronze step: the others, run after it in the same process
        # (the in-process executor), take its answer instead of asking the lake and the broker again.
        layer = context.job_def.asset_layer
        work = work_of_selection(lake, feeds, layer.asset_graph, layer.selected_asset_keys, kafka=kafka)
        _work_of_run.clear()
        _work_of_run[context.run_id] = work
    if work.nothing_new:
        context.log.info(
            f"{context.asset_key.to_user_string()}: {work.describe()}; no Spark session started, "
            "and the steps downstream in this run are skipped"
        )
    else:
        context.log.debug(f"this run has work: {work.describe()}")
    return work.nothing_new


def _bronze_asset_args(feed: Feed, deps: Sequence[AssetKey]) -> dict:
    """What every bronze asset of a feed declares alike: its key, group, kinds, description and upstream."""
    return {
        "key": feed.bronze_key,
        "group_name": "bronze",
        "kinds": DELTA_KINDS,
        "description": feed.description,
        "deps": list(deps),
    }


def _catalog_entry(spark: SparkResource, client: DeltaTableClient, feed: Feed, path: str) -> dict:
    """The stream's table by name (the sink writes by path), registered where names are in use
    (:meth:`~medallion_assets.catalog.LakeCatalog.register_written`); its name as metadata."""
    catalog = spark.catalog
    if not catalog.enabled:
        return {}
    catalog.register_written(client.spark, client.engine, feed.bronze_key.path, path)
    return {"dagster/table_name": catalog.qualified_name(feed.bronze_key.path)}


def _files_stream_asset(feed: Feed, deps: Sequence[AssetKey], feeds: tuple[Feed, ...]) -> AssetsDefinition:
    @asset(
        **_bronze_asset_args(feed, deps),
        output_required=False,
        metadata={
            "delta/write_mode": "append (Structured Streaming sink)",
            "allow_full_refresh": feed.allow_full_refresh,
        },
    )
    def _bronze_stream(
        context: AssetExecutionContext,
        config: BronzeStreamConfig,
        spark: SparkResource,
        lake: LakeResource,
        kafka: KafkaResource,
    ) -> Iterator[MaterializeResult]:
        if not config.full_refresh and _run_has_nothing_new(context, lake, kafka, feeds):
            return
        if config.full_refresh:
            full_refresh_stream(lake, feed, allowed=feed.allow_full_refresh)
        session = spark.session_by_path
        query = start_bronze_stream(session, lake, feed, commit_metadata={"dagster_run_id": context.run_id})
        metadata, _ = _run_to_end(
            query, DeltaTableClient(session), lake.table_path(feed.bronze_key.path), feed, spark, context
        )
        yield MaterializeResult(metadata=metadata)

    return _bronze_stream


def _kafka_stream_asset(feed: Feed, deps: Sequence[AssetKey], feeds: tuple[Feed, ...]) -> AssetsDefinition:
    @asset(
        **_bronze_asset_args(feed, deps),
        output_required=False,
        metadata={"delta/write_mode": "append (Structured Streaming sink)"},
    )
    def _bronze_kafka(
        context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource
    ) -> Iterator[MaterializeResult]:
        if _run_has_nothing_new(context, lake, kafka, feeds):
            return
        session = spark.session_by_path
        client = DeltaTableClient(session)
        descriptions = bronze_column_descriptions(feed)
        if not kafka.configured:
            path = ensure_bronze_table(session, lake, feed)
            yield MaterializeResult(
                metadata={
                    **table_metadata(
                        client,
                        path,
                        column_descriptions=descriptions,
                        earlier=latest_materialization_metadata(context.instance, context.asset_key),
                    ),
                    **_catalog_entry(spark, client, feed, path),
                    "new_rows": 0,
                    "note": "no Kafka source in this deployment (MEDALLION_KAFKA_BOOTSTRAP_SERVERS is not set)",
                }
            )
            return
        kafka = kafka.for_feed(feed)
        context.log.info(f"reading {kafka.describe()}")
        query = start_kafka_stream(session, lake, kafka, feed, commit_metadata={"dagster_run_id": context.run_id})
        metadata, progress = _run_to_end(query, client, lake.table_path(feed.bronze_key.path), feed, spark, context)
        ends = progress[-1]["sources"][0].get("endOffset") if progress else None
        yield MaterializeResult(
            metadata={
                **metadata,
                "kafka_topic": kafka.topic,
                "kafka_end_offsets": MetadataValue.json(ends or {}),
            }
        )

    return _bronze_kafka


def _snapshot_asset(feed: Feed, deps: Sequence[AssetKey], feeds: tuple[Feed, ...]) -> AssetsDefinition:
    @asset(
        **_bronze_asset_args(feed, deps),
        output_required=False,
        metadata=delta_table(
            write_mode="overwrite", schema_mode="overwrite", column_descriptions=bronze_column_descriptions(feed)
        ),
    )
    def _bronze_snapshot(
        context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource
    ):
        if _run_has_nothing_new(context, lake, kafka, feeds):
            return
        snapshot = load_snapshot(spark.session_by_path, lake, feed)
        if snapshot is not None:
            # The file name lets the IO manager skip rewriting an unchanged snapshot.
            yield Output(snapshot.frame, metadata={SOURCE: snapshot.source_file})

    return _bronze_snapshot


def _snapshot_changes_asset(feed: Feed, deps: Sequence[AssetKey], feeds: tuple[Feed, ...]) -> AssetsDefinition:
    @asset(
        **_bronze_asset_args(feed, deps),
        output_required=False,
        metadata={"delta/write_mode": "append (each new snapshot's changes, one commit per snapshot)"},
    )
    def _bronze_snapshot_changes(
        context: AssetExecutionContext, spark: SparkResource, lake: LakeResource, kafka: KafkaResource
    ) -> Iterator[MaterializeResult]:
        if _run_has_nothing_new(context, lake, kafka, feeds):
            return
        session = spark.session_by_path
        done = apply_snapshots(session, lake, feed, commit_metadata={"dagster_run_id": context.run_id})
        if done.ignored:
            context.log.warning(
                f"bronze.{feed.name}: ignored {len(done.ignored)} snapshot(s) whose name sorts at or before the "
                f"last applied one, {done.last} (late or replayed; deliver a correction as a newer snapshot): "
                f"{', '.join(done.ignored)}"
            )
        client = DeltaTableClient(session)
        path = lake.table_path(feed.bronze_key.path)
        yield MaterializeResult(
            metadata={
                **table_metadata(
                    client,
                    path,
                    column_descriptions=bronze_column_descriptions(feed),
                    earlier=latest_materialization_metadata(context.instance, context.asset_key),
                ),
                **_catalog_entry(spark, client, feed, path),
                "applied_snapshots": MetadataValue.json(done.applied),
                "ignored_snapshots": MetadataValue.json(done.ignored),
                "last_applied_snapshot": done.last or "",
                "new_rows": sum(sum(counts.values()) for counts in done.applied.values()),
            }
        )

    return _bronze_snapshot_changes


def bronze_assets(
    feeds: Iterable[Feed], *, landed_by: Mapping[str, Sequence[AssetKey]] | None = None
) -> list[AssetsDefinition]:
    """The bronze asset of each feed.

    Args:
        feeds: the declarations.
        landed_by: feed name -> the assets that land its files (the demo
            simulator, when it is on), drawn as their upstream; none for a
            real landing zone.
    """
    landed_by = landed_by or {}
    feeds = tuple(feeds)
    built = []
    for feed in feeds:
        deps = landed_by.get(feed.name, ())
        if isinstance(feed.source, KafkaTopic):
            built.append(_kafka_stream_asset(feed, deps, feeds))
        elif feed.applies_snapshots:
            built.append(_snapshot_changes_asset(feed, deps, feeds))
        elif isinstance(feed.source, LandingSnapshots):
            built.append(_snapshot_asset(feed, deps, feeds))
        else:
            built.append(_files_stream_asset(feed, deps, feeds))
    return built
