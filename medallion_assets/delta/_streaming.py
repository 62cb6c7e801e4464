"""Structured Streaming for the ``delta`` format: an exactly-once sink and a source.

Sink (``writeStream.format("delta")``): each micro-batch is one Delta commit
carrying an app transaction ``(app id, batch id)``. The app id is the query
id Spark keeps in ``<checkpointLocation>/metadata`` (stable across restarts),
or the ``queryId`` option. A batch Spark replays after a crash (Delta commit
done, checkpoint commit not) finds its transaction in the log, commits
nothing and deletes the files it wrote. ``complete`` output mode overwrites
the table in each batch; ``append`` appends.
Each commit's commitInfo records the query id, the batch id and the batch's
rows and files as delta-spark's DeltaSink records them
(:func:`streaming_commit_info`).

Source (``readStream.format("delta")``): offsets are positions in the log,
``{"version": v, "index": i, "isStartingVersion": b}`` -- everything up to
and including file ``i`` of unit ``v`` is read, where a unit is the table's
snapshot at ``v`` (``isStartingVersion``) or the files commit ``v`` added.
Without ``startingVersion`` the first unit is the snapshot at the version
current when the query started, then each later commit; with it, commits
from that version on (``latest``: only commits after the current one). Adds
with ``dataChange=false`` (OPTIMIZE, compaction) are never read again. A
commit that removes data fails the stream unless ``ignoreDeletes`` (commits
that only remove files), ``ignoreChanges`` (rewritten files are read again:
their unchanged rows come twice, as in delta-spark) or ``skipChangeCommits``
(such commits are skipped whole) allows it.

What a commit did comes from delta-rs, not from parsing the log: the files
commit ``v`` added and removed are the difference between the snapshots of
versions ``v - 1`` and ``v`` (told apart by path, as
:func:`~medallion_assets.delta._read.read_added_rows` does), and whether a
commit that removed files changed rows comes from its commitInfo
(``history()``: OPTIMIZE only compacts). A unit's files are sorted by path, so
an offset's index names the same file on every read. deltalake 1.6's Python
API has no reader of one commit's actions (``get_add_actions`` gives a
snapshot's live files, ``load_cdf`` rows, not files), hence the diff. It costs
two snapshots per commit: the reader keeps the last snapshot it loaded and
one delta-rs table that it moves forward commit by commit (``load_as_version``
applies only the commits in between), so reading commits in order loads each
version once. A commit whose snapshot before it can no longer be loaded (log
cleaned up) fails the stream. ``history()`` is asked only for commits that
removed files; on a table loaded at an older version, deltalake 1.6 returns
the commits from that version up to the newest one in storage, labelled as if
the newest were the loaded one, so the oldest entry is the one wanted.

The newest version is the newest commit file name listed in ``_delta_log``
(a listing, no file is opened; nothing here writes the log): there is no
public probe of it that skips loading the snapshot's files (``DeltaTable(...)``
loads them, ``without_files`` and ``skip_stats`` are deprecated and ignored,
and ``get_latest_version`` is only on the private ``RawDeltaTable``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

import deltalake
import pyarrow as pa
from pyarrow import fs
from pyspark.sql import types as T
from pyspark.sql.datasource import DataSourceStreamArrowWriter, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from medallion_assets.delta._commit import (
    DeltaCommitMessage,
    WritePlan,
    already_committed,
    commit_write,
    delete_uncommitted_files,
    open_existing,
    plan_write,
    task_id,
)
from medallion_assets.delta._files import WrittenFile
from medallion_assets.delta._options import ReadOptions
from medallion_assets.delta._read import files_added_and_removed, is_compaction, plan_input_partitions, read_slices
from medallion_assets.delta._schema import spark_to_arrow_schema
from medallion_assets.delta._snapshot import DataFile, check_read_support, resolve_snapshot, table_path
from medallion_assets.delta.errors import DeltaError, DeltaOptionError

#: Options of the stream sink that are not batch write options.
_SINK_ONLY_OPTIONS = {"queryid", "checkpointlocation", "__checkpointlocation", "queryname"}


class DeltaStreamingError(DeltaError):
    """A streaming read cannot go on (data removed from the source table, log gone)."""


# ---------------------------------------------------------------- sink


def _local_path(location: str) -> str | None:
    if location.startswith("file:"):
        return unquote(urlparse(location).path)
    if "://" in location:
        return None
    return location


def query_id_from_checkpoint(checkpoint: str) -> str | None:
    """The query id in ``<checkpoint>/metadata`` (None when not written yet or not local)."""
    folder = _local_path(checkpoint)
    if folder is None:
        return None
    try:
        with open(os.path.join(folder, "metadata")) as handle:
            return json.loads(handle.readline())["id"]
    except (FileNotFoundError, KeyError, ValueError):
        return None


def streaming_commit_info(query_id: str, batch_id: int, *, complete: bool, files: Sequence[WrittenFile]) -> dict:
    """What a micro-batch's commitInfo records, in the keys delta-spark's DeltaSink uses.

    ``operationParameters`` (``outputMode``, ``queryId``, ``epochId``) and
    ``operationMetrics`` (string values, as delta-spark writes them), so one
    reader of the table's history (``delta_commits_of_query``) serves tables
    either engine streamed into. delta-rs merges these parameters into the
    ones it records for the write and keeps the metrics: its transactions
    record none of their own.
    """
    metrics = {
        "numAddedFiles": str(len(files)),
        "numOutputRows": str(sum(f.num_records for f in files)),
        "numOutputBytes": str(sum(f.size for f in files)),
    }
    if not complete:
        # An append removes nothing; an overwrite's removes are chosen by delta-rs
        # inside the transaction, so their number is not known here.
        metrics["numRemovedFiles"] = "0"
    return {
        "operationParameters": {
            "outputMode": "Complete" if complete else "Append",
            "queryId": query_id,
            "epochId": str(batch_id),
        },
        "operationMetrics": metrics,
    }


class DeltaStreamWriter(DataSourceStreamArrowWriter):
    """The ``delta`` stream sink: one idempotent Delta commit per micro-batch."""

    def __init__(
        self,
        plan: WritePlan,
        schema: T.StructType,
        options: Mapping[str, str],
        *,
        query_id: str | None,
        checkpoint: str | None,
    ) -> None:
        self.plan = plan
        self.schema = schema
        self.write_options = dict(options)
        self.query_id = query_id
        self.checkpoint = checkpoint

    @classmethod
    def create(cls, options: Mapping[str, str], schema: T.StructType, overwrite: bool) -> DeltaStreamWriter:
        """The sink of one query (``overwrite``: complete output mode).

        Raises:
            DeltaOptionError: no checkpoint location and no ``queryId`` option, or a bad write option.
        """
        location = table_path(options)
        lowered = {k.lower(): v for k, v in options.items()}
        query_id = lowered.get("queryid")
        checkpoint = lowered.get("checkpointlocation") or lowered.get("__checkpointlocation")
        if not query_id and not checkpoint:
            raise DeltaOptionError(
                "a streaming write needs .option('checkpointLocation', ...) (its query id makes the batches "
                "idempotent) or an explicit .option('queryId', ...)",
                table=location,
            )
        write_options = {
            k: v for k, v in options.items() if k.lower() != "path" and k.lower() not in _SINK_ONLY_OPTIONS
        }
        if any(k.lower() in ("txnappid", "txnversion") for k in write_options):
            raise DeltaOptionError(
                "txnAppId/txnVersion are set by the stream sink itself (query id, batch id); use queryId "
                "to choose the app id",
                table=location,
            )
        plan = plan_write(location, schema, mode="overwrite" if overwrite else "append", options=write_options)
        if not query_id:
            assert checkpoint, "checked above: a checkpoint location or a query id"
            query_id = query_id_from_checkpoint(checkpoint)
        return cls(
            plan,
            schema,
            write_options,
            query_id=query_id,
            checkpoint=checkpoint,
        )

    def app_id(self) -> str:
        """The app transaction id: the query's id, stable across restarts."""
        if self.query_id:
            return self.query_id
        found = query_id_from_checkpoint(self.checkpoint or "")
        if found is None:
            raise DeltaOptionError(
                f"cannot read the query id from {self.checkpoint}/metadata; set .option('queryId', ...) "
                "when the checkpoint is not on a local file system",
                table=self.plan.location,
            )
        self.query_id = found
        return found

    def write(self, iterator: Iterator[pa.RecordBatch]):
        writer = self.plan.file_writer(task_id())
        files = writer.write_batches(iterator)
        return DeltaCommitMessage(files)

    def _batch_plan(self, batch_id: int) -> WritePlan:
        # Planned again per batch: the table may have been created or evolved
        # since the query started, and an overwrite checks conflicts against
        # the version it read.
        options = {**self.write_options, "txnAppId": self.app_id(), "txnVersion": str(batch_id)}
        return plan_write(self.plan.location, self.schema, mode=self.plan.mode, options=options)

    def commit(self, messages, batchId: int) -> None:
        files = [f for m in messages if m is not None for f in m.files]
        plan = self._batch_plan(batchId)
        commit_write(
            plan,
            files,
            extra_metadata=streaming_commit_info(
                self.app_id(), batchId, complete=plan.mode == "overwrite", files=files
            ),
        )

    def abort(self, messages, batchId: int) -> None:
        files = [f for m in messages if m is not None for f in m.files]
        if not files:
            return
        table = open_existing(self.plan.location)
        if table is not None and already_committed(table, self.app_id(), batchId):
            # Spark aborts also when commit() raised after the Delta commit went through.
            return
        delete_uncommitted_files(self.plan.location, files)


# ---------------------------------------------------------------- source


@dataclass(frozen=True)
class StreamFile:
    """A file a streaming read takes, at its position in the log."""

    version: int
    index: int
    is_starting: bool
    file: DataFile


def _filesystem(location: str):
    local = _local_path(location)
    if local is not None:
        return fs.LocalFileSystem(), local
    return fs.FileSystem.from_uri(location)


def latest_log_version(location: str) -> int:
    """The newest version with a commit file in ``_delta_log`` (-1 when none)."""
    filesystem, base = _filesystem(location)
    infos = filesystem.get_file_info(fs.FileSelector(f"{base.rstrip('/')}/_delta_log", allow_not_found=True))
    versions = [int(i.base_name[:-5]) for i in infos if i.base_name.endswith(".json") and i.base_name[:-5].isdigit()]
    if versions:
        return max(versions)
    table = open_existing(location)
    return table.version() if table is not None else -1


class DeltaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The ``delta`` stream source (see the module docstring for offsets and options)."""

    def __init__(self, location: str, options: ReadOptions, schema: T.StructType, partition_columns: list[str]) -> None:
        self.location = location
        self.options = options
        self.schema = schema
        self.partition_columns = partition_columns
        self._units: dict[tuple[int, bool], list[StreamFile]] = {}
        self._end_version: int | None = None
        # The delta-rs table at the last version loaded, and that version's live files.
        self._table: deltalake.DeltaTable | None = None
        self._snapshot: tuple[int, dict[str, DataFile]] | None = None

    @classmethod
    def create(cls, options: Mapping[str, str], schema: T.StructType) -> DeltaStreamReader:
        location = table_path(options)
        parsed = ReadOptions.parse({k: v for k, v in options.items() if k.lower() != "path"}, table=location)
        if parsed.version_as_of is not None or parsed.timestamp_as_of is not None:
            raise DeltaOptionError(
                "versionAsOf/timestampAsOf are batch options; a stream starts with startingVersion", table=location
            )
        if parsed.read_change_feed:
            raise DeltaOptionError(
                "readChangeFeed is not supported on a stream yet; read the change feed in batches between versions",
                table=location,
            )
        if parsed.starting_timestamp is not None:
            raise DeltaOptionError(
                "startingTimestamp is not supported on a stream; use startingVersion", table=location
            )
        table = open_existing(location)
        partition_columns = list(table.metadata().partition_columns) if table is not None else []
        return cls(location, parsed, schema, partition_columns)

    # -- offsets

    def initialOffset(self) -> dict:
        starting = self.options.starting_version
        current = latest_log_version(self.location)
        if starting is None:
            return {"version": current, "index": -1, "isStartingVersion": True}
        if starting == "latest":
            return {"version": current + 1, "index": -1, "isStartingVersion": False}
        return {"version": int(starting), "index": -1, "isStartingVersion": False}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_files_per_trigger:
            return ReadMaxFiles(self.options.max_files_per_trigger)
        if self.options.max_bytes_per_trigger:
            return ReadMaxBytes(self.options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._end_version = latest_log_version(self.location)

    def _unit(self, version: int, is_starting: bool) -> list[StreamFile]:
        key = (version, is_starting)
        if key not in self._units:
            self._units[key] = self._load_unit(version, is_starting)
            if len(self._units) > 64:
                self._units.pop(next(iter(self._units)))
        return self._units[key]

    def _load_unit(self, version: int, is_starting: bool) -> list[StreamFile]:
        """The files unit ``version`` reads, sorted by path."""
        if is_starting:
            files = sorted(self._files_at(version, unit=version).values(), key=lambda f: f.path)
            return [StreamFile(version, i, True, f) for i, f in enumerate(files)]
        before = self._files_at(version - 1, unit=version)
        added, removed = files_added_and_removed(before.values(), self._files_at(version, unit=version).values())
        if removed:
            commit = self._commit_info(version)
            if is_compaction(commit):
                return []  # OPTIMIZE: the same rows in new files, never read again
            if self.options.skip_change_commits:
                return []
            if not added and (self.options.ignore_deletes or self.options.ignore_changes):
                return []
            if added and self.options.ignore_changes:
                pass  # rewritten files are read again, as delta-spark's ignoreChanges does
            else:
                allowed = (
                    "ignoreChanges or skipChangeCommits"
                    if added
                    else "ignoreDeletes, ignoreChanges or skipChangeCommits"
                )
                raise DeltaStreamingError(
                    f"version {version} ({commit.get('operation') or '?'}) removed data from the source table, "
                    f"which a stream that only appends cannot express; set {allowed} on the readStream to go on",
                    table=self.location,
                )
        added.sort(key=lambda f: f.path)
        return [StreamFile(version, i, False, f) for i, f in enumerate(added)]

    def _files_at(self, version: int, *, unit: int) -> dict[str, DataFile]:
        """The live files of ``version`` by path (none before version 0), loaded at most once in a row.

        The delta-rs table moves forward from the last version loaded, which
        applies only the commits in between; going back opens the table again.
        """
        if version < 0:
            return {}
        if self._snapshot is not None and self._snapshot[0] == version:
            return self._snapshot[1]
        table, self._table, self._snapshot = self._table, None, None
        try:
            if table is not None and table.version() < version:
                table.load_as_version(version)
            else:
                table = deltalake.DeltaTable(self.location, version=version)
        except (deltalake.exceptions.DeltaError, deltalake.exceptions.TableNotFoundError) as exc:
            raise DeltaStreamingError(
                f"version {unit} cannot be read: the table's snapshot of version {version} can no longer be "
                f"loaded (log cleaned up? {exc}); the stream cannot go on from its checkpoint. Restart it "
                "with a new checkpoint (and startingVersion)",
                table=self.location,
            ) from exc
        check_read_support(table, self.location)
        files = {f.path: f for f in resolve_snapshot(self.location, table=table).files}
        self._table, self._snapshot = table, (version, files)
        return files

    def _commit_info(self, version: int) -> dict:
        """Commit ``version``'s commitInfo (a ``history()`` entry; empty when it has none).

        Called right after :meth:`_files_at` loaded ``version``. deltalake 1.6
        returns the commits from the loaded version up to the newest in
        storage, newest first: the last entry is the loaded version's.
        """
        assert self._table is not None and self._table.version() == version
        entries = self._table.history(1)
        return entries[-1] if entries else {}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        last = latest_log_version(self.location)
        if self._end_version is not None:
            last = min(last, self._end_version)
        max_files = limit.max_files if isinstance(limit, ReadMaxFiles) else None
        max_bytes = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        version, index, starting = int(start["version"]), int(start["index"]), bool(start["isStartingVersion"])
        end = dict(start)
        taken, taken_bytes = 0, 0
        while version <= last:
            pending = [f for f in self._unit(version, starting) if f.index > index]
            for f in pending:
                if (max_files is not None and taken >= max_files) or (
                    max_bytes is not None and taken and taken_bytes >= max_bytes
                ):
                    return end
                taken += 1
                taken_bytes += f.file.size
                end = {"version": version, "index": f.index, "isStartingVersion": starting}
            # The unit is done: the next position is the start of the next commit.
            if starting:
                version, starting = version + 1, False
            else:
                version += 1
            index = -1
            end = {"version": version, "index": -1, "isStartingVersion": False}
            if (max_files is not None and taken >= max_files) or (
                max_bytes is not None and taken and taken_bytes >= max_bytes
            ):
                return end
        return end

    def reportLatestOffset(self) -> dict | None:
        return {"version": latest_log_version(self.location) + 1, "index": -1, "isStartingVersion": False}

    def files_between(self, start: dict, end: dict) -> list[DataFile]:
        """The files after ``start`` up to and including ``end``."""
        version, index, starting = int(start["version"]), int(start["index"]), bool(start["isStartingVersion"])
        end_unit = (int(end["version"]), not bool(end["isStartingVersion"]))
        end_index = int(end["index"])
        files = []
        while (version, not starting) < end_unit or ((version, not starting) == end_unit and end_index >= 0):
            last_unit = (version, not starting) == end_unit
            for f in self._unit(version, starting):
                if f.index <= index:
                    continue
                if last_unit and f.index > end_index:
                    break
                files.append(f.file)
            version, starting, index = version + 1, False, -1
        return files

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        files = self.files_between(start, end)
        if not files:
            return []
        # The batch reader's partitions: a big file comes as slices of its row groups.
        return plan_input_partitions(files, self.options.max_partition_bytes)

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        arrow_schema = spark_to_arrow_schema(self.schema, table=self.location)
        yield from read_slices(partition, arrow_schema, self.partition_columns, table=self.location)

    def commit(self, end: dict) -> None:
        # Forget units before the committed position.
        for key in [k for k in self._units if k[0] < int(end["version"])]:
            self._units.pop(key, None)

    def stop(self) -> None:
        self._units.clear()
        self._table, self._snapshot = None, None
