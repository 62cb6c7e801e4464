"""Sensors and checks that learn from the bronze streams themselves.

* :func:`build_checkpoint_sensor` -- one per bronze stream. Reads the stream's
  checkpoint (offsets, commits, sources) and the bronze table's Delta log;
  for each micro-batch committed since its cursor it records a
  materialization of the bronze asset (batch id, input files, rows, Delta
  version) and requests a run of what is downstream of bronze (silver,
  gold). Its cursor holds the query id and the last batch it reported, so a
  daemon restart neither repeats nor skips a batch.
  Each tick it also reports the stream's backlog and stall figures: as an
  observation (numeric metadata, which the UI plots) and as an evaluation of
  the bronze asset's ``stream_health`` check, when the verdict changes, on
  new batches, and at least every ``health_report_seconds``.
* :func:`build_stream_health_check` -- the same ``stream_health`` verdict as
  an asset check that runs with the asset or on demand.
* :func:`build_landing_sensor` -- triggered mode: newly landed files request
  an ingest run, keyed by the set of files, so one set never starts two runs.

Factories build the definitions; importing this module starts nothing.
"""

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSelection,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset_check,
    sensor,
)

from medallion_assets.checkpoints import delta_commits_of_query, read_checkpoint
from medallion_assets.feeds import Feed, KafkaTopic, kafka_feed, stream_feeds
from medallion_assets.kafka import KafkaResource
from medallion_assets.resources import LakeResource
from medallion_assets.stream_monitoring import (
    KafkaLag,
    StreamHealth,
    StreamHealthPolicy,
    batch_schema_drift,
    kafka_lag,
    landed_files,
    stream_health,
)

HEALTH_CHECK_NAME = "stream_health"
#: At most this many file names go into one event's metadata.
_MAX_LISTED_FILES = 20


def bronze_key(stream: str) -> AssetKey:
    return AssetKey(["bronze", stream])


@dataclass
class StreamCursor:
    """What a checkpoint sensor has reported so far."""

    query_id: str | None = None
    last_batch: int = -1
    health_passed: bool | None = None
    health_reported_at: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> "StreamCursor":
        if not text:
            return cls()
        data = json.loads(text)
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def dump(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def _health_events(stream: str, health: StreamHealth | KafkaLag) -> list:
    key = bronze_key(stream)
    metadata = health.metadata()
    description = "; ".join(health.problems) or "stream healthy: no stalled batch, backlog within bounds"
    return [
        AssetObservation(asset_key=key, description="stream lag", metadata=metadata),
        AssetCheckEvaluation(
            asset_key=key,
            check_name=HEALTH_CHECK_NAME,
            passed=health.passed,
            severity=AssetCheckSeverity.ERROR,
            metadata=metadata,
            description=description,
        ),
    ]


def build_checkpoint_sensor(
    feed: Feed,
    *,
    policy: StreamHealthPolicy | None = None,
    minimum_interval_seconds: int = 15,
    health_report_seconds: float = 300.0,
    target: AssetSelection | None = None,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
):
    """The checkpoint sensor of one bronze stream.

    Args:
        feed: the streamed feed.
        policy: stall and backlog bounds of the health figures.
        minimum_interval_seconds: how often the daemon ticks it.
        health_report_seconds: report unchanged health figures at most this often.
        target: what the requested runs materialize (default: everything downstream of the bronze asset).
        default_status: whether the sensor runs without being switched on.
    """
    if not feed.is_stream:
        raise ValueError(f"bronze.{feed.name} is a snapshot, not a stream: it has no checkpoint to follow")
    stream = feed.name
    policy = policy or StreamHealthPolicy()
    key = feed.bronze_key
    from_kafka = isinstance(feed.source, KafkaTopic)

    options: dict[str, Any] = dict(
        name=f"{stream}_checkpoint_sensor",
        minimum_interval_seconds=minimum_interval_seconds,
        target=target or AssetSelection.assets(key).downstream(include_self=False),
        default_status=default_status,
        description=f"Reports micro-batches of the {stream} stream committed since its cursor as bronze "
        "materializations, requests silver and gold, and reports the stream's "
        + ("consumer lag." if from_kafka else "lag."),
    )

    def evaluate(context: SensorEvaluationContext, lake: LakeResource, kafka: KafkaResource | None):
        cursor = StreamCursor.parse(context.cursor)
        checkpoint = read_checkpoint(lake.checkpoint_dir(stream), lake.filesystem)
        if checkpoint.query_id is None:
            return SkipReason(f"the {stream} stream has no checkpoint yet")
        if cursor.query_id is not None and cursor.query_id != checkpoint.query_id:
            # A new checkpoint (a full refresh): its batches start from 0 again.
            context.log.info(f"{stream}: new query id {checkpoint.query_id}, starting over at batch 0")
            cursor = StreamCursor(query_id=checkpoint.query_id)
        cursor.query_id = checkpoint.query_id
        new_batches = sorted(b for b in checkpoint.commits if b > cursor.last_batch)
        events: list = []
        rows_total = 0
        if new_batches:
            commits = delta_commits_of_query(
                lake.table_path(["bronze", stream]),
                checkpoint.query_id,
                after_batch=cursor.last_batch,
                storage_options=lake.delta_storage_options(),
            )
            for batch in new_batches:
                commit = commits.get(batch)
                rows = commit.rows if commit else 0
                rows_total += rows
                metadata: dict[str, Any] = {
                    "batch_id": batch,
                    "rows": rows,
                    "delta_version": commit.delta_version if commit else -1,
                    "query_id": checkpoint.query_id,
                }
                if from_kafka:
                    # topic -> partition -> [first, end) of the batch.
                    metadata["offset_ranges"] = MetadataValue.json(checkpoint.kafka_range(batch))
                else:
                    files = checkpoint.input_files(batch)
                    metadata["input_files"] = len(files)
                    metadata["files"] = MetadataValue.json([os.path.basename(f) for f in files[:_MAX_LISTED_FILES]])
                    drift = batch_schema_drift(files, feed, lake.filesystem)
                    metadata["schema_drift_rows"] = drift.rows
                    if drift.fields:
                        metadata["schema_drift_fields"] = MetadataValue.json(drift.fields)
                if commit and commit.timestamp_ms:
                    metadata["committed_at"] = MetadataValue.timestamp(commit.timestamp_ms / 1000)
                events.append(
                    AssetMaterialization(
                        asset_key=key,
                        description=f"micro-batch {batch} of the {stream} stream",
                        metadata=metadata,
                    )
                )
            cursor.last_batch = new_batches[-1]
        health: KafkaLag | StreamHealth | None
        if from_kafka:
            health = kafka_lag(lake, kafka, feed) if kafka is not None and kafka.configured else None
        else:
            health = stream_health(lake, feed, policy)
        now = time.time()
        if health is not None and (
            new_batches
            or health.passed != cursor.health_passed
            or now - cursor.health_reported_at >= health_report_seconds
        ):
            events.extend(_health_events(stream, health))
            cursor.health_passed = health.passed
            cursor.health_reported_at = now
        elif health is None and new_batches:
            events.append(AssetObservation(asset_key=key, description="no Kafka source configured: lag not measured"))
        run_requests = []
        if new_batches and rows_total:
            run_requests.append(
                RunRequest(
                    run_key=f"{stream}:{checkpoint.query_id}:{new_batches[0]}-{new_batches[-1]}",
                    tags={"medallion/stream": stream, "medallion/batches": f"{new_batches[0]}-{new_batches[-1]}"},
                )
            )
        return SensorResult(
            run_requests=run_requests,
            asset_events=events,
            cursor=cursor.dump(),
            skip_reason=None if (events or run_requests) else f"no new batch of {stream}",
        )

    if from_kafka:

        @sensor(**options)
        def _kafka_checkpoint_sensor(context: SensorEvaluationContext, lake: LakeResource, kafka: KafkaResource):
            return evaluate(context, lake, kafka)

        return _kafka_checkpoint_sensor

    @sensor(**options)
    def _checkpoint_sensor(context: SensorEvaluationContext, lake: LakeResource):
        return evaluate(context, lake, None)

    return _checkpoint_sensor


def _check_result(health: StreamHealth | KafkaLag, *, healthy: str) -> AssetCheckResult:
    """A blocking ``stream_health`` result: ``health``'s verdict, metadata and problems (or ``healthy``)."""
    return AssetCheckResult(
        passed=health.passed,
        severity=AssetCheckSeverity.ERROR,
        metadata=health.metadata(),
        description="; ".join(health.problems) or healthy,
    )


def build_stream_health_check(feed: Feed, *, policy: StreamHealthPolicy | None = None):
    """The ``stream_health`` asset check of a bronze stream's asset (consumer lag for a Kafka feed)."""
    if isinstance(feed.source, KafkaTopic):
        return build_kafka_lag_check(feed)
    stream = feed.name
    policy = policy or StreamHealthPolicy()

    @asset_check(
        asset=bronze_key(stream),
        name=HEALTH_CHECK_NAME,
        description=f"Fails when a planned micro-batch of {stream} has not committed within "
        f"{policy.stall_after_seconds:.0f}s, or a landed file waits longer than "
        f"{policy.max_backlog_age_seconds:.0f}s for a batch.",
    )
    def _stream_health(lake: LakeResource) -> AssetCheckResult:
        return _check_result(stream_health(lake, feed, policy), healthy="stream healthy")

    return _stream_health


def build_kafka_lag_check(feed: Feed):
    """The ``stream_health`` check of a Kafka feed's bronze table: consumer lag per partition against its limits.

    Args:
        feed: the Kafka feed.
    """
    feed = kafka_feed(feed)

    @asset_check(
        asset=feed.bronze_key,
        name=HEALTH_CHECK_NAME,
        description="Fails when the Kafka stream's consumer lag (the broker's latest offsets against the "
        "checkpoint's committed ones) passes the Kafka resource's max_lag_messages, or messages "
        "wait and no batch has committed for its stall_after_seconds.",
    )
    def _kafka_lag(lake: LakeResource, kafka: KafkaResource) -> AssetCheckResult:
        if not kafka.configured:
            return AssetCheckResult(passed=True, description="no Kafka source in this deployment: nothing to lag")
        return _check_result(kafka_lag(lake, kafka, feed), healthy="consumer lag within bounds")

    return _kafka_lag


@dataclass
class LandingCursor:
    """The newest landed file a landing sensor has seen: its mtime and the names at that mtime."""

    mtime: float = 0.0
    names: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> "LandingCursor":
        if not text:
            return cls()
        data = json.loads(text)
        return cls(float(data["mtime"]), tuple(data["names"]))

    def dump(self) -> str:
        return json.dumps({"mtime": self.mtime, "names": sorted(self.names)})


def _all_landed(lake: LakeResource, feeds: tuple[Feed, ...]) -> dict[str, float]:
    found: dict[str, float] = {}
    for feed in feeds:
        found.update(landed_files(lake, feed))
    return found


def build_landing_sensor(
    job,
    *,
    feeds: tuple[Feed, ...],
    minimum_interval_seconds: int = 30,
    default_status: DefaultSensorStatus = DefaultSensorStatus.STOPPED,
):
    """Triggered mode: newly landed files of any feed request a run of ``job`` (the ingest).

    Args:
        job: the ingest job.
        feeds: the feeds whose landing folders it watches.

    The run key is a digest of the new files' names, so one set of files
    never starts two runs, even if the cursor were lost.
    """

    @sensor(
        name="landing_sensor",
        job=job,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=default_status,
        description="Requests an ingest run when new files land under landing/ (one run per set of files).",
    )
    def _landing_sensor(context: SensorEvaluationContext, lake: LakeResource):
        cursor = LandingCursor.parse(context.cursor)
        files = _all_landed(lake, tuple(feeds))
        new = sorted(
            path
            for path, mtime in files.items()
            if mtime > cursor.mtime or (mtime == cursor.mtime and path not in cursor.names)
        )
        if not new:
            return SkipReason("no new files in landing/")
        newest = max(files[p] for p in new)
        at_newest = tuple(p for p, t in files.items() if t == newest)
        digest = hashlib.sha1("\n".join(new).encode()).hexdigest()[:20]
        return SensorResult(
            run_requests=[RunRequest(run_key=f"landing-{digest}", tags={"medallion/landed_files": str(len(new))})],
            cursor=LandingCursor(newest, at_newest).dump(),
        )

    return _landing_sensor


def stream_sensors(feeds: tuple[Feed, ...], policy: StreamHealthPolicy | None = None) -> list:
    """A checkpoint sensor per streamed feed (landed files and Kafka), of ``feeds``."""
    return [build_checkpoint_sensor(f, policy=policy) for f in stream_feeds(feeds)]


def stream_health_checks(feeds: tuple[Feed, ...], policy: StreamHealthPolicy | None = None) -> list:
    """A ``stream_health`` check per streamed feed's bronze asset (consumer lag for a Kafka feed)."""
    return [build_stream_health_check(f, policy=policy) for f in stream_feeds(feeds)]
