"""Continuous bronze ingestion, and what the streams' checkpoints say about them.

Two halves:

* Running: :func:`run_continuous` starts the bronze streams with a
  processing-time trigger, logs each micro-batch's progress as Spark reports
  it, and stops the queries cleanly on SIGTERM / Ctrl-C (or when a caller's
  ``should_stop`` says so). ``medallion-assets stream`` and the
  ``bronze_streams_continuous`` Dagster job both call it.
* Reading: :func:`read_checkpoint` parses a checkpoint folder (``metadata``,
  ``offsets/N``, ``commits/N``, ``sources/0/N[.compact]``);
  :func:`delta_commits_of_query` finds a query's batches in the Delta
  table's history as delta-rs reads it; :func:`stream_health` measures the
  backlog and a pending batch's age. The sensors and the asset check are
  built on these (:mod:`medallion_assets.sensors`).

Nothing here runs at import.
"""


import json
import logging
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

from dagster import Config, OpExecutionContext, job, op
from pydantic import Field

from medallion_assets.contract import BRONZE_STREAMS, CUSTOMER_CSV_COLUMNS, LANDING_STREAMS, unknown_order_fields
from medallion_assets.kafka import KafkaResource
from medallion_assets.resources import LakeResource, SparkResource, kafka_resource, spark_resource

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- configuration


class StreamRateLimit(Config):
    """Admission control of one stream's micro-batches."""

    max_files_per_trigger: int | None = Field(
        default=None, description="At most this many landed files per micro-batch (None: no limit)."
    )
    max_bytes_per_trigger: str | None = Field(
        default=None, description="At most about this many bytes per micro-batch, e.g. '64m' (None: no limit)."
    )


class ContinuousStreamsConfig(Config):
    """How the bronze streams run in continuous mode."""

    streams: list[str] = Field(
        default_factory=lambda: [*BRONZE_STREAMS, "orders_kafka"],
        description="Bronze streams to run; orders_kafka runs where the Kafka resource is configured.",
    )
    trigger_interval: str = Field(
        default="10 seconds", description="Processing-time trigger: how often a micro-batch is planned."
    )
    rate_limits: dict[str, StreamRateLimit] = Field(
        default_factory=dict, description="Per stream (by name) rate limits; streams not listed have none."
    )
    run_seconds: float | None = Field(
        default=None, description="Stop after this many seconds (None: until stopped or terminated)."
    )
    poll_seconds: float = Field(default=1.0, description="How often progress is polled and logged.")


class StreamHealthPolicy(Config):
    """When a stream counts as stalled or behind."""

    stall_after_seconds: float = Field(
        default=600.0, description="A planned micro-batch (offset written) not committed for this long fails the check."
    )
    max_backlog_age_seconds: float = Field(
        default=1800.0, description="A landed file no offset covers yet, older than this, fails the check."
    )


# ---------------------------------------------------------------- continuous runner


def _progress_line(stream: str, progress: Mapping[str, Any]) -> str:
    duration = progress.get("durationMs", {}).get("triggerExecution")
    rate = progress.get("processedRowsPerSecond")
    return (
        f"{stream}: batch {progress.get('batchId')} input_rows={progress.get('numInputRows')} "
        f"rows_per_second={rate if rate is None else round(float(rate), 1)} batch_duration_ms={duration}"
    )


@dataclass
class ContinuousRun:
    """What a continuous run did: per stream, the progress of each batch with input."""

    progress: dict[str, list[dict]] = field(default_factory=dict)
    stopped_by: str = ""


def run_continuous(
    spark,
    lake: LakeResource,
    config: ContinuousStreamsConfig,
    *,
    log_progress: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    install_signal_handlers: bool = True,
    kafka=None,
) -> ContinuousRun:
    """Run the bronze streams with a processing-time trigger until stopped.

    Stops on SIGTERM or SIGINT (when ``install_signal_handlers`` and on the
    main thread), when ``should_stop()`` turns true, after
    ``config.run_seconds``, or when a query fails (its error is raised after
    the others are stopped). Each stop waits for the running micro-batch, so
    the checkpoint and the table agree when it returns. ``orders_kafka``
    runs when ``kafka`` (a :class:`~medallion_assets.kafka.KafkaResource`) is
    configured, and is skipped with a log line otherwise.
    """
    from medallion_assets.ingest import start_bronze_stream, start_kafka_stream
    from medallion_assets.kafka import KAFKA_STREAM

    say = log_progress or log.info
    stop = threading.Event()
    previous: dict[int, Any] = {}
    if install_signal_handlers and threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            say(f"signal {signal.Signals(signum).name}: stopping the streams")
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, handler)
    queries = {}
    result = ContinuousRun(progress={s: [] for s in config.streams})
    seen: dict[str, int] = {}
    started = time.monotonic()
    failure: BaseException | None = None

    def drain(stream, query) -> None:
        # Log each batch with input once, as Spark's query progress reports it.
        # Idle triggers report the next batch id with no rows; only a batch with input counts as seen.
        for progress in query.recentProgress:
            batch = int(progress.get("batchId", -1))
            if batch <= seen.get(stream, -1) or not progress.get("numInputRows"):
                continue
            seen[stream] = batch
            result.progress[stream].append(dict(progress))
            say(_progress_line(stream, progress))

    try:
        for stream in config.streams:
            if stream == KAFKA_STREAM:
                if kafka is None or not kafka.configured:
                    say(f"{stream}: no Kafka source configured, not started")
                    result.progress.pop(stream, None)
                    continue
                queries[stream] = start_kafka_stream(
                    spark, lake, kafka, trigger={"processingTime": config.trigger_interval},
                    query_name=f"bronze_{stream}_continuous",
                )
                say(f"{stream}: started on {kafka.describe()} (trigger every {config.trigger_interval})")
                continue
            limits = config.rate_limits.get(stream, StreamRateLimit())
            queries[stream] = start_bronze_stream(
                spark, lake, stream,
                trigger={"processingTime": config.trigger_interval},
                max_files_per_trigger=limits.max_files_per_trigger,
                max_bytes_per_trigger=limits.max_bytes_per_trigger,
                query_name=f"bronze_{stream}_continuous",
            )
            say(f"{stream}: started (trigger every {config.trigger_interval}, query id {queries[stream].id})")
        # run_seconds is streaming time: starting the queries (creating a bronze
        # table on a cold JVM) can take longer than a short run itself.
        started = time.monotonic()
        while True:
            for stream, query in queries.items():
                drain(stream, query)
                if not query.isActive:
                    failure = query.exception() or RuntimeError(f"stream {stream} stopped on its own")
            if failure is not None:
                result.stopped_by = "failure"
                break
            if stop.is_set():
                result.stopped_by = "signal"
                break
            if should_stop is not None and should_stop():
                result.stopped_by = "request"
                break
            if config.run_seconds is not None and time.monotonic() - started >= config.run_seconds:
                result.stopped_by = "run_seconds"
                break
            stop.wait(config.poll_seconds)
    except KeyboardInterrupt:
        result.stopped_by = "interrupt"
    finally:
        for stream, query in queries.items():
            try:
                query.stop()
                drain(stream, query)  # the batch that finished while stopping
            except Exception as exc:  # keep stopping the others
                say(f"{stream}: stop failed: {exc}")
        for sig, old in previous.items():
            signal.signal(sig, old)
        say(f"streams stopped ({result.stopped_by or 'error'})")
    if failure is not None:
        raise RuntimeError(f"a bronze stream failed: {failure}") from (failure if isinstance(failure, BaseException) else None)
    return result


@op(description="Run the bronze streams continuously (processing-time trigger) until the run is terminated.")
def run_bronze_streams(context: OpExecutionContext, config: ContinuousStreamsConfig, spark: SparkResource,
                       lake: LakeResource, kafka: KafkaResource) -> None:
    """Dagster's side of continuous mode: terminating the run stops the streams cleanly."""
    run_continuous(spark.spark_session, lake, config, log_progress=context.log.info, kafka=kafka)


@job(description="Continuous bronze ingestion: the streams run until this run is terminated; "
                 "the checkpoint sensors report their batches and request silver and gold.")
def bronze_streams_continuous():
    run_bronze_streams()


def _parse_pairs(values: Iterable[str], what: str) -> dict[str, str]:
    pairs = {}
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or name not in BRONZE_STREAMS:
            raise SystemExit(f"{what} takes STREAM=VALUE with STREAM one of {', '.join(BRONZE_STREAMS)}; got {item!r}")
        pairs[name] = value
    return pairs


def add_stream_parser(subcommands) -> None:
    """The ``stream`` subcommand: continuous bronze ingestion."""
    parser = subcommands.add_parser(
        "stream", help="Run the bronze streams continuously; stop with Ctrl-C or SIGTERM.",
        description="Start the bronze streams with a processing-time trigger, log each micro-batch "
                    "and stop cleanly on SIGTERM or Ctrl-C.",
    )
    parser.add_argument("--lake-root", default=None, help="Lake root (default: $MEDALLION_LAKE_ROOT or ./lakehouse).")
    streams = [*BRONZE_STREAMS, "orders_kafka"]
    parser.add_argument("--streams", nargs="+", default=streams, choices=streams,
                        help="Streams to run (orders_kafka where MEDALLION_KAFKA_BOOTSTRAP_SERVERS is set).")
    parser.add_argument("--trigger-interval", default="10 seconds", help="Processing-time trigger, e.g. '5 seconds'.")
    parser.add_argument("--max-files-per-trigger", action="append", metavar="STREAM=N", default=[],
                        help="Per-stream cap on files per micro-batch (repeatable).")
    parser.add_argument("--max-bytes-per-trigger", action="append", metavar="STREAM=SIZE", default=[],
                        help="Per-stream cap on bytes per micro-batch, e.g. orders_raw=64m (repeatable).")
    parser.add_argument("--run-seconds", type=float, default=None, help="Stop after this many seconds.")
    parser.set_defaults(func=_stream_command)


def _stream_command(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    files = {k: int(v) for k, v in _parse_pairs(args.max_files_per_trigger, "--max-files-per-trigger").items()}
    size = _parse_pairs(args.max_bytes_per_trigger, "--max-bytes-per-trigger")
    limits = {
        s: StreamRateLimit(max_files_per_trigger=files.get(s), max_bytes_per_trigger=size.get(s))
        for s in set(files) | set(size)
    }
    config = ContinuousStreamsConfig(streams=args.streams, trigger_interval=args.trigger_interval,
                                     rate_limits=limits, run_seconds=args.run_seconds)
    root = args.lake_root or os.environ.get("MEDALLION_LAKE_ROOT")
    lake = LakeResource(root=root) if root else LakeResource()
    # The deployed resource (MEDALLION_DEPLOYMENT) with its engine choice (MEDALLION_DELTA_ENGINE,
    # DELTA_SPARK_JARS, MEDALLION_DELTA_SPARK_MAVEN); outside Dagster its EnvVars resolve here.
    deployment = os.environ.get("MEDALLION_DEPLOYMENT", "local")
    spark = spark_resource(deployment).process_config_and_initialize().spark_session
    kafka = kafka_resource(resolved=True)
    try:
        run_continuous(spark, lake, config, log_progress=lambda line: print(line, flush=True), kafka=kafka)
    finally:
        spark.stop()
    return 0


# ---------------------------------------------------------------- checkpoints


def _local(path: str) -> str:
    if path.startswith("file:"):
        return unquote(urlparse(path).path)
    if "://" in path:
        raise ValueError(f"reading checkpoints on object stores is not supported here: {path}")
    return path


def _numbered(folder: str) -> dict[int, float]:
    """``N -> mtime`` of the log files ``N`` in a checkpoint sub-folder."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        if name.isdigit():
            try:
                found[int(name)] = os.path.getmtime(os.path.join(folder, name))
            except FileNotFoundError:
                pass
    return found


def _log_entries(path: str) -> list[dict]:
    """The JSON lines after the version line of a checkpoint log file."""
    with open(path) as handle:
        lines = handle.read().splitlines()
    return [json.loads(line) for line in lines[1:] if line.strip()]


@dataclass(frozen=True)
class Checkpoint:
    """A stream's checkpoint folder, read once."""

    location: str
    query_id: str | None
    offsets: dict[int, float]
    """Planned batch id -> time its offset file was written."""
    commits: dict[int, float]
    """Committed batch id -> time its commit file was written."""

    @property
    def last_committed(self) -> int:
        return max(self.commits, default=-1)

    @property
    def last_planned(self) -> int:
        return max(self.offsets, default=-1)

    def pending(self) -> list[int]:
        """Batches planned but not committed (at most one in a healthy stream)."""
        return sorted(b for b in self.offsets if b not in self.commits and b > self.last_committed)

    def input_files(self, batch_id: int, source: int = 0) -> list[str]:
        """The files a file source gave batch ``batch_id`` (from ``sources/<source>/N`` or a compact file)."""
        folder = os.path.join(self.location, "sources", str(source))
        plain = os.path.join(folder, str(batch_id))
        if os.path.exists(plain):
            return [e["path"] for e in _log_entries(plain)]
        compacts = sorted(
            int(n.split(".")[0]) for n in _listdir(folder) if n.endswith(".compact") and n.split(".")[0].isdigit()
        )
        for number in compacts:
            if number >= batch_id:
                entries = _log_entries(os.path.join(folder, f"{number}.compact"))
                return [e["path"] for e in entries if e.get("batchId") == batch_id]
        return []

    def seen_files(self, source: int = 0) -> set[str]:
        """Every file any offset of the file source covers."""
        folder = os.path.join(self.location, "sources", str(source))
        names = _listdir(folder)
        compacts = sorted((int(n.split(".")[0]) for n in names if n.endswith(".compact") and n.split(".")[0].isdigit()))
        start = compacts[-1] if compacts else -1
        seen: set[str] = set()
        if compacts:
            seen.update(e["path"] for e in _log_entries(os.path.join(folder, f"{start}.compact")))
        for name in names:
            if name.isdigit() and int(name) > start:
                seen.update(e["path"] for e in _log_entries(os.path.join(folder, name)))
        return seen

    def source_offset(self, batch_id: int, source: int = 0) -> Any:
        """The offset ``offsets/<batch_id>`` records for a source (for Kafka: topic -> partition -> next offset)."""
        try:
            entries = _log_entries(os.path.join(self.location, "offsets", str(batch_id)))
        except FileNotFoundError:
            return None
        # After the version line: the batch metadata, then one offset per source.
        return entries[1 + source] if len(entries) > 1 + source else None

    def kafka_start_offsets(self, source: int = 0) -> dict[str, dict[str, int]]:
        """The offsets a Kafka source started from when the checkpoint was created (``sources/<n>/0``)."""
        path = os.path.join(self.location, "sources", str(source), "0")
        try:
            with open(path, "rb") as handle:
                # A length/version prefix, then the JSON on the last line.
                last = handle.read().splitlines()[-1]
            return json.loads(last.decode("utf-8"))
        except (FileNotFoundError, IndexError, ValueError):
            return {}

    def kafka_range(self, batch_id: int, source: int = 0) -> dict[str, dict[str, list[int]]]:
        """topic -> partition -> ``[first, end)`` offsets of a Kafka batch."""
        end = self.source_offset(batch_id, source) or {}
        start = self.source_offset(batch_id - 1, source) if batch_id > 0 else None
        start = start or self.kafka_start_offsets(source)
        return {
            topic: {p: [int(start.get(topic, {}).get(p, 0)), int(o)] for p, o in sorted(parts.items(), key=lambda i: int(i[0]))}
            for topic, parts in end.items()
        }

    def kafka_committed_offsets(self, topic: str, source: int = 0) -> dict[int, int]:
        """partition -> next offset to read, after the last committed batch (the start offsets if none)."""
        if self.last_committed >= 0:
            offsets = (self.source_offset(self.last_committed, source) or {}).get(topic, {})
        else:
            offsets = self.kafka_start_offsets(source).get(topic, {})
        return {int(p): int(o) for p, o in offsets.items()}


def _listdir(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except FileNotFoundError:
        return []


def read_checkpoint(location: str) -> Checkpoint:
    """Read a checkpoint folder (missing folders read as an empty checkpoint)."""
    folder = _local(location)
    query_id = None
    try:
        with open(os.path.join(folder, "metadata")) as handle:
            query_id = json.loads(handle.readline()).get("id")
    except (FileNotFoundError, ValueError):
        pass
    return Checkpoint(folder, query_id, _numbered(os.path.join(folder, "offsets")),
                      _numbered(os.path.join(folder, "commits")))


@dataclass(frozen=True)
class BatchCommit:
    """A micro-batch as the bronze table's log records it."""

    batch_id: int
    delta_version: int
    rows: int
    data_files: int
    timestamp_ms: int | None


#: Commits asked of delta-rs's history per round; doubled while the stop batch is not reached.
_HISTORY_PAGE = 32


def _query_batch(info: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """The streaming query and batch id a commitInfo names (None, None for other commits).

    delta-spark's DeltaSink and the delta-rs engine's sink both record them as
    ``operationParameters`` ``queryId`` / ``epochId``. Commits of the delta-rs
    sink before it did carry the top-level ``streamingQueryId`` /
    ``streamingBatchId`` instead; they are still read so an existing table's
    batches keep their versions.
    """
    params = info.get("operationParameters") or {}
    if params.get("queryId") is not None and params.get("epochId") is not None:
        return str(params["queryId"]), int(params["epochId"])
    if info.get("streamingQueryId") is not None and info.get("streamingBatchId") is not None:
        return str(info["streamingQueryId"]), int(info["streamingBatchId"])
    return None, None


def _metric(metrics: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        if metrics.get(name) is not None:
            return int(metrics[name])
    return None


def _added_by_commit(table, version: int) -> tuple[int, int]:
    """Rows and files commit ``version`` added, from delta-rs's snapshots at it and before it.

    Only for a commit whose commitInfo has no row count (delta-spark with
    ``spark.databricks.delta.history.metricsEnabled=false``, the delta-rs sink
    before it recorded them): two snapshot loads, where the metrics cost nothing.
    """
    import pyarrow as pa
    from deltalake import DeltaTable

    def files(at: int) -> dict[str, int]:
        if at < 0:
            return {}
        actions = pa.table(DeltaTable(table.table_uri, version=at).get_add_actions(flatten=True))
        return dict(zip(actions.column("path").to_pylist(),
                        (n or 0 for n in actions.column("num_records").to_pylist())))

    before, after = files(version - 1), files(version)
    added = [rows for path, rows in after.items() if path not in before]
    return sum(added), len(added)


def delta_commits_of_query(table: str, query_id: str, *, after_batch: int = -1) -> dict[int, BatchCommit]:
    """Batch id -> Delta commit, for the commits ``query_id``'s stream sink made.

    delta-rs reads the table's history (commitInfo), newest first, a page at a
    time, and the reading stops at the first batch at or below
    ``after_batch``, so a sensor tick reads only the recent log. Rows and files
    are the sink's ``operationMetrics`` (``numOutputRows``, ``numAddedFiles``;
    delta-rs's own writes call them ``num_added_rows``, ``num_added_files``).
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        delta_table = DeltaTable(table)
    except TableNotFoundError:
        return {}
    found: dict[int, BatchCommit] = {}
    limit, seen = _HISTORY_PAGE, 0
    while True:
        history = delta_table.history(limit=limit)
        # A commit made between two rounds shifts the list by one: a commit is
        # then looked at twice (setdefault keeps the first), never skipped.
        for info in history[seen:]:
            query, batch = _query_batch(info)
            if query != query_id or batch is None:
                continue
            if batch <= after_batch:
                return found
            if batch in found:
                continue
            metrics = info.get("operationMetrics") or {}
            rows = _metric(metrics, "numOutputRows", "num_added_rows")
            files = _metric(metrics, "numAddedFiles", "num_added_files")
            if rows is None or files is None:
                rows, files = _added_by_commit(delta_table, int(info["version"]))
            found[batch] = BatchCommit(batch, int(info["version"]), rows, files, info.get("timestamp"))
        if len(history) < limit:
            return found
        seen, limit = len(history), limit * 2


class _Verdict:
    """A health verdict: it passes when no problem was found."""

    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class StreamHealth(_Verdict):
    """Backlog and stall figures of one stream, and the verdict of the policy."""

    stream: str
    last_committed_batch: int
    pending_batch: int | None
    pending_batch_age_seconds: float
    backlog_files: int
    oldest_backlog_age_seconds: float
    problems: list[str]

    def metadata(self) -> dict[str, Any]:
        return {
            "last_committed_batch": self.last_committed_batch,
            "pending_batch": -1 if self.pending_batch is None else self.pending_batch,
            "pending_batch_age_seconds": round(self.pending_batch_age_seconds, 1),
            "backlog_files": self.backlog_files,
            "oldest_backlog_age_seconds": round(self.oldest_backlog_age_seconds, 1),
        }


def landed_files(lake: LakeResource, stream: str) -> dict[str, float]:
    """The visible files of a stream's landing folder: ``file://`` URI -> mtime."""
    from pathlib import Path

    from medallion_assets.transforms.bronze import is_visible_data_file

    folder = Path(_local(lake.landing_folder(stream)))
    if not folder.is_dir():
        return {}
    found = {}
    for entry in os.scandir(folder):
        if entry.is_file() and is_visible_data_file(entry.name) and entry.name.endswith(LANDING_STREAMS[stream].suffix):
            found[Path(entry.path).resolve().as_uri()] = entry.stat().st_mtime
    return found


def stream_health(lake: LakeResource, stream: str, policy: StreamHealthPolicy, *, now: float | None = None) -> StreamHealth:
    """Measure one stream's backlog and pending batch against ``policy``."""
    now = time.time() if now is None else now
    checkpoint = read_checkpoint(lake.checkpoint_dir(stream))
    pending = checkpoint.pending()
    pending_batch = pending[0] if pending else None
    pending_age = now - checkpoint.offsets[pending_batch] if pending_batch is not None else 0.0
    seen = {_same_uri(p) for p in checkpoint.seen_files()}
    backlog = {p: t for p, t in landed_files(lake, stream).items() if p not in seen}
    oldest = now - min(backlog.values()) if backlog else 0.0
    problems = _stalled_batch(checkpoint, now, policy.stall_after_seconds)
    if backlog and oldest > policy.max_backlog_age_seconds:
        problems.append(
            f"{len(backlog)} landed file(s) not taken by any batch, the oldest {oldest:.0f}s old "
            f"(limit {policy.max_backlog_age_seconds:.0f}s): the stream is not running or falls behind"
        )
    return StreamHealth(stream, checkpoint.last_committed, pending_batch, max(pending_age, 0.0), len(backlog),
                        max(oldest, 0.0), problems)


def _stalled_batch(checkpoint: Checkpoint, now: float, limit_seconds: float) -> list[str]:
    """The problem of a planned batch not committed within ``limit_seconds`` (none if there is none)."""
    pending = checkpoint.pending()
    if not pending or now - checkpoint.offsets[pending[0]] <= limit_seconds:
        return []
    age = now - checkpoint.offsets[pending[0]]
    return [f"batch {pending[0]} was planned {age:.0f}s ago and has not committed "
            f"(limit {limit_seconds:.0f}s): the stream is stalled or down"]


def _same_uri(path: str) -> str:
    # Spark writes file:///a/b; Path.as_uri writes the same for local paths.
    if path.startswith("file:/") and not path.startswith("file:///"):
        return "file:///" + path[len("file:/"):]
    return path


def _partition_lag(latest: Mapping[int, int], committed: Mapping[int, int]) -> dict[int, int]:
    """Partition -> messages the broker holds past the checkpoint's next offset."""
    return {p: max(high - committed.get(p, 0), 0) for p, high in latest.items()}


@dataclass(frozen=True)
class KafkaLag(_Verdict):
    """Consumer lag of the Kafka stream per partition, and the verdict of its limits."""

    stream: str
    last_committed_batch: int
    latest: dict[int, int]
    """Partition -> the broker's next offset."""
    committed: dict[int, int]
    """Partition -> the checkpoint's next offset to read."""
    seconds_since_commit: float | None
    problems: list[str]

    @property
    def lag(self) -> dict[int, int]:
        return _partition_lag(self.latest, self.committed)


    def metadata(self) -> dict[str, Any]:
        from dagster import MetadataValue

        return {
            "last_committed_batch": self.last_committed_batch,
            "consumer_lag": sum(self.lag.values()),
            "consumer_lag_per_partition": MetadataValue.json({str(p): v for p, v in self.lag.items()}),
            "latest_offsets": MetadataValue.json({str(p): v for p, v in self.latest.items()}),
            "committed_offsets": MetadataValue.json({str(p): v for p, v in self.committed.items()}),
            "seconds_since_commit": -1.0 if self.seconds_since_commit is None else round(self.seconds_since_commit, 1),
        }


def kafka_lag(lake: LakeResource, kafka, *, now: float | None = None) -> KafkaLag:
    """The Kafka stream's consumer lag: the broker's latest offsets against the checkpoint's committed ones.

    Fails (``problems``) when the lag passes ``kafka.max_lag_messages``, when
    messages wait and no batch has committed for ``kafka.stall_after_seconds``
    (or a planned batch has not committed for that long), and when the broker
    does not answer.
    """
    from medallion_assets.kafka import KAFKA_STREAM, KafkaError, watermark_offsets

    now = time.time() if now is None else now
    checkpoint = read_checkpoint(lake.checkpoint_dir(KAFKA_STREAM))
    committed = checkpoint.kafka_committed_offsets(kafka.topic)
    last_commit = checkpoint.commits.get(checkpoint.last_committed)
    since = now - last_commit if last_commit is not None else None
    try:
        watermarks = watermark_offsets(kafka)
    except KafkaError as error:
        return KafkaLag(KAFKA_STREAM, checkpoint.last_committed, {}, committed, since, [str(error)])
    latest = {p: high for p, (_, high) in watermarks.items()}
    # A partition the checkpoint has not read yet starts at the oldest offset the broker keeps.
    committed = {p: committed.get(p, low) for p, (low, _) in watermarks.items()}
    behind = sum(_partition_lag(latest, committed).values())
    problems: list[str] = []
    if behind > kafka.max_lag_messages:
        problems.append(
            f"consumer lag {behind} messages on {kafka.topic!r} (limit {kafka.max_lag_messages}): "
            "the stream is not running or falls behind"
        )
    # Before the first commit only the lag limit applies: there is no commit to be late against.
    if behind and since is not None and since > kafka.stall_after_seconds:
        problems.append(
            f"{behind} message(s) wait and no batch has committed for {since:.0f}s "
            f"(limit {kafka.stall_after_seconds:.0f}s): the stream has stopped committing"
        )
    problems += _stalled_batch(checkpoint, now, kafka.stall_after_seconds)
    return KafkaLag(KAFKA_STREAM, checkpoint.last_committed, latest, committed, since, problems)


# ---------------------------------------------------------------- schema drift


@dataclass(frozen=True)
class SchemaDrift:
    """Landed rows of a batch carrying fields the landing contract does not define (kept raw in bronze)."""

    rows: int
    fields: list[str]


def batch_schema_drift(input_files: list[str], stream: str) -> SchemaDrift:
    """Count a batch's landed rows with fields unknown to the contract.

    ``orders_raw``: each line of the batch's input files, by the contract's
    :func:`~medallion_assets.contract.unknown_order_fields`; ``customers_cdc``:
    the header of each input file (a CSV with an extra column keeps the row
    raw in ``_corrupt_record``). Files already removed from landing are not
    counted.
    """
    rows, fields = 0, set()
    if stream == "orders_raw":
        for uri in input_files:
            try:
                # Undecodable bytes are replaced, as bronze stores them; the JSON rule sees the same text.
                with open(_local(uri), encoding="utf-8", errors="replace") as handle:
                    for line in handle:
                        extra = unknown_order_fields(line) if line.strip() else set()
                        if extra:
                            rows += 1
                            fields |= extra
            except FileNotFoundError:
                continue
        return SchemaDrift(rows, sorted(fields))
    for uri in input_files:
        try:
            with open(_local(uri)) as handle:
                header = handle.readline().strip().split(",")
                extra = [c for c in header if c and c not in CUSTOMER_CSV_COLUMNS]
                if extra:
                    fields |= set(extra)
                    rows += sum(1 for line in handle if line.strip())
        except FileNotFoundError:
            continue
    return SchemaDrift(rows, sorted(fields))


# ---------------------------------------------------------------- protection of bronze


class FullRefreshRefusedError(RuntimeError):
    """A full refresh of a streaming bronze table was asked for, but the asset does not allow it."""


def full_refresh_stream(lake: LakeResource, stream: str, *, allowed: bool) -> None:
    """Drop a bronze stream's checkpoint and table, so the next run re-ingests all of landing/.

    Raises:
        FullRefreshRefusedError: unless ``allowed`` (the asset's ``allow_full_refresh``).
    """
    if not allowed:
        raise FullRefreshRefusedError(
            f"refusing a full refresh of bronze.{stream}: it drops the stream's checkpoint and every row "
            "ingested so far, and landing/ may no longer hold all the files bronze was built from. "
            f"Configure the asset with allow_full_refresh=True if the landed files are complete"
        )
    for path in (lake.checkpoint_dir(stream), lake.table_path(["bronze", stream])):
        shutil.rmtree(_local(path), ignore_errors=True)
