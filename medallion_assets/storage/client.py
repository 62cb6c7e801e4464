"""Reading and writing Delta tables with one SparkSession: :class:`DeltaTableClient`.

Knows storage and nothing about Dagster, so it serves the IO manager, the
bronze streams, the jobs and scripts alike. Every write goes one road:
:meth:`DeltaTableClient.write` asks :func:`~.writers.choose_writer` who
commits it (the session's engine or deltalake), and merges through
:mod:`.changes`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal

import pyarrow as pa
from deltalake.exceptions import CommitFailedError, DeltaProtocolError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from medallion_assets.delta import DeltaError as DeltaRsEngineError
from medallion_assets.storage import changes
from medallion_assets.storage.arrow_client import DELTA_RS_CANNOT_READ, ArrowDeltaClient
from medallion_assets.storage.engines import CommitFacts, DeltaEngine, engine_for
from medallion_assets.storage.merge_clauses import MergeClause
from medallion_assets.storage.write_spec import (
    WriteSpec,
    check_engine_reads,
    declared_table_properties,
    table_properties_for,
)
from medallion_assets.storage.writers import (
    Deployment,
    Operation,
    StoredTable,
    TableShape,
    Writer,
    WriterLimits,
    choose_writer,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WriteResult:
    """What a write did: the table's version afterwards and, when nothing was committed, why.

    ``commit`` is the newest commit after the write (read once, so describing
    the output does not read the log again); ``None`` when there is no table.
    ``by_deltalake``: the commit was made by deltalake, not by the session's
    engine (a small append or merge, :class:`DeltaTableClient`), so the session
    has not read that version yet.
    """

    version: int | None
    skipped_reason: str | None = None
    commit: CommitFacts | None = None
    by_deltalake: bool = False


@dataclass(frozen=True)
class TableDescription:
    """One version of a table: its commit, files, bytes and rows, and a DataFrame reading it.

    Rows, files and bytes are those of the version in the Delta log (the add
    actions' statistics), not a scan of the table.

    Attributes:
        path: the table's location.
        engine: name of the Delta engine that read it.
        version: the version described.
        operation: the operation of its commit.
        operation_metrics: that operation's metrics.
        rows: rows of the version.
        num_files: live data files.
        size_bytes: their total size.
        partition_columns: the table's partition columns.
        frame: the table at ``version``, for its schema and a preview.
    """

    path: str
    engine: str
    version: int
    operation: str
    operation_metrics: dict[str, Any]
    rows: int
    num_files: int
    size_bytes: int
    partition_columns: list[str]
    frame: DataFrame


class DeltaTableClient:
    """Reads and writes Delta tables with one SparkSession, on the session's Delta engine.

    Knows storage and nothing about Dagster, so it can be used from scripts and
    maintenance jobs too. What the engines spell differently is asked of
    :class:`~medallion_assets.storage.engines.DeltaEngine`; the rest is
    delta-spark's surface, which both ``DeltaTable`` classes share.

    Args:
        spark: the session.
        engine: its Delta engine (default: the one the session runs).
        writer_limits: how large a write deltalake may commit instead of the
            engine (:func:`~.writers.choose_writer`); the default, no rows:
            the engine commits every write.
    """

    def __init__(
        self, spark: SparkSession, engine: DeltaEngine | None = None, *, writer_limits: WriterLimits | None = None
    ) -> None:
        self.spark = spark
        self.engine = engine or engine_for(spark)
        self.writer_limits = writer_limits or WriterLimits()

    # ---- reading -------------------------------------------------------
    def exists(self, path: str) -> bool:
        """Whether ``path`` holds a Delta table."""
        return self.engine.is_delta_table(self.spark, path)

    def latest_version(self, path: str) -> int | None:
        """The table's current version, or ``None`` if there is no table."""
        return self._result(path).version

    def _result(self, path: str, skipped_reason: str | None = None) -> WriteResult:
        """The table's state after a write: one read of its newest commit."""
        if not self.exists(path):
            return WriteResult(None, skipped_reason)
        commit = self.engine.latest_commit(self.spark, path)
        return WriteResult(commit.version, skipped_reason, commit)

    def read(self, path: str, *, version: int | None = None, columns: Sequence[str] | None = None) -> DataFrame:
        """The table at its latest (or a pinned) version."""
        return self.engine.read(self.spark, path, version=version, columns=columns)

    def read_changes(self, path: str, *, after_version: int, to_version: int) -> DataFrame:
        """Rows inserted by commits ``after_version + 1 .. to_version``.

        Through the table's change data feed, which skips ``dataChange=false``
        rewrites (OPTIMIZE), so compaction never replays rows, and reads only
        the files of the new commits, so the cost follows the new data, not the
        table. The table must have ``delta.enableChangeDataFeed`` on (the
        bronze streams set it).
        """
        return self.engine.read_inserts(self.spark, path, after_version=after_version, to_version=to_version)

    def last_commit_info(self, path: str) -> dict[str, Any]:
        """The newest commit: ``version``, ``operation``, ``operationMetrics`` and its custom metadata."""
        commit = self.engine.latest_commit(self.spark, path)
        return {
            **commit.custom,
            "version": commit.version,
            "operation": commit.operation,
            "operationMetrics": commit.operation_metrics,
        }

    # ---- writing -------------------------------------------------------
    def write(
        self,
        frame: DataFrame,
        path: str,
        spec: WriteSpec,
        *,
        replace_where: str | None = None,
        commit_metadata: Mapping[str, str] | None = None,
        transaction: tuple[str, int] | None = None,
        empty_commit: tuple[str, int] | None = None,
    ) -> WriteResult:
        """Write ``frame`` to the table at ``path`` as ``spec`` says.

        Args:
            frame: the rows to write.
            path: the table's location.
            spec: mode, keys, schema mode, partitioning, properties.
            replace_where: predicate of the partition an overwrite replaces.
            commit_metadata: custom keys recorded in the commit (``commitInfo``).
            transaction: ``(application id, version)`` of an append or overwrite
                (Delta's ``txnAppId``/``txnVersion``): the engine skips the write
                when that application already committed this version or a later
                one, so a retried write lands once. Merges ignore it (they are
                idempotent by their keys and sequence).
            empty_commit: ``(application id, version)``: when an append or merge
                writes no row, commit anyway (no data, ``commit_metadata`` only)
                as this transaction, creating the table if needed, so the
                table's log records what the write was computed from.

        Returns:
            The version committed, or why no row was written.
        """
        check_column_names(frame.columns, path)
        check_engine_reads(declared_table_properties(spec), path=path, engine=self.engine.name)
        frame = self.engine.prepare_write(frame)
        metadata = dict(commit_metadata or {})
        table = StoredTable(path, exists=lambda: self.exists(path))
        if spec.mode == "overwrite":
            return self._overwrite(frame, path, spec, replace_where, metadata, transaction, table)
        # An append or merge source is checked for rows before it is written, and a
        # merge's is read again for its deletes: computed once, not once per action.
        with computed_once(frame) as (frame, rows):
            if rows == 0:
                result = self._result(path, "no new rows")
            elif spec.mode == "append" and self._writer("append", rows, table, spec) == "deltalake":
                # When deltalake cannot commit it (it committed nothing), the engine appends.
                result = self._append_with_deltalake(frame, path, metadata, transaction) or self._write(
                    frame, path, spec, replace_where, metadata, transaction
                )
            else:
                result = self._write(frame, path, spec, replace_where, metadata, transaction, rows=rows)
            if result.skipped_reason is None or empty_commit is None:
                return result
            # Asked again: the write may have created the table.
            after = StoredTable(path, exists=lambda: self.exists(path))
            if self._writer("empty_commit", 0, after, spec) == "deltalake":
                recorded = self._append_with_deltalake(None, path, metadata, empty_commit)
                if recorded is not None:
                    return WriteResult(
                        recorded.version,
                        recorded.skipped_reason or _recorded(result.skipped_reason),
                        recorded.commit,
                        recorded.by_deltalake,
                    )
            stored = frame.drop(spec.delete_column) if spec.delete_column else frame
            return self._commit_empty(stored.schema, path, spec, metadata, empty_commit, result.skipped_reason)

    def _writer(
        self,
        operation: Operation,
        rows: int | None,
        table: StoredTable,
        spec: WriteSpec,
        *,
        replace_where: str | None = None,
        schema_evolution: bool = False,
    ) -> Writer:
        """:func:`~.writers.choose_writer` for a write of this client's session to ``table``."""
        shape = TableShape(
            partitioned=bool(spec.partition_columns),
            declares_properties=bool(spec.table_properties),
            replaces_partition=bool(replace_where),
            adds_columns=schema_evolution,
        )
        return choose_writer(
            operation,
            rows=rows,
            table=table,
            shape=shape,
            deployment=Deployment.of(self.spark, table.path),
            limits=self.writer_limits,
        )

    def _overwrite(
        self,
        frame: DataFrame,
        path: str,
        spec: WriteSpec,
        replace_where: str | None,
        metadata: dict[str, str],
        transaction: tuple[str, int] | None,
        table: StoredTable,
    ) -> WriteResult:
        """Overwrite the table (or the partition of ``replace_where``) by deltalake when it is to, else the engine."""
        if self._writer("overwrite", None, table, spec, replace_where=replace_where) == "deltalake":
            # One row past the bound tells a larger output apart without computing all of it.
            data = frame.limit(self.writer_limits.max_rows + 1).toArrow()
            if self._writer("overwrite", data.num_rows, table, spec, replace_where=replace_where) == "deltalake":
                result = self._overwrite_with_deltalake(data, path, spec, metadata)
                if result is not None:
                    return result
        return self._write(frame, path, spec, replace_where, metadata, transaction)

    def _overwrite_with_deltalake(
        self, data: pa.Table, path: str, spec: WriteSpec, commit_metadata: dict[str, str]
    ) -> WriteResult | None:
        """Overwrite the whole table with ``data`` by deltalake; ``None`` when it cannot, having committed nothing."""
        # Nullable, as delta-spark stores a DataFrame's columns: a NOT NULL the frame's plan
        # happens to know (a count) would otherwise become a constraint of the table.
        data = data.cast(pa.schema([column.with_nullable(True) for column in data.schema]))
        try:
            ArrowDeltaClient().write(
                data, path, spec, asset=path, replace_where=None, commit_metadata=commit_metadata, transaction=None
            )
        except (DeltaProtocolError, CommitFailedError) as error:
            # A table feature deltalake does not write (row tracking, type widening), found
            # when it commits, or another writer's commit in between.
            log.info(
                "deltalake did not overwrite %s and committed nothing (%s); the session's engine writes", path, error
            )
            return None
        commit = self.engine.latest_commit(self.spark, path)
        return WriteResult(commit.version, None, commit, by_deltalake=True)

    def merge(
        self,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        spec: WriteSpec,
        schema_evolution: bool,
        metadata: Mapping[str, str],
        max_rows: int,
    ) -> None:
        """MERGE ``source`` (alias ``s``) into the table at ``path`` (alias ``t``).

        Run by deltalake, in this process, where :func:`~.writers.choose_writer`
        says so for a source of at most ``max_rows`` rows; by the session's
        engine otherwise. Anything deltalake cannot merge (deletion vectors, a
        writer feature, a condition it does not parse, another writer in
        between) commits nothing there, and the engine merges instead. Which of
        them committed is read from the commit afterwards (:meth:`_write`).
        """
        table = StoredTable(path, exists=lambda: self.exists(path))
        if self._writer("merge", max_rows, table, spec, schema_evolution=schema_evolution) == "deltalake":
            try:
                ArrowDeltaClient().merge_into_existing(
                    source.toArrow(), path, on=on, clauses=clauses, commit_metadata=metadata
                )
                return
            except (*DELTA_RS_CANNOT_READ, DeltaRsEngineError, DeltaProtocolError, CommitFailedError) as error:
                log.info(
                    "deltalake did not merge into %s and committed nothing (%s); the session's engine merges",
                    path,
                    error,
                )
        self.engine.merge(
            self.spark, path, source, on=on, clauses=clauses, schema_evolution=schema_evolution, metadata=metadata
        )

    def _append_with_deltalake(
        self, frame: DataFrame | None, path: str, commit_metadata: dict[str, str], transaction: tuple[str, int] | None
    ) -> WriteResult | None:
        """Append ``frame``'s rows (``None``: no row) by deltalake.

        ``None`` when deltalake cannot, having committed nothing.
        """
        try:
            skipped = ArrowDeltaClient().append_to_existing(
                None if frame is None else frame.toArrow(),
                path,
                commit_metadata=commit_metadata,
                transaction=transaction,
            )
        except (*DELTA_RS_CANNOT_READ, DeltaProtocolError, CommitFailedError):
            # Nothing was committed: a table or a writer feature delta-rs does not handle, new columns
            # (the engine's schema evolution), or another writer's commit in between.
            return None
        commit = self.engine.latest_commit(self.spark, path)
        return WriteResult(commit.version, skipped, commit, by_deltalake=skipped is None)

    def _commit_empty(
        self,
        schema: StructType,
        path: str,
        spec: WriteSpec,
        commit_metadata: dict[str, str],
        transaction: tuple[str, int],
        reason: str,
    ) -> WriteResult:
        """A commit without rows, carrying ``commit_metadata``.

        delta-spark skips an empty append unless it records an application
        transaction, which is why an empty commit is always one.
        """
        self._create_if_missing(schema, path, spec)
        empty = self.spark.createDataFrame([], self.engine.schema(self.spark, path))
        self.engine.save(empty, path, mode="append", options=self._commit_options(commit_metadata, transaction))
        return self._result(path, _recorded(reason))

    def _write(
        self,
        frame: DataFrame,
        path: str,
        spec: WriteSpec,
        replace_where: str | None,
        commit_metadata: dict[str, str],
        transaction: tuple[str, int] | None,
        *,
        rows: int | None = None,
    ) -> WriteResult:
        """Write as the engine does, a merge through :mod:`.changes` (``rows``: the frame's, known to a merge)."""
        # Tables are created by the builder, which both engines accept with partitions
        # and properties (the delta-rs engine's writer cannot take partitionBy).
        created = False
        merging = spec.mode in ("merge", "replace_keys")
        if spec.partition_columns or spec.table_properties or merging or replace_where:
            stored = frame.drop(spec.delete_column) if spec.delete_column else frame
            created = self._create_if_missing(stored.schema, path, spec)
        if merging:
            skipped = changes.merge(
                self,
                frame,
                path,
                spec,
                commit_metadata,
                rows=rows if rows is not None else frame.count(),
                new_table=created,
            )
            result = self._result(path, skipped)
            # A small MERGE is deltalake's commit (:meth:`merge`), which delta-rs describes without the session.
            by_deltalake = (
                result.commit is not None and "delta-rs" in result.commit.engine_info and self.engine.name != "delta-rs"
            )
            return replace(result, by_deltalake=by_deltalake)
        options = self._commit_options(commit_metadata, transaction)
        if replace_where:
            options["replaceWhere"] = replace_where
        if spec.schema_mode == "merge":
            options["mergeSchema"] = "true"
        elif spec.schema_mode == "overwrite":
            options["overwriteSchema"] = "true"
        mode: Literal["append", "overwrite"] = "append" if spec.mode == "append" else "overwrite"  # merges returned
        self.engine.save(frame, path, mode=mode, options=options)
        return self._result(path)

    def _commit_options(
        self, commit_metadata: Mapping[str, str], transaction: tuple[str, int] | None
    ) -> dict[str, str]:
        """Writer options for the commit's custom metadata and, if given, its application transaction."""
        options = dict(self.engine.commit_metadata_options(commit_metadata))
        if transaction is not None:
            app_id, version = transaction
            options.update(txnAppId=app_id, txnVersion=str(int(version)))
        return options

    def _create_if_missing(self, schema: StructType, path: str, spec: WriteSpec) -> bool:
        """Create the table unless it exists; whether this call created it."""
        # Python data sources cannot take .partitionBy(); the table builder can, on both engines.
        if self.exists(path):
            return False
        try:
            properties = table_properties_for(spec, schema)
        except ValueError as error:
            raise ValueError(f"table {path}: {error}") from error
        self.engine.create_table(
            self.spark,
            path,
            schema,
            partition_columns=spec.partition_columns,
            properties=properties,
        )
        return True

    #: Where the deleted keys of a merge-with-deletes table are kept (see :mod:`.changes`).
    tombstone_path = staticmethod(changes.tombstone_path)

    # ---- describing ----------------------------------------------------
    def describe(self, path: str, *, commit: CommitFacts | None = None) -> TableDescription:
        """The table's current version: commit, rows, files, bytes, partitioning and its DataFrame.

        ``commit``: the newest commit when the caller has just read it (a
        write's result). The rows are counted only when some file's
        statistics lack them.
        """
        commit = commit or self.engine.latest_commit(self.spark, path)
        state = self.engine.table_state(self.spark, path, commit.version)
        frame = state.frame
        rows = state.num_records if state.num_records is not None else frame.count()
        return TableDescription(
            path=path,
            engine=self.engine.name,
            version=commit.version,
            operation=commit.operation,
            operation_metrics=commit.operation_metrics,
            rows=rows,
            num_files=state.num_files,
            size_bytes=state.size_bytes,
            partition_columns=state.partition_columns,
            frame=frame,
        )


def _recorded(reason: str) -> str:
    """Why a write committed no row, when an empty commit recorded it anyway."""
    return f"{reason} (an empty commit records what the write was computed from)"


#: Rows up to which a write's source is cut from its step's plan (:func:`computed_once`). A
#: batch's changes stay below it (SF 1's 1% batch has about 60,000 line items); a first load
#: above it keeps its plan, since copying its rows once more costs more than the planning saved.
LINEAGE_CUT_MAX_ROWS = 1_000_000


@contextmanager
def computed_once(frame: DataFrame) -> Iterator[tuple[DataFrame, int]]:
    """``frame`` computed once and kept for the several actions of one write, then released.

    It is cached and counted: the count computes the cache whole, so Spark
    knows its true size and a MERGE broadcasts a small source into its join
    with the table instead of shuffling the table (a first-row probe would
    leave the cache partial and its size an estimate).

    In a classic session, a frame of at most :data:`LINEAGE_CUT_MAX_ROWS`
    rows is then copied from the cache into a local checkpoint, which keeps
    that size but not the step's plan: each action of the write (a MERGE and
    the queries that build its source, the tombstones) plans a scan of the
    kept rows instead of the whole step again, which for the order step is
    the parse of every field (docs/decisions/0010-writes-computed-once.md).

    Yields:
        The frame to write from and its number of rows.
    """
    cached = frame.persist()
    try:
        rows = cached.count()
        if rows == 0 or rows > LINEAGE_CUT_MAX_ROWS or not hasattr(cached, "_jdf"):
            yield cached, rows
            return
        # select("*"): a plan of its own, planned now that the cache holds the rows (their true size).
        kept = cached.select("*").localCheckpoint(eager=True)
        cached.unpersist()  # the checkpoint holds the rows now: the cache's memory goes back before the write
        try:
            yield kept, rows
        finally:
            # A checkpoint's blocks are its RDD's: DataFrame.unpersist() releases only a cache.
            kept._jdf.queryExecution().logical().rdd().unpersist(False)
    finally:
        cached.unpersist()


#: Characters Delta refuses in column names of tables without column mapping
#: (delta-spark enforces it; delta-rs would store them): one rule for both engines.
_INVALID_COLUMN_CHARACTERS = " ,;{}()\n\t="


def check_column_names(columns: Sequence[str], path: str) -> None:
    """Refuse column names Delta cannot store without column mapping, before anything is written."""
    bad = [name for name in columns if any(ch in name for ch in _INVALID_COLUMN_CHARACTERS)]
    if bad:
        raise ValueError(
            f"cannot write {path}: column name(s) {bad} contain a character Delta does not allow "
            f"in column names (one of {_INVALID_COLUMN_CHARACTERS!r}); give them plain names with "
            "alias(), e.g. F.sum('n').alias('total')"
        )
