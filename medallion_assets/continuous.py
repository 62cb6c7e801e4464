"""Continuous bronze ingestion: the bronze streams on a processing-time trigger until stopped.

:func:`run_continuous` starts the bronze streams with a processing-time
trigger, logs each micro-batch's progress as Spark reports it, and stops the
queries cleanly on SIGTERM / Ctrl-C (or when a caller's ``should_stop`` says
so). ``medallion-assets stream`` (:func:`add_stream_parser`) and the
``bronze_streams_continuous`` Dagster job both call it. What the running
streams did is read back from their checkpoints
(:mod:`medallion_assets.checkpoints`) by the sensors.

Nothing here runs at import.
"""

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dagster import Config, OpExecutionContext, job, op
from pydantic import Field

from medallion_assets.feeds import KafkaTopic, feed_named, stream_feeds
from medallion_assets.ingest import start_bronze_stream, start_kafka_stream
from medallion_assets.kafka import KafkaResource
from medallion_assets.project import project_feeds
from medallion_assets.resources import LakeResource, SparkResource, kafka_resource, lake_resource, spark_resource
from medallion_assets.settings import LakeRoot, SettingsError, read_settings

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
        default_factory=lambda: [feed.name for feed in stream_feeds(project_feeds())],
        description="Bronze streams to run, by feed name (default: every streamed feed); a Kafka feed runs "
        "where the Kafka resource is configured.",
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
    the checkpoint and the table agree when it returns. A Kafka feed's
    stream runs when ``kafka`` (a :class:`~medallion_assets.kafka.KafkaResource`)
    is configured, and is skipped with a log line otherwise.
    """
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
            feed = feed_named(stream, project_feeds())
            if isinstance(feed.source, KafkaTopic):
                if kafka is None or not kafka.configured:
                    say(f"{stream}: no Kafka source configured, not started")
                    result.progress.pop(stream, None)
                    continue
                queries[stream] = start_kafka_stream(
                    spark,
                    lake,
                    kafka,
                    feed,
                    trigger={"processingTime": config.trigger_interval},
                    query_name=f"bronze_{stream}_continuous",
                )
                say(f"{stream}: started on {kafka.for_feed(feed).describe()} (trigger every {config.trigger_interval})")
                continue
            limits = config.rate_limits.get(stream, StreamRateLimit())
            queries[stream] = start_bronze_stream(
                spark,
                lake,
                feed,
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
        for signum, old in previous.items():
            signal.signal(signum, old)
        say(f"streams stopped ({result.stopped_by or 'error'})")
    if failure is not None:
        raise RuntimeError(f"a bronze stream failed: {failure}") from (
            failure if isinstance(failure, BaseException) else None
        )
    return result


@op(description="Run the bronze streams continuously (processing-time trigger) until the run is terminated.")
def run_bronze_streams(
    context: OpExecutionContext,
    config: ContinuousStreamsConfig,
    spark: SparkResource,
    lake: LakeResource,
    kafka: KafkaResource,
) -> None:
    """Dagster's side of continuous mode: terminating the run stops the streams cleanly."""
    run_continuous(spark.session_by_path, lake, config, log_progress=context.log.info, kafka=kafka)


@job(
    description="Continuous bronze ingestion: the streams run until this run is terminated; "
    "the checkpoint sensors report their batches and request silver and gold."
)
def bronze_streams_continuous():
    run_bronze_streams()


def _parse_pairs(values: Iterable[str], what: str) -> dict[str, str]:
    pairs = {}
    landed = [feed.name for feed in stream_feeds(project_feeds()) if not isinstance(feed.source, KafkaTopic)]
    for item in values or []:
        name, sep, value = item.partition("=")
        if not sep or name not in landed:
            raise SystemExit(f"{what} takes STREAM=VALUE with STREAM one of {', '.join(landed)}; got {item!r}")
        pairs[name] = value
    return pairs


def add_stream_parser(subcommands) -> None:
    """The ``stream`` subcommand: continuous bronze ingestion."""
    parser = subcommands.add_parser(
        "stream",
        help="Run the bronze streams continuously; stop with Ctrl-C or SIGTERM.",
        description="Start the bronze streams with a processing-time trigger, log each micro-batch "
        "and stop cleanly on SIGTERM or Ctrl-C.",
    )
    parser.add_argument("--lake-root", default=None, help="Lake root (default: $MEDALLION_LAKE_ROOT or ./lakehouse).")
    # The feed names are checked when the command runs, not listed here: building the parser must not
    # import the pipelines, or one broken pipeline module would break every subcommand (`check` too).
    parser.add_argument(
        "--streams",
        nargs="+",
        default=None,
        metavar="FEED",
        help="Streams to run, by feed name (default: every stream feed; a Kafka feed where "
        "MEDALLION_KAFKA_BOOTSTRAP_SERVERS is set).",
    )
    parser.add_argument("--trigger-interval", default="10 seconds", help="Processing-time trigger, e.g. '5 seconds'.")
    parser.add_argument(
        "--max-files-per-trigger",
        action="append",
        metavar="STREAM=N",
        default=[],
        help="Per-stream cap on files per micro-batch (repeatable).",
    )
    parser.add_argument(
        "--max-bytes-per-trigger",
        action="append",
        metavar="STREAM=SIZE",
        default=[],
        help="Per-stream cap on bytes per micro-batch, e.g. STREAM=64m (repeatable).",
    )
    parser.add_argument("--run-seconds", type=float, default=None, help="Stop after this many seconds.")
    parser.set_defaults(func=_stream_command)


def _stream_command(args) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    known = [feed.name for feed in stream_feeds(project_feeds())]
    unknown = [name for name in args.streams or () if name not in known]
    if unknown:
        raise SystemExit(
            f"medallion-assets stream: --streams {' '.join(unknown)}: no such stream feed; "
            f"choose from {', '.join(known)}"
        )
    args.streams = args.streams or known
    files = {k: int(v) for k, v in _parse_pairs(args.max_files_per_trigger, "--max-files-per-trigger").items()}
    size = _parse_pairs(args.max_bytes_per_trigger, "--max-bytes-per-trigger")
    limits = {
        s: StreamRateLimit(max_files_per_trigger=files.get(s), max_bytes_per_trigger=size.get(s))
        for s in set(files) | set(size)
    }
    config = ContinuousStreamsConfig(
        streams=args.streams, trigger_interval=args.trigger_interval, rate_limits=limits, run_seconds=args.run_seconds
    )
    try:
        settings = read_settings()
    except SettingsError as error:
        raise SystemExit(f"medallion-assets stream: {error}") from None
    if args.lake_root:
        settings = replace(settings, lake_root=LakeRoot(args.lake_root, "--lake-root"))
    lake = lake_resource(settings)
    # The deployed resource (MEDALLION_DEPLOYMENT) with its engine choice (MEDALLION_DELTA_ENGINE,
    # DELTA_SPARK_JARS, MEDALLION_DELTA_SPARK_MAVEN); outside Dagster its EnvVars resolve here.
    spark = spark_resource(settings=settings).process_config_and_initialize().session_by_path
    kafka = kafka_resource(settings, resolved=True)
    try:
        run_continuous(spark, lake, config, log_progress=lambda line: print(line, flush=True), kafka=kafka)
    finally:
        spark.stop()
    return 0
