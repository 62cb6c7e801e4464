"""Verdicts on the bronze streams: backlog and stalled batches, Kafka consumer lag, schema drift.

:func:`stream_health` measures a file stream's backlog and a pending batch's
age against a :class:`StreamHealthPolicy`; :func:`kafka_lag` compares the
broker's latest offsets with the checkpoint's committed ones;
:func:`batch_schema_drift` counts a batch's landed rows with fields the
feed's declaration does not name. The sensors and the asset check are built
on these (:mod:`medallion_assets.sensors`).

Nothing here runs at import.
"""

import io
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagster import Config, MetadataValue
from pyarrow import fs
from pydantic import Field

from medallion_assets.checkpoints import Checkpoint, Locate, locate_local, read_checkpoint
from medallion_assets.feeds import Feed, KafkaTopic, LandingFiles, kafka_feed
from medallion_assets.kafka import KafkaError, watermark_offsets
from medallion_assets.resources import LakeResource
from medallion_assets.transforms.bronze import is_visible_data_file


class StreamHealthPolicy(Config):
    """When a stream counts as stalled or behind."""

    stall_after_seconds: float = Field(
        default=600.0, description="A planned micro-batch (offset written) not committed for this long fails the check."
    )
    max_backlog_age_seconds: float = Field(
        default=1800.0, description="A landed file no offset covers yet, older than this, fails the check."
    )


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


def landed_files(lake: LakeResource, feed: Feed) -> dict[str, float]:
    """The visible data files of a feed's landing folder: URI -> mtime (none for a Kafka feed).

    A local file is named by its resolved ``file://`` URI, a file in a bucket by its ``s3://`` URI
    (:func:`_same_uri`: as the checkpoint's names are compared).
    """
    if isinstance(feed.source, KafkaTopic):
        return {}
    modified = lake.files_modified(lake.landing_folder(feed), feed.source.file_suffix)
    return {
        _same_uri(path): mtime_ns / 1e9
        for path, mtime_ns in modified.items()
        if is_visible_data_file(path.rsplit("/", 1)[-1])
    }


def unseen_landed_files(lake: LakeResource, feed: Feed, checkpoint: Checkpoint | None = None) -> dict[str, float]:
    """The feed's landed files its stream's checkpoint has not taken: ``file://`` URI -> mtime.

    ``checkpoint``: the stream's, when read already (default: read here).
    """
    if checkpoint is None:
        checkpoint = read_checkpoint(lake.checkpoint_dir(feed.name), lake.filesystem)
    seen = {_same_uri(p) for p in checkpoint.seen_files()}
    return {p: t for p, t in landed_files(lake, feed).items() if p not in seen}


def stream_health(
    lake: LakeResource, feed: Feed, policy: StreamHealthPolicy, *, now: float | None = None
) -> StreamHealth:
    """Measure one stream's backlog and pending batch against ``policy``."""
    stream = feed.name
    now = time.time() if now is None else now
    checkpoint = read_checkpoint(lake.checkpoint_dir(stream), lake.filesystem)
    pending = checkpoint.pending()
    pending_batch = pending[0] if pending else None
    pending_age = now - checkpoint.offsets[pending_batch] if pending_batch is not None else 0.0
    backlog = unseen_landed_files(lake, feed, checkpoint)
    oldest = now - min(backlog.values()) if backlog else 0.0
    problems = _stalled_batch(checkpoint, now, policy.stall_after_seconds)
    if backlog and oldest > policy.max_backlog_age_seconds:
        problems.append(
            f"{len(backlog)} landed file(s) not taken by any batch, the oldest {oldest:.0f}s old "
            f"(limit {policy.max_backlog_age_seconds:.0f}s): the stream is not running or falls behind"
        )
    return StreamHealth(
        stream,
        checkpoint.last_committed,
        pending_batch,
        max(pending_age, 0.0),
        len(backlog),
        max(oldest, 0.0),
        problems,
    )


def _stalled_batch(checkpoint: Checkpoint, now: float, limit_seconds: float) -> list[str]:
    """The problem of a planned batch not committed within ``limit_seconds`` (none if there is none)."""
    pending = checkpoint.pending()
    if not pending or now - checkpoint.offsets[pending[0]] <= limit_seconds:
        return []
    age = now - checkpoint.offsets[pending[0]]
    return [
        f"batch {pending[0]} was planned {age:.0f}s ago and has not committed "
        f"(limit {limit_seconds:.0f}s): the stream is stalled or down"
    ]


def _same_uri(path: str) -> str:
    """A landed file as both the checkpoint and :func:`landed_files` name it, to compare them.

    Spark keeps the path it was given (``file:/a/b``, through symlinks such as
    a linked landing folder or macOS's ``/tmp``): a local file is its resolved
    ``file://`` URI. ``s3a://`` and ``s3://`` name the same object (Spark reads
    both through S3A): ``s3://``. Other URIs are kept.
    """
    scheme, _, rest = path.partition("://")
    if rest and scheme.lower() in ("s3", "s3a"):
        return f"s3://{rest}"
    if not path.startswith("file:") and "://" in path:
        return path
    _, local = locate_local(path)
    return Path(local).resolve().as_uri()


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
        return {
            "last_committed_batch": self.last_committed_batch,
            "consumer_lag": sum(self.lag.values()),
            "consumer_lag_per_partition": MetadataValue.json({str(p): v for p, v in self.lag.items()}),
            "latest_offsets": MetadataValue.json({str(p): v for p, v in self.latest.items()}),
            "committed_offsets": MetadataValue.json({str(p): v for p, v in self.committed.items()}),
            "seconds_since_commit": -1.0 if self.seconds_since_commit is None else round(self.seconds_since_commit, 1),
        }


def kafka_lag(
    lake: LakeResource, kafka, feed: Feed, *, now: float | None = None, checkpoint: Checkpoint | None = None
) -> KafkaLag:
    """The Kafka stream's consumer lag: the broker's latest offsets against the checkpoint's committed ones.

    Fails (``problems``) when the lag passes ``kafka.max_lag_messages``, when
    messages wait and no batch has committed for ``kafka.stall_after_seconds``
    (or a planned batch has not committed for that long), and when the broker
    does not answer. ``checkpoint``: the stream's, when the caller has read it already.
    """
    feed = kafka_feed(feed)
    stream, kafka = feed.name, kafka.for_feed(feed)
    now = time.time() if now is None else now
    if checkpoint is None:
        checkpoint = read_checkpoint(lake.checkpoint_dir(stream), lake.filesystem)
    committed = checkpoint.kafka_committed_offsets(kafka.topic)
    last_commit = checkpoint.commits.get(checkpoint.last_committed)
    since = now - last_commit if last_commit is not None else None
    try:
        watermarks = watermark_offsets(kafka)
    except KafkaError as error:
        return KafkaLag(stream, checkpoint.last_committed, {}, committed, since, [str(error)])
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
    return KafkaLag(stream, checkpoint.last_committed, latest, committed, since, problems)


# ---------------------------------------------------------------- schema drift


@dataclass(frozen=True)
class SchemaDrift:
    """Landed rows of a batch carrying fields the landing contract does not define (kept raw in bronze)."""

    rows: int
    fields: list[str]


def _landed_text(uri: str, locate: Locate) -> str | None:
    """A landed file's text, undecodable bytes replaced as bronze stores them; ``None`` once it is removed."""
    filesystem, path = locate(uri)
    if filesystem.get_file_info(path).type != fs.FileType.File:
        return None
    with filesystem.open_input_stream(path) as handle:
        return handle.read().decode("utf-8", errors="replace")


def batch_schema_drift(input_files: list[str], feed: Feed, locate: Locate = locate_local) -> SchemaDrift:
    """Count a batch's landed rows with fields the feed does not declare.

    NDJSON: each line of the batch's input files, by the feed's rule
    (:meth:`~medallion_assets.feeds.Feed.unknown_fields_of_line`); CSV: the
    header of each input file (a CSV with an extra column keeps the row raw in
    ``_corrupt_record``). Files already removed from landing are not counted.
    ``locate`` reaches the files (a landing in a bucket: ``lake.filesystem``).
    """
    rows, fields = 0, set()
    if not isinstance(feed.source, LandingFiles):
        return SchemaDrift(rows, [])
    separator = feed.source.options.get("sep", ",")
    for uri in input_files:
        text = _landed_text(uri, locate)
        if text is None:
            continue
        # Lines as a file opened in text mode gives them (universal newlines), as before the bucket.
        lines = list(io.StringIO(text, newline=None))
        if feed.source.format == "ndjson":
            for line in lines:
                extra = feed.unknown_fields_of_line(line) if line.strip() else set()
                if extra:
                    rows += 1
                    fields |= extra
            continue
        header = lines[0].strip().split(separator) if lines else []
        extra_columns = [c for c in header if c and c not in feed.field_names]
        if extra_columns:
            fields |= set(extra_columns)
            rows += sum(1 for line in lines[1:] if line.strip())
    return SchemaDrift(rows, sorted(fields))
