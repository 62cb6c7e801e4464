"""The Delta engines behind one asset code: delta-spark, delta-spark over Spark Connect, the delta-rs engine.

* **delta-spark** (:class:`DeltaSparkEngine`): Delta Lake's own Spark connector
  (``delta.tables``, ``format("delta")`` served by the JVM). Writes at Parquet
  speed and runs MERGE, OPTIMIZE and streaming on the executors.
* **delta-spark over Spark Connect** (:class:`DeltaSparkSqlEngine`): the same
  engine spoken in Delta's SQL.
* **delta-rs** (:class:`DeltaRsEngine`): :mod:`medallion_assets.delta` (Spark's
  Python Data Source API with delta-rs), for clusters that can reach PyPI only.

The table client, the bronze streams and table maintenance talk to a table
through :class:`DeltaEngine`; everything they need that the connectors do not
spell the same way (time travel, incremental reads, commit metadata, the facts
of the last commit, a version's files, bytes and rows) lives here, once per
engine. An engine knows tables as locations, not what a table means: the
merge strategies are :mod:`.changes`'s. Both ``DeltaTable`` classes share
delta-spark's surface (``forPath``, ``merge``, ``optimize``, ``vacuum``,
``detail``, ``createIfNotExists``), so callers use them directly.

Which engine a session runs is decided when the session is built
(:mod:`.session`) and read back from the session (:func:`engine_for`): a
session that has delta-spark runs delta-spark, any other runs delta-rs.

Nothing here runs at import.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import deltalake
from delta.tables import DeltaTable as DeltaSparkTable
from deltalake.exceptions import DeltaError
from py4j.protocol import Py4JError
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import StructType

from medallion_assets.delta import DeltaTable as DeltaRsTable
from medallion_assets.delta import (
    append_micro_batches,
    enable_delta,
    has_native_delta,
    read_added_rows,
    read_delta,
    resolve_snapshot,
    snapshot_dataframe,
    write_delta,
)
from medallion_assets.object_store import storage_options_for
from medallion_assets.storage.merge_clauses import MergeClause, with_unacted_matches_kept

log = logging.getLogger(__name__)

EngineName = Literal["delta-spark", "delta-rs"]


def engine_for(spark: SparkSession) -> DeltaEngine:
    """The engine a session runs: delta-spark where the session has it, delta-rs otherwise.

    Registers the delta-rs engine's ``delta`` format on a session that has no
    delta-spark (idempotent), so any session handed to the project works.
    """
    if has_native_delta(spark):
        return delta_spark_engine(spark, "the session has delta-spark")
    enable_delta(spark)
    return DeltaRsEngine("the session has no delta-spark")


def delta_spark_engine(spark: SparkSession, reason: str) -> DeltaSparkEngine:
    # A Spark Connect session has no JVM handle; its delta-spark speaks SQL.
    if hasattr(spark, "_jsparkSession"):
        return DeltaSparkEngine(reason)
    return DeltaSparkSqlEngine(f"{reason}; Spark Connect, through Delta SQL")


@dataclass(frozen=True)
class CommitFacts:
    """What the newest commit of a table did, and who wrote it (``engine_info``, empty when unknown)."""

    version: int
    operation: str
    operation_metrics: dict[str, Any]
    custom: dict[str, str]
    engine_info: str = ""


@dataclass(frozen=True)
class TableDetail:
    """A table's current files, size and partitioning (``DESCRIBE DETAIL``)."""

    num_files: int
    size_bytes: int
    partition_columns: list[str]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TableDetail:
        """From a ``DESCRIBE DETAIL`` / ``DeltaTable.detail()`` row (both engines name the fields alike)."""
        return cls(
            int(row.get("numFiles") or 0), int(row.get("sizeInBytes") or 0), list(row.get("partitionColumns") or [])
        )


@dataclass(frozen=True)
class TableState:
    """One version of a table as its Delta log describes it, and a DataFrame reading that version.

    Attributes:
        version: the version described.
        num_files: live data files.
        size_bytes: their total size.
        num_records: rows, summed over the files' statistics; ``None`` when a
            file's statistics lack ``numRecords`` (count ``frame`` then).
        partition_columns: the table's partition columns.
        frame: the table at ``version``, resolved from the same snapshot.
    """

    version: int
    num_files: int
    size_bytes: int
    num_records: int | None
    partition_columns: list[str]
    frame: DataFrame


#: Commits searched before the whole log is read for a custom metadata key.
_RECENT_COMMITS = 20


def user_metadata(text: str | None) -> dict[str, str]:
    """Custom commit metadata from a commit's ``userMetadata``.

    Both engines store their custom keys there as one JSON object, so either
    engine reads what the other wrote; text that is not a JSON object is kept
    under ``userMetadata``.
    """
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return {"userMetadata": text}
    return {str(k): str(v) for k, v in parsed.items()}


def _no_rows(frame: DataFrame) -> DataFrame:
    """``frame``'s columns and no row, as a plan Spark knows is empty.

    Spark's optimizer turns a zero limit into an empty relation and carries
    the emptiness through joins and unions, so a step given nothing new
    answers its counts and probes on the driver. An empty frame built from a
    Python list would run a job, with a Python worker, for every one of them.
    """
    return frame.limit(0)


def _append_stream_writer(
    frame: DataFrame, *, checkpoint_location: str, query_name: str, trigger: Mapping[str, Any]
) -> DataStreamWriter:
    """What every engine's append stream shares: mode, name, checkpoint and trigger."""
    return (
        frame.writeStream.outputMode("append")
        .queryName(query_name)
        .option("checkpointLocation", checkpoint_location)
        .trigger(**dict(trigger))
    )


class DeltaEngine:
    """What the project asks of a Delta engine.

    One method per operation the IO manager, the bronze streams and table
    maintenance need. The default implementations use delta-spark's
    ``DeltaTable`` surface, which both engines' classes share; an engine
    overrides what it spells differently. Paths are table locations; every
    method takes the session it runs on.
    """

    name: ClassVar[EngineName]

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    def describe(self) -> str:
        """The engine and why the session runs it, for the run log."""
        return f"{self.name} ({self.reason})" if self.reason else self.name

    def table_class(self) -> Any:
        """The engine's ``DeltaTable`` class (delta-spark's surface)."""
        raise NotImplementedError

    def for_path(self, spark: SparkSession, path: str) -> Any:
        """``DeltaTable.forPath(spark, path)`` of this engine."""
        return self.table_class().forPath(spark, path)

    def is_delta_table(self, spark: SparkSession, path: str) -> bool:
        """Whether ``path`` holds a Delta table."""
        return bool(self.table_class().isDeltaTable(spark, path))

    def read(
        self, spark: SparkSession, path: str, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        """The table at its latest or a pinned version, optionally only some columns."""
        raise NotImplementedError

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        """Rows that commits ``after_version + 1 .. to_version`` inserted (change data feed).

        Rewrites without a data change (OPTIMIZE) are not inserts, so compaction
        never replays rows. The table needs ``delta.enableChangeDataFeed``.
        """
        raise NotImplementedError

    def latest_commit(self, spark: SparkSession, path: str) -> CommitFacts:
        """Version, operation, metrics and custom metadata of the newest commit."""
        [info] = self._commit_infos(spark, path, 1)
        return CommitFacts(
            int(info["version"]),
            str(info.get("operation") or ""),
            dict(info.get("operationMetrics") or {}),
            _custom_metadata(info),
            str(info.get("engineInfo") or info.get("clientVersion") or ""),
        )

    def newest_commit_value(self, spark: SparkSession, path: str, key: str) -> str | None:
        """The value of custom commit metadata ``key`` in the newest commit that carries it.

        Searches the recent commits first and the whole retained log only when
        they lack it (maintenance commits carry no custom metadata). ``None``
        when no retained commit has the key.
        """
        for limit in (_RECENT_COMMITS, None):
            commits = self._custom_metadata_of_commits(spark, path, limit)
            for custom in commits:
                if key in custom:
                    return custom[key]
            if limit is not None and len(commits) < limit:
                return None
        return None

    def _custom_metadata_of_commits(self, spark: SparkSession, path: str, limit: int | None) -> list[dict[str, str]]:
        """Each commit's custom metadata, newest first (``limit``: the newest ``limit`` commits)."""
        return [_custom_metadata(info) for info in self._commit_infos(spark, path, limit)]

    def _commit_infos(self, spark: SparkSession, path: str, limit: int | None) -> list[dict[str, Any]]:
        """The newest ``limit`` commits' info (``None``: every retained one), newest first.

        Read from the log by delta-rs: these look-ups run for every input and
        output of every step, and delta-rs answers one from the log where a
        history DataFrame costs delta-spark a job
        (docs/decisions/0010-writes-computed-once.md). Where delta-rs cannot open the
        location (a Hadoop-only scheme, a lake only the Spark server sees),
        Spark's ``DESCRIBE HISTORY`` answers.
        """
        infos = _commit_infos_from_log(path, limit)
        if infos is not None:
            return infos
        fields = ["version", "operation", "operationMetrics", "userMetadata"]
        return [row.asDict() for row in self._history(spark, path, limit).select(*fields).collect()]

    def _history(self, spark: SparkSession, path: str, limit: int | None = 1) -> DataFrame:
        """``DESCRIBE HISTORY`` of the newest ``limit`` commits (``None``: every retained one), newest first."""
        table = self.for_path(spark, path)
        return table.history(limit) if limit else table.history()

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        """Writer options that record ``metadata`` in the commit of a batch or streaming write."""
        raise NotImplementedError

    def prepare_write(self, frame: DataFrame) -> DataFrame:
        """``frame`` as this engine stores it unchanged (the default: as it is)."""
        return frame

    def save(
        self, frame: DataFrame, path: str, *, mode: Literal["append", "overwrite"], options: Mapping[str, str]
    ) -> None:
        """Append or overwrite with ``df.write.format("delta")`` and its options."""
        frame.write.format("delta").mode(mode).options(**options).save(path)

    def start_append_stream(
        self,
        frame: DataFrame,
        path: str,
        *,
        checkpoint_location: str,
        query_name: str,
        trigger: Mapping[str, Any],
        options: Mapping[str, str],
    ) -> StreamingQuery:
        """Start appending the streaming ``frame`` to the table, each micro-batch committed once.

        The default is the engine's Delta stream sink (``writeStream.format("delta")``),
        whose commits carry the app transaction ``(query id, batch id)``.
        """
        writer = _append_stream_writer(
            frame, checkpoint_location=checkpoint_location, query_name=query_name, trigger=trigger
        )
        return writer.format("delta").options(**options).start(path)

    def create_table(
        self,
        spark: SparkSession,
        path: str,
        schema: StructType,
        *,
        partition_columns: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> None:
        """Create an empty table at ``path`` unless one is there (``CREATE TABLE IF NOT EXISTS``)."""
        builder = self.table_class().createIfNotExists(spark).location(path).addColumns(schema)
        if partition_columns:
            builder = builder.partitionedBy(*partition_columns)
        for key, value in (properties or {}).items():
            builder = builder.property(key, value)
        builder.execute()

    def schema(self, spark: SparkSession, path: str) -> StructType:
        """The table's current schema."""
        return self.for_path(spark, path).toDF().schema

    def merge(
        self,
        spark: SparkSession,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        schema_evolution: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """MERGE ``source`` (alias ``s``) into the table (alias ``t``), clauses in order."""
        builder = self.for_path(spark, path).alias("t").merge(source.alias("s"), on)
        if schema_evolution:
            builder = builder.withSchemaEvolution()
        for clause in clauses:
            assignments = dict(clause.assignments or {})
            if clause.action == "delete":
                builder = builder.whenMatchedDelete(condition=clause.condition)
            elif clause.action == "update":
                builder = builder.whenMatchedUpdate(condition=clause.condition, set=assignments)
            else:
                builder = builder.whenNotMatchedInsert(condition=clause.condition, values=assignments)
        self.execute_merge(spark, builder, metadata or {})

    def compact(self, spark: SparkSession, path: str) -> None:
        """OPTIMIZE: rewrite small files into larger ones (no data change)."""
        self.for_path(spark, path).optimize().executeCompaction()

    def vacuum(self, spark: SparkSession, path: str, *, retention_hours: float) -> None:
        """VACUUM: delete files no version within ``retention_hours`` references."""
        self.for_path(spark, path).vacuum(retention_hours)

    def detail(self, spark: SparkSession, path: str) -> TableDetail:
        """Files, size and partition columns of the current version."""
        return TableDetail.from_row(self.for_path(spark, path).detail().first().asDict(recursive=True))

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        """Files, bytes, rows and partitioning of ``version``, from one lookup of its snapshot."""
        raise NotImplementedError

    def _state_from_detail(self, spark: SparkSession, path: str, version: int) -> TableState:
        # DESCRIBE DETAIL speaks of the newest version only; right after a write that is
        # ``version`` unless another writer committed since. Rows are left to count():
        # delta-spark answers a bare count from the files' statistics when they have it.
        detail = self.detail(spark, path)
        return TableState(
            version,
            detail.num_files,
            detail.size_bytes,
            None,
            detail.partition_columns,
            self.read(spark, path, version=version),
        )

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        """Run a merge builder, recording ``metadata`` in its commit."""
        raise NotImplementedError


class DeltaSparkEngine(DeltaEngine):
    """delta-spark, Delta Lake's own Spark connector.

    Custom commit metadata is stored as JSON in the commit's ``userMetadata``,
    the one free-form field delta-spark offers for every operation.
    """

    name: ClassVar[EngineName] = "delta-spark"
    _USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

    def table_class(self) -> Any:
        return DeltaSparkTable

    def read(
        self, spark: SparkSession, path: str, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", str(int(version)))
        frame = reader.load(path)
        return frame.select(*columns) if columns else frame

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        current = self.read(spark, path, version=to_version)
        if to_version <= after_version:
            return _no_rows(current)
        columns = current.schema
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", str(after_version + 1))
            .option("endingVersion", str(to_version))
            .load(path)
        )
        return changes.where(F.col("_change_type") == "insert").select(*columns.fieldNames())

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        return {"userMetadata": json.dumps(dict(metadata), sort_keys=True)} if metadata else {}

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        # The snapshot a write leaves behind is in the DeltaLog's cache, with its checksum
        # (files, bytes and, for small tables, every add action); DESCRIBE DETAIL would
        # rebuild the version's state with a Spark job just for files and bytes.
        # DeltaLog is delta-spark's internal API: on a version whose signatures differ,
        # the public route answers the same.
        try:
            return self._state_from_log(spark, path, version)
        except Py4JError:
            log.debug("delta-spark's DeltaLog is not reachable as expected; describing %s by DESCRIBE DETAIL", path)
            return self._state_from_detail(spark, path, version)

    def _state_from_log(self, spark: SparkSession, path: str, version: int) -> TableState:
        jvm = spark._jvm
        assert jvm is not None, "a classic session: delta-spark runs in its JVM"
        none = jvm.scala.Option.apply(None)
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        snapshot = delta_log.update(False, none, none)
        if snapshot.version() != version:
            snapshot = delta_log.getSnapshotAt(version, none, none, False)
        partitions = snapshot.metadata().partitionColumns()
        partition_columns = [str(partitions.apply(i)) for i in range(partitions.size())]
        checksum = snapshot.checksumOpt()
        adds = checksum.get().allFiles() if checksum.isDefined() else None
        if adds is not None and adds.isDefined():
            files = 0
            size = 0
            records: int | None = 0
            actions = adds.get().iterator()
            while actions.hasNext():
                add = actions.next()
                files += 1
                size += int(add.size())
                logical = add.numLogicalRecords()
                records = None if records is None or logical.isEmpty() else records + int(logical.get())
        else:
            # No add actions in the checksum (a large table): one job over the version's
            # add actions, whose state the read of the preview then reuses.
            numbers = F.get_json_object("stats", "$.numRecords").cast("long")
            row = (
                DataFrame(snapshot.allFiles().toDF(), spark)
                .agg(
                    F.count(F.lit(1)).alias("files"),
                    F.sum("size").alias("size"),
                    F.sum(numbers - F.coalesce(F.col("deletionVector.cardinality"), F.lit(0))).alias("records"),
                    F.count_if(numbers.isNull()).alias("without_stats"),
                )
                .first()
            )
            assert row is not None, "an aggregate without grouping returns one row"
            files, size = int(row["files"]), int(row["size"] or 0)
            records = None if row["without_stats"] else int(row["records"] or 0)
        return TableState(
            int(snapshot.version()), files, size, records, partition_columns, self.read(spark, path, version=version)
        )

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        # MERGE takes no writer options: the session setting is how delta-spark records its userMetadata.
        if not metadata:
            merge.execute()
            return
        previous = spark.conf.get(self._USER_METADATA_CONF, None)
        spark.conf.set(self._USER_METADATA_CONF, json.dumps(dict(metadata), sort_keys=True))
        try:
            merge.execute()
        finally:
            if previous is None:
                spark.conf.unset(self._USER_METADATA_CONF)
            else:
                spark.conf.set(self._USER_METADATA_CONF, previous)


class DeltaRsEngine(DeltaEngine):
    """:mod:`medallion_assets.delta`: the Python Data Source API with delta-rs.

    Reads go through the fast route (delta-rs resolves the snapshot, Spark's
    Parquet reader reads it). MERGE runs in delta-rs on the driver.
    """

    name: ClassVar[EngineName] = "delta-rs"

    def merge(
        self,
        spark: SparkSession,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        schema_evolution: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """MERGE as :meth:`DeltaEngine.merge`, kept rows included (:func:`with_unacted_matches_kept`)."""
        # The target's own first column: a source column could be one that schema evolution adds.
        kept = self.for_path(spark, path)._table().schema().fields[0].name
        super().merge(
            spark,
            path,
            source,
            on=on,
            clauses=with_unacted_matches_kept(clauses, column=kept),
            schema_evolution=schema_evolution,
            metadata=metadata,
        )

    def table_class(self) -> Any:
        return DeltaRsTable

    def read(
        self, spark: SparkSession, path: str, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        return read_delta(spark, path, version=version, columns=list(columns) if columns else None)

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        current = self.read(spark, path, version=to_version)
        if to_version <= after_version:
            return _no_rows(current)
        columns = current.schema
        # An append-only range (bronze) is read from its new files by Spark; others need
        # the change data feed, which delta-rs builds on the driver.
        added = read_added_rows(spark, path, after_version=after_version, to_version=to_version)
        if added is not None:
            return added.select(*columns.fieldNames())
        changes = self.for_path(spark, path).changes(startingVersion=after_version + 1, endingVersion=to_version)
        return changes.where(F.col("_change_type") == "insert").select(*columns.fieldNames())

    def save(
        self, frame: DataFrame, path: str, *, mode: Literal["append", "overwrite"], options: Mapping[str, str]
    ) -> None:
        # Spark's Parquet writer writes the files, delta-rs commits them: the
        # same options and checks as format("delta"), without handing every row to Python.
        write_delta(frame, path, mode=mode, options=options)

    def start_append_stream(
        self,
        frame: DataFrame,
        path: str,
        *,
        checkpoint_location: str,
        query_name: str,
        trigger: Mapping[str, Any],
        options: Mapping[str, str],
    ) -> StreamingQuery:
        # Each micro-batch goes through write_delta (Spark's Parquet writer), not the
        # Python stream sink, with the same app transaction and commit info.
        batches = append_micro_batches(path, checkpoint_location=checkpoint_location, options=options)
        writer = _append_stream_writer(
            frame, checkpoint_location=checkpoint_location, query_name=query_name, trigger=trigger
        )
        return writer.foreachBatch(batches).start()

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        # Each key on its own (what delta-rs readers show) and the JSON delta-spark reads.
        if not metadata:
            return {}
        return {
            **{f"commitInfo.{key}": str(value) for key, value in metadata.items()},
            "userMetadata": json.dumps(dict(metadata), sort_keys=True),
        }

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        # The add actions delta-rs lists carry each file's size and numRecords; the
        # DataFrame reads the same snapshot, so the version is resolved once.
        snapshot = resolve_snapshot(path, version=version)
        records = [f.num_records for f in snapshot.files]
        return TableState(
            snapshot.version,
            len(snapshot.files),
            sum(f.size for f in snapshot.files),
            None if any(r is None for r in records) else int(sum(r for r in records if r is not None)),
            list(snapshot.partition_columns),
            snapshot_dataframe(spark, snapshot),
        )

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        if metadata:
            merge = merge.withCommitInfo({**metadata, "userMetadata": json.dumps(dict(metadata), sort_keys=True)})
        merge.execute()


_COMMIT_INFO_FIELDS = frozenset(
    {
        "version",
        "operation",
        "operationMetrics",
        "operationParameters",
        "timestamp",
        "clientVersion",
        "engineInfo",
        "readVersion",
        "isBlindAppend",
        "userMetadata",
        "isolationLevel",
        "txnId",
    }
)


def _custom_metadata(info: Mapping[str, Any]) -> dict[str, str]:
    """Custom metadata of a commit's info: keys of its own (delta-rs's ``history()``), then ``userMetadata``."""
    custom = {str(k): str(v) for k, v in info.items() if k not in _COMMIT_INFO_FIELDS and v is not None}
    return {**custom, **user_metadata(info.get("userMetadata"))}


def _commit_infos_from_log(path: str, limit: int | None) -> list[dict[str, Any]] | None:
    """delta-rs's ``history(limit)`` of the table at ``path``; ``None`` when delta-rs cannot open it."""
    try:
        table = deltalake.DeltaTable(path, storage_options=storage_options_for(path))
        infos = table.history(limit)
    except (DeltaError, OSError, ValueError) as error:
        log.debug("delta-rs cannot read the log of %s (%s); asking Spark", path, error)
        return None
    # A log whose commit files were cleaned up down to a checkpoint has no info for its version.
    return infos or [{"version": table.version()}]


class DeltaSparkSqlEngine(DeltaSparkEngine):
    """delta-spark through SQL, for Spark Connect sessions.

    delta-spark's Python ``DeltaTable`` reaches a Connect server only through
    Delta Connect's server plugin, which a Connect server with just the
    delta-spark jars does not load. Delta's SQL (``MERGE INTO``, ``OPTIMIZE``,
    ``VACUUM``, ``DESCRIBE DETAIL/HISTORY``, ``CREATE TABLE``) needs only the
    session extension, so on Connect every operation is spoken in SQL against
    ``delta.`<path>```. Same engine, same tables, same commits.
    """

    @staticmethod
    def _table(path: str) -> str:
        return "delta.`" + path.replace("`", "``") + "`"

    def for_path(self, spark: SparkSession, path: str) -> Any:
        raise NotImplementedError("on Spark Connect the delta-spark engine speaks SQL; use the engine's operations")

    def prepare_write(self, frame: DataFrame) -> DataFrame:
        # A cast to a StringType object reaches a Connect server with an explicit
        # UTF8_BINARY collation, which delta-spark stores as "string collate
        # UTF8_BINARY": delta-rs and DuckDB cannot read such a table. A cast by
        # its DDL name gives the plain string type.
        with_strings = [f for f in frame.schema.fields if "string" in f.dataType.simpleString()]
        if not with_strings:
            return frame
        recast = {f.name: F.col(f"`{f.name}`").cast(f.dataType.simpleString()).alias(f.name) for f in with_strings}
        return frame.select(*(recast.get(name, F.col(f"`{name}`")) for name in frame.columns))

    def is_delta_table(self, spark: SparkSession, path: str) -> bool:
        try:
            [row] = spark.sql(f"DESCRIBE DETAIL {self._table(path)}").select("format").collect()
        except AnalysisException:
            return False
        return row["format"] == "delta"

    def schema(self, spark: SparkSession, path: str) -> StructType:
        return spark.read.format("delta").load(path).schema

    def create_table(
        self,
        spark: SparkSession,
        path: str,
        schema: StructType,
        *,
        partition_columns: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> None:
        columns = ", ".join(
            f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}" for f in schema.fields
        )
        statement = f"CREATE TABLE IF NOT EXISTS {self._table(path)} ({columns}) USING delta"
        if partition_columns:
            statement += " PARTITIONED BY (" + ", ".join(f"`{c}`" for c in partition_columns) + ")"
        if properties:
            statement += " TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in properties.items()) + ")"
        spark.sql(statement)

    def merge(
        self,
        spark: SparkSession,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        schema_evolution: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        view = f"merge_source_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        parts = [
            f"MERGE {'WITH SCHEMA EVOLUTION ' if schema_evolution else ''}INTO {self._table(path)} AS t",
            f"USING {view} AS s ON {on}",
        ]
        for clause in clauses:
            when = "WHEN NOT MATCHED" if clause.action == "insert" else "WHEN MATCHED"
            condition = f" AND ({clause.condition})" if clause.condition else ""
            assignments = dict(clause.assignments or {})
            if clause.action == "delete":
                action = "DELETE"
            elif clause.action == "update":
                action = "UPDATE SET " + ", ".join(f"t.`{c}` = {e}" for c, e in assignments.items())
            else:
                action = (
                    "INSERT ("
                    + ", ".join(f"`{c}`" for c in assignments)
                    + ") VALUES ("
                    + ", ".join(assignments.values())
                    + ")"
                )
            parts.append(f"{when}{condition} THEN {action}")
        try:
            self.execute_merge(spark, _SqlStatement(spark, " ".join(parts)), metadata or {})
        finally:
            spark.catalog.dropTempView(view)

    def compact(self, spark: SparkSession, path: str) -> None:
        spark.sql(f"OPTIMIZE {self._table(path)}").collect()

    def vacuum(self, spark: SparkSession, path: str, *, retention_hours: float) -> None:
        spark.sql(f"VACUUM {self._table(path)} RETAIN {float(retention_hours)} HOURS").collect()

    def detail(self, spark: SparkSession, path: str) -> TableDetail:
        row = spark.sql(f"DESCRIBE DETAIL {self._table(path)}").first()
        assert row is not None, "DESCRIBE DETAIL returns one row"
        return TableDetail.from_row(row.asDict(recursive=True))

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        # A Connect client has no handle on the DeltaLog: the SQL route.
        return self._state_from_detail(spark, path, version)

    def _history(self, spark: SparkSession, path: str, limit: int | None = 1) -> DataFrame:
        return spark.sql(f"DESCRIBE HISTORY {self._table(path)}" + (f" LIMIT {int(limit)}" if limit else ""))


@dataclass(frozen=True)
class _SqlStatement:
    """A SQL statement with a merge builder's ``execute()``."""

    spark: SparkSession
    text: str

    def execute(self) -> None:
        self.spark.sql(self.text).collect()
