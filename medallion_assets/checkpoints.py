"""What a stream's checkpoint and its Delta sink's commits say about its micro-batches.

:func:`read_checkpoint` parses a checkpoint folder (``metadata``,
``offsets/N``, ``commits/N``, ``sources/0/N[.compact]``);
:func:`delta_commits_of_query` finds a query's batches in the Delta table's
history as delta-rs reads it. Both only read: nothing here writes a
checkpoint or a table. The sensors and the stream verdicts
(:mod:`medallion_assets.stream_monitoring`) are built on these.

Checkpoints are read through pyarrow's filesystems: a local folder, or a lake
on an object store through the lake's own filesystem
(:meth:`~medallion_assets.resources.LakeResource.filesystem`, passed as
``locate``), so the same code reads both.

Nothing here runs at import.
"""

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyarrow import fs

#: ``location -> (filesystem, path in it)``: how a checkpoint's or a landed file's location is reached.
Locate = Callable[[str], tuple[fs.FileSystem, str]]


def local_path(path: str) -> str:
    """The local path of ``path`` (a path or a ``file:`` URI); other URIs are refused."""
    if path.startswith("file:"):
        return unquote(urlparse(path).path)
    if "://" in path:
        raise ValueError(f"{path} is not a local path: it is reached through a filesystem (see locate_local)")
    return path


def locate_local(location: str) -> tuple[fs.FileSystem, str]:
    """The default :data:`Locate`: a local path or ``file:`` URI on the local filesystem; another URI
    through pyarrow's own resolution (an ``s3://`` one then has only the ``AWS_*`` variables' settings)."""
    if location.startswith("file:") or "://" not in location:
        return fs.LocalFileSystem(), local_path(location)
    return fs.FileSystem.from_uri(location)


def _listing(filesystem: fs.FileSystem, folder: str) -> dict[str, fs.FileInfo]:
    """The files directly in ``folder`` by name (none when it does not exist): one listing, with their times."""
    infos = filesystem.get_file_info(fs.FileSelector(folder, allow_not_found=True))
    return {info.base_name: info for info in infos if info.type == fs.FileType.File}


def _numbered(filesystem: fs.FileSystem, folder: str) -> dict[int, float]:
    """``N -> mtime`` of the log files ``N`` in a checkpoint sub-folder."""
    return {
        int(name): (info.mtime_ns or 0) / 1e9 for name, info in _listing(filesystem, folder).items() if name.isdigit()
    }


def _read_text(filesystem: fs.FileSystem, path: str) -> str:
    """A file's text; ``FileNotFoundError`` when it is missing (on every filesystem)."""
    try:
        with filesystem.open_input_stream(path) as handle:
            return handle.read().decode("utf-8")
    except FileNotFoundError:
        raise
    except OSError as error:
        # pyarrow's S3 filesystem reports a missing key as a plain OSError.
        if filesystem.get_file_info(path).type == fs.FileType.NotFound:
            raise FileNotFoundError(path) from error
        raise


def _log_entries(filesystem: fs.FileSystem, path: str) -> list[dict]:
    """The JSON lines after the version line of a checkpoint log file."""
    lines = _read_text(filesystem, path).splitlines()
    return [json.loads(line) for line in lines[1:] if line.strip()]


@dataclass(frozen=True)
class Checkpoint:
    """A stream's checkpoint folder, read once.

    ``location`` is the folder's path in ``filesystem`` (``bucket/key`` on an object store).
    """

    location: str
    query_id: str | None
    offsets: dict[int, float]
    """Planned batch id -> time its offset file was written."""
    commits: dict[int, float]
    """Committed batch id -> time its commit file was written."""
    filesystem: fs.FileSystem = field(default_factory=fs.LocalFileSystem, compare=False, repr=False)

    def _path(self, *parts: str) -> str:
        return "/".join([self.location.rstrip("/"), *parts])

    def _entries(self, *parts: str) -> list[dict]:
        return _log_entries(self.filesystem, self._path(*parts))

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
        folder = ("sources", str(source))
        names = _listing(self.filesystem, self._path(*folder))
        if str(batch_id) in names:
            return [e["path"] for e in self._entries(*folder, str(batch_id))]
        compacts = sorted(int(n.split(".")[0]) for n in names if n.endswith(".compact") and n.split(".")[0].isdigit())
        for number in compacts:
            if number >= batch_id:
                entries = self._entries(*folder, f"{number}.compact")
                return [e["path"] for e in entries if e.get("batchId") == batch_id]
        return []

    def seen_files(self, source: int = 0) -> set[str]:
        """Every file any offset of the file source covers."""
        folder = ("sources", str(source))
        names = _listing(self.filesystem, self._path(*folder))
        compacts = sorted(int(n.split(".")[0]) for n in names if n.endswith(".compact") and n.split(".")[0].isdigit())
        start = compacts[-1] if compacts else -1
        seen: set[str] = set()
        if compacts:
            seen.update(e["path"] for e in self._entries(*folder, f"{start}.compact"))
        for name in names:
            if name.isdigit() and int(name) > start:
                seen.update(e["path"] for e in self._entries(*folder, name))
        return seen

    def source_offset(self, batch_id: int, source: int = 0) -> Any:
        """The offset ``offsets/<batch_id>`` records for a source (for Kafka: topic -> partition -> next offset)."""
        try:
            entries = self._entries("offsets", str(batch_id))
        except FileNotFoundError:
            return None
        # After the version line: the batch metadata, then one offset per source.
        return entries[1 + source] if len(entries) > 1 + source else None

    def kafka_start_offsets(self, source: int = 0) -> dict[str, dict[str, int]]:
        """The offsets a Kafka source started from when the checkpoint was created (``sources/<n>/0``)."""
        try:
            # A length/version prefix, then the JSON on the last line.
            last = _read_text(self.filesystem, self._path("sources", str(source), "0")).splitlines()[-1]
            return json.loads(last)
        except (FileNotFoundError, IndexError, ValueError):
            return {}

    def kafka_range(self, batch_id: int, source: int = 0) -> dict[str, dict[str, list[int]]]:
        """topic -> partition -> ``[first, end)`` offsets of a Kafka batch."""
        end = self.source_offset(batch_id, source) or {}
        start = self.source_offset(batch_id - 1, source) if batch_id > 0 else None
        start = start or self.kafka_start_offsets(source)
        return {
            topic: {
                p: [int(start.get(topic, {}).get(p, 0)), int(o)]
                for p, o in sorted(parts.items(), key=lambda i: int(i[0]))
            }
            for topic, parts in end.items()
        }

    def kafka_committed_offsets(self, topic: str, source: int = 0) -> dict[int, int]:
        """partition -> next offset to read, after the last committed batch (the start offsets if none)."""
        if self.last_committed >= 0:
            offsets = (self.source_offset(self.last_committed, source) or {}).get(topic, {})
        else:
            offsets = self.kafka_start_offsets(source).get(topic, {})
        return {int(p): int(o) for p, o in offsets.items()}


def read_checkpoint(location: str, locate: Locate = locate_local) -> Checkpoint:
    """Read a checkpoint folder (missing folders read as an empty checkpoint).

    Args:
        location: the folder: a path, a ``file:`` URI or an object-store URI.
        locate: reaches ``location`` (a lake on S3: ``lake.filesystem``, with the lake's store settings).
    """
    filesystem, folder = locate(location)
    query_id = None
    try:
        query_id = json.loads(_read_text(filesystem, f"{folder.rstrip('/')}/metadata").splitlines()[0]).get("id")
    except (FileNotFoundError, ValueError, IndexError):
        pass
    return Checkpoint(
        folder,
        query_id,
        _numbered(filesystem, f"{folder.rstrip('/')}/offsets"),
        _numbered(filesystem, f"{folder.rstrip('/')}/commits"),
        filesystem,
    )


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


def _added_by_commit(table, version: int, storage_options: dict[str, str] | None) -> tuple[int, int]:
    """Rows and files commit ``version`` added, from delta-rs's snapshots at it and before it.

    Only for a commit whose commitInfo has no row count (delta-spark with
    ``spark.databricks.delta.history.metricsEnabled=false``, the delta-rs sink
    before it recorded them): two snapshot loads, where the metrics cost nothing.
    """

    def files(at: int) -> dict[str, int]:
        if at < 0:
            return {}
        actions = pa.table(
            DeltaTable(table.table_uri, version=at, storage_options=storage_options).get_add_actions(flatten=True)
        )
        return dict(
            zip(
                actions.column("path").to_pylist(),
                (n or 0 for n in actions.column("num_records").to_pylist()),
                strict=False,
            )
        )

    before, after = files(version - 1), files(version)
    added = [rows for path, rows in after.items() if path not in before]
    return sum(added), len(added)


def delta_commits_of_query(
    table: str, query_id: str, *, after_batch: int = -1, storage_options: dict[str, str] | None = None
) -> dict[int, BatchCommit]:
    """Batch id -> Delta commit, for the commits ``query_id``'s stream sink made.

    delta-rs reads the table's history (commitInfo), newest first, a page at a
    time, and the reading stops at the first batch at or below
    ``after_batch``, so a sensor tick reads only the recent log. Rows and files
    are the sink's ``operationMetrics`` (``numOutputRows``, ``numAddedFiles``;
    delta-rs's own writes call them ``num_added_rows``, ``num_added_files``).
    ``storage_options``: deltalake's, for a table on an object store (``lake.delta_storage_options()``).
    """
    try:
        delta_table = DeltaTable(table, storage_options=storage_options)
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
                rows, files = _added_by_commit(delta_table, int(info["version"]), storage_options)
            found[batch] = BatchCommit(batch, int(info["version"]), rows, files, info.get("timestamp"))
        if len(history) < limit:
            return found
        seen, limit = len(history), limit * 2
