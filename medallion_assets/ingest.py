"""Bronze ingestion: landing files -> bronze Delta tables with Structured Streaming.

One function starts the stream of a landing folder, so a Dagster asset can run
it to completion (``availableNow``) and a long-running service can run it
continuously with the same code. Exactly-once comes from the checkpoint under
``<lake root>/_checkpoints/<stream>`` together with the Delta sink's app
transaction: a file is processed by one batch, and a batch commits once.
:func:`full_refresh_stream` is here because it drops exactly that checkpoint
and table, so the next start of the stream re-ingests all of landing/.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import PurePath
from typing import Any

from pyarrow import fs
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StructType

from medallion_assets.delta import parse_bytes
from medallion_assets.feeds import Feed, LandingFiles, LandingSnapshots, kafka_feed
from medallion_assets.kafka import (
    KafkaError,
    KafkaResource,
    is_connect_session,
    kafka_connector_missing,
    latest_offsets,
)
from medallion_assets.resources import LakeResource
from medallion_assets.storage.client import DeltaTableClient
from medallion_assets.storage.engines import DeltaEngine, engine_for
from medallion_assets.storage.write_spec import WriteSpec, table_properties_for
from medallion_assets.transforms import bronze


def bronze_stream_frame(
    spark: SparkSession,
    lake: LakeResource,
    feed: Feed,
    *,
    max_files_per_trigger: int | None = None,
    max_bytes_per_trigger: int | str | None = None,
) -> DataFrame:
    """The streaming DataFrame of a feed of landed files: rows as delivered + ``_source_file``, ``_ingested_at``.

    Args:
        spark: the session.
        lake: where the landing folder is.
        feed: the feed whose landed files to read.
        max_files_per_trigger: cap on files per micro-batch (None: Spark's default).
        max_bytes_per_trigger: cap on bytes per micro-batch, e.g. ``67108864`` or ``"64m"``.

    Returns:
        A streaming DataFrame in the feed's bronze schema
        (:func:`~medallion_assets.transforms.bronze.bronze_schema`).

    Raises:
        ValueError: the feed is not fed by landed NDJSON or CSV files.
    """
    if not isinstance(feed.source, LandingFiles):
        raise ValueError(f"bronze.{feed.name} is not a stream of landed files (its source is {feed.source!r})")
    reader = spark.readStream.option("pathGlobFilter", "*" + feed.source.file_suffix)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    if max_bytes_per_trigger:
        size = parse_bytes("maxBytesPerTrigger", str(max_bytes_per_trigger), table=feed.name)
        reader = reader.option("maxBytesPerTrigger", str(size))
    folder = lake.landing_folder(feed)
    if feed.source.format == "ndjson":
        # Lines stay text: parsing is silver's job, and bronze keeps bad lines as delivered.
        return bronze.landed_lines(reader.format("text").load(folder))
    read_schema = bronze.csv_read_schema(feed)
    options = bronze.csv_options(feed.source)
    csv = reader.format("csv").schema(read_schema).options(**options)
    return bronze.csv_records(csv.load(folder), read_schema, options)


def start_bronze_stream(
    spark: SparkSession,
    lake: LakeResource,
    feed: Feed,
    *,
    trigger: Mapping[str, Any] | None = None,
    commit_metadata: Mapping[str, str] | None = None,
    max_files_per_trigger: int | None = None,
    max_bytes_per_trigger: int | str | None = None,
    query_name: str | None = None,
) -> StreamingQuery:
    """Start the stream landing/<folder> -> bronze/<feed name>.

    Args:
        spark: the session (``delta`` enabled).
        lake: gives the landing folder, the checkpoint and the table path.
        feed: the feed of landed files.
        trigger: keyword arguments of ``DataStreamWriter.trigger``; default
            ``{"availableNow": True}`` (process what is there, then stop).
            A continuous service passes e.g. ``{"processingTime": "30 seconds"}``.
        commit_metadata: custom keys recorded in each Delta commit (e.g. the Dagster run id).
        max_files_per_trigger: cap on files per micro-batch.
        max_bytes_per_trigger: cap on bytes per micro-batch (``"64m"``).
        query_name: the streaming query's name (default ``bronze_<feed name>``).

    Returns:
        The running query; call ``awaitTermination()`` for ``availableNow``.
    """
    # Before the frame: a file stream source refuses a missing folder when it is defined.
    _ensure_folder(lake, lake.landing_folder(feed))
    frame = bronze_stream_frame(
        spark, lake, feed, max_files_per_trigger=max_files_per_trigger, max_bytes_per_trigger=max_bytes_per_trigger
    )
    return _start_bronze_sink(
        spark,
        lake,
        feed.name,
        frame,
        frame.schema,
        trigger=trigger,
        commit_metadata=commit_metadata,
        query_name=query_name,
    )


def start_kafka_stream(
    spark: SparkSession,
    lake: LakeResource,
    kafka: KafkaResource,
    feed: Feed,
    *,
    trigger: Mapping[str, Any] | None = None,
    commit_metadata: Mapping[str, str] | None = None,
    query_name: str | None = None,
) -> StreamingQuery:
    """Start the stream Kafka topic -> ``bronze.<feed name>``.

    Exactly-once as for the files: the checkpoint under
    ``_checkpoints/<feed name>`` records each batch's offset range before it
    runs, and the Delta sink's app transaction makes a replayed batch commit
    nothing. The broker and topic are checked first, so a broker that is down
    or a topic that does not exist is a clear error before any batch is
    planned; the checkpoint is untouched and the next run resumes from it.

    Args:
        spark: the session (``delta`` enabled, Spark's Kafka connector on it).
        lake: gives the checkpoint and the table path.
        kafka: the broker, topic and read options.
        feed: the Kafka feed.
        trigger: as for :func:`start_bronze_stream` (default ``availableNow``).
        commit_metadata: custom keys recorded in each Delta commit.
        query_name: the streaming query's name (default ``bronze_<feed name>``).

    Raises:
        KafkaError: no broker is configured, it does not answer, or it lacks the topic; or the
            session (over Spark Connect: its server) lacks Spark's Kafka connector.
    """
    feed = kafka_feed(feed)
    kafka = kafka.for_feed(feed)
    latest_offsets(kafka)
    try:
        # A classic session looks the source up here; a Connect server only when the query starts.
        messages = spark.readStream.format("kafka").options(**kafka.spark_source_options()).load()
        return _start_bronze_sink(
            spark,
            lake,
            feed.name,
            bronze.kafka_messages(messages),
            bronze.KAFKA_SCHEMA,
            trigger=trigger,
            commit_metadata=commit_metadata,
            query_name=query_name,
        )
    except Exception as error:
        if not _kafka_source_missing(error):
            raise
        raise KafkaError(kafka_connector_missing(over_connect=is_connect_session(spark))) from error


def _kafka_source_missing(error: BaseException) -> bool:
    """Whether Spark refused the ``kafka`` format because no connector on its class path provides it."""
    # Spark names the Kafka case in words (failedToFindKafkaDataSourceError), other formats by error class.
    text = str(error)
    return "failed to find data source: kafka" in text.lower() or (
        "DATA_SOURCE_NOT_FOUND" in text and "kafka" in text.lower()
    )


def _start_bronze_sink(
    spark: SparkSession,
    lake: LakeResource,
    stream_name: str,
    frame: DataFrame,
    schema: StructType,
    *,
    trigger: Mapping[str, Any] | None,
    commit_metadata: Mapping[str, str] | None,
    query_name: str | None,
) -> StreamingQuery:
    """Append a bronze stream to its Delta table, checkpointed under ``_checkpoints/<stream_name>``."""
    table_path = lake.table_path(["bronze", stream_name])
    engine = engine_for(spark)
    _create_bronze_table(spark, engine, table_path, schema)
    options = engine.commit_metadata_options(commit_metadata or {})
    if _lacks_columns(spark, engine, table_path, schema):
        # A table from before a column was added to the bronze schema (a CSV file's
        # header): its first batch adds it, and its older rows read as null.
        options = {**options, "mergeSchema": "true"}
    return engine.start_append_stream(
        frame,
        table_path,
        checkpoint_location=lake.checkpoint_dir(stream_name),
        query_name=query_name or f"bronze_{stream_name}",
        trigger=trigger or {"availableNow": True},
        options=options,
    )


def _lacks_columns(spark: SparkSession, engine: DeltaEngine, path: str, schema: StructType) -> bool:
    """Whether the bronze table at ``path`` lacks some column of ``schema``."""
    have = set(engine.schema(spark, path).fieldNames())
    return any(name not in have for name in schema.fieldNames())


class FullRefreshRefusedError(RuntimeError):
    """A full refresh of a streaming bronze table was asked for, but the asset does not allow it."""


def full_refresh_stream(lake: LakeResource, feed: Feed, *, allowed: bool) -> None:
    """Drop a bronze stream's checkpoint and table, so the next run re-ingests all of landing/.

    Raises:
        FullRefreshRefusedError: unless ``allowed`` (the asset's ``allow_full_refresh``).
    """
    stream = feed.name
    if not allowed:
        raise FullRefreshRefusedError(
            f"refusing a full refresh of bronze.{stream}: it drops the stream's checkpoint and every row "
            "ingested so far, and landing/ may no longer hold all the files bronze was built from. "
            f"Declare the feed with allow_full_refresh=True if the landed files are complete"
        )
    for location in (lake.checkpoint_dir(stream), lake.table_path(["bronze", stream])):
        filesystem, path = lake.filesystem(location)
        # On an object store, a folder is the objects under its prefix: all of them are removed.
        if filesystem.get_file_info(path).type != fs.FileType.NotFound:
            filesystem.delete_dir(path)


def ensure_bronze_table(spark: SparkSession, lake: LakeResource, feed: Feed) -> str:
    """Create a stream's empty bronze table if it is missing; its path.

    A deployment without the feed's source (no Kafka) still has the table,
    empty, so silver reads every source the same way whatever the deployment delivers.
    """
    path = lake.table_path(["bronze", feed.name])
    _create_bronze_table(spark, engine_for(spark), path, bronze.bronze_schema(feed))
    return path


def _create_bronze_table(spark: SparkSession, engine: DeltaEngine, path: str, schema: StructType) -> None:
    """Create a bronze table before its stream first writes, with its change data feed on.

    Silver reads bronze increments through the change data feed. Created with
    the table builder, which both engines take, rather than a sink option that
    each engine spells differently.
    """
    if not engine.is_delta_table(spark, path):
        # Statistics on the ingestion time only: no reader filters bronze's raw lines, and
        # their min/max would only fill the log.
        stats = table_properties_for(WriteSpec(mode="append"), schema)
        engine.create_table(spark, path, schema, properties={"delta.enableChangeDataFeed": "true", **stats})


@dataclass(frozen=True)
class LandedSnapshot:
    """The newest snapshot file of a snapshot feed, loaded as a batch."""

    frame: DataFrame
    source_file: str


def load_snapshot(spark: SparkSession, lake: LakeResource, feed: Feed) -> LandedSnapshot | None:
    """The newest ``.parquet`` file of a snapshot feed's landing folder (newest by name, per the contract).

    Returns:
        The snapshot with ``_source_file`` and ``_ingested_at`` added, or None when none landed.
    """
    if not isinstance(feed.source, LandingSnapshots):
        raise ValueError(f"bronze.{feed.name} is not a snapshot feed (its source is {feed.source!r})")
    newest = bronze.latest_snapshot(lake.files(lake.landing_folder(feed), feed.source.file_suffix))
    if newest is None:
        return None
    frame = (
        spark.read.parquet(newest)
        .withColumn("_source_file", F.lit(newest))
        .withColumn("_ingested_at", F.current_timestamp())
    )
    return LandedSnapshot(frame=frame, source_file=newest)


def _ensure_folder(lake: LakeResource, folder: str) -> None:
    # A file stream source refuses a missing folder; an empty one is a valid "nothing landed yet"
    # (in a bucket: pyarrow writes the folder's marker object, which S3A takes for a folder).
    filesystem, path = lake.filesystem(folder)
    filesystem.create_dir(path, recursive=True)


#: Commit metadata of a snapshot feed's bronze commit: the snapshot it applied (its file name), and the
#: newest modification time (ns) of the landing folder's files when it was applied.
APPLIED_SNAPSHOT = "applied_snapshot"
LANDED_UNTIL = "landed_until"

_MICROSECOND = timedelta(microseconds=1)


@dataclass(frozen=True)
class AppliedSnapshots:
    """What :func:`apply_snapshots` did.

    Attributes:
        applied: each snapshot applied, in order: its file name -> change rows appended by kind
            (``upsert``, ``delete``).
        ignored: snapshots landed since the last one was applied whose name sorts at or before it
            (late or replayed), by file name: not applied.
        last: the newest applied snapshot's file name, None while none was.
    """

    applied: dict[str, dict[str, int]]
    ignored: list[str]
    last: str | None


def apply_snapshots(
    spark: SparkSession, lake: LakeResource, feed: Feed, *, commit_metadata: Mapping[str, str] | None = None
) -> AppliedSnapshots:
    """Append to a snapshot feed's bronze table the changes of each snapshot newer than the last applied one.

    Each snapshot whose file name sorts after the last applied one's is, in
    name order, diffed against the state before it
    (:func:`~medallion_assets.transforms.bronze.snapshot_changes`; the first
    against the rows bronze's changes leave, the next ones against the
    snapshot before them) and appended in a commit of its own that records
    its name (:data:`APPLIED_SNAPSHOT`), even without a change. The last
    applied snapshot is read from that record, so a run killed anywhere
    resumes after the last snapshot whose commit landed, and a snapshot is
    applied once (without a retained record, the newest snapshot among its
    rows is the last applied one). A snapshot landed after that record (per
    its modification time) whose name sorts at or before it is late or
    replayed: ignored, and returned as such.

    Raises:
        ValueError: the feed is not a snapshot feed declared with ApplyChanges.
    """
    if not feed.applies_snapshots:
        raise ValueError(f"bronze.{feed.name} is not a snapshot feed applied as changes (declare ApplyChanges)")
    engine = engine_for(spark)
    path = lake.table_path(feed.bronze_key.path)
    _create_bronze_table(spark, engine, path, bronze.bronze_schema(feed))
    client = DeltaTableClient(spark, engine)
    last = engine.newest_commit_value(spark, path, APPLIED_SNAPSHOT)
    if last is None:
        # No retained commit names one (a first run, or the log cleaned up behind maintenance commits):
        # the newest snapshot among the rows.
        [[last]] = client.read(path).agg(F.max(bronze.SNAPSHOT)).collect()
    landed_until = int(engine.newest_commit_value(spark, path, LANDED_UNTIL) or -1)
    landed = {
        file: modified
        for file, modified in lake.files_modified(lake.landing_folder(feed), ".parquet").items()
        if bronze.is_visible_data_file(PurePath(file).name)
    }
    newer = sorted((f for f in landed if last is None or PurePath(f).name > last), key=lambda f: PurePath(f).name)
    ignored = sorted(PurePath(f).name for f, modified in landed.items() if f not in newer and modified > landed_until)
    seen = str(max(landed.values(), default=landed_until))
    applied: dict[str, dict[str, int]] = {}
    if newer:
        table = client.read(path)
        before = bronze.snapshot_state(table, feed)
        # Silver orders a key's changes by (_ingested_at, snapshot name): each snapshot is taken in
        # strictly after the one before it, whatever the clock did, so that order is the names'.
        [[taken_until]] = table.agg(F.max("_ingested_at")).collect()
    for file in newer:
        name = PurePath(file).name
        now = datetime.now(UTC)
        taken_at = now if taken_until is None else max(now, taken_until.astimezone(UTC) + _MICROSECOND)
        snapshot = bronze.snapshot_text(spark.read.parquet(file), feed)
        changes = (
            bronze.snapshot_changes(snapshot, before, feed)
            .select(
                *feed.field_names,
                bronze.CHANGE,
                F.lit(name).alias(bronze.SNAPSHOT),
                F.lit(file).alias("_source_file"),
                F.lit(taken_at).cast("timestamp").alias("_ingested_at"),
            )
            .cache()
        )
        try:
            counts = {kind: count for kind, count in changes.groupBy(bronze.CHANGE).count().collect()}
            # Versioned by the table's next version: another run applying the same snapshot at the same
            # time, from the same table version, commits nothing.
            version = client.latest_version(path)
            assert version is not None, "the bronze table exists: created above"
            transaction = (f"medallion:snapshots:{feed.name}", version + 1)
            client.write(
                changes,
                path,
                WriteSpec(mode="append"),
                transaction=transaction,
                empty_commit=transaction,
                commit_metadata={**(commit_metadata or {}), APPLIED_SNAPSHOT: name, LANDED_UNTIL: seen},
            )
        finally:
            changes.unpersist()
        applied[name] = {"upsert": counts.get("upsert", 0), "delete": counts.get("delete", 0)}
        before, last, taken_until = snapshot, name, taken_at
    return AppliedSnapshots(applied=applied, ignored=ignored, last=last)
