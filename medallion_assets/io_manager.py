"""The Delta IO manager: asset key ``[layer, table]`` <-> ``<lake root>/<layer>/<table>``.

Split the way dagster-deltalake splits its IO manager:

* :class:`DeltaIOManager` is the configuration (a ``ConfigurableIOManager``) and
  the Dagster side: it turns contexts into a :class:`WriteSpec` or a read, and
  keeps the watermarks that make incremental inputs incremental.
* :class:`DeltaTableClient` talks to the tables: writes in each mode, reads
  pinned versions and change ranges, and describes a table for metadata.
* :class:`SparkDataFrameTypeHandler` turns a Spark DataFrame into a write and a
  write into Dagster output metadata.

How an asset is stored is declared in its metadata with :func:`delta_table`,
never in the asset's code.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from dagster import (
    AssetKey,
    ConfigurableIOManager,
    DagsterEventType,
    InputContext,
    MetadataValue,
    OutputContext,
    TableColumn,
    TableSchema,
)
from pydantic import BaseModel, Field, model_validator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from medallion_assets.engine import CommitFacts, DeltaEngine, MergeClause, engine_for
from medallion_assets.resources import LakeResource, SparkResource

#: Metadata keys an asset declares its storage with (see :func:`delta_table`).
WRITE_MODE = "delta/write_mode"
MERGE_KEYS = "delta/merge_keys"
SEQUENCE_COLUMN = "delta/sequence_column"
DELETE_COLUMN = "delta/delete_column"
SCHEMA_MODE = "delta/schema_mode"
PARTITION_COLUMNS = "delta/partition_columns"
TABLE_PROPERTIES = "delta/table_properties"
PARTITION_EXPR = "delta/partition_expr"
REPLACE_GROUP = "delta/replace_group"
#: Input metadata: ``"changes"`` reads only what the upstream gained since this step last consumed it.
READ = "delta/read"
VERSION = "delta/version"
COLUMNS = "delta/columns"
#: Output metadata an asset may attach to name what it was computed from
#: (e.g. the reference snapshot file); part of the unchanged-input test.
SOURCE = "medallion/source"

_CONSUMED_PREFIX = "medallion/consumed/"
#: Commit metadata key (``consumed.<layer>/<table>``) of the upstream version a write took in.
_CONSUMED_COMMIT_PREFIX = "consumed."
_INPUTS = "medallion/inputs"
_PREVIEW_ROWS = 5


class WriteSpec(BaseModel):
    """How one output is written, read from the asset's metadata.

    Validated when built, so a typo in an asset's metadata fails the run before
    any data is written.
    """

    mode: Literal["overwrite", "append", "merge"] = Field(
        default="overwrite", description="overwrite (default), append, or merge on merge_keys."
    )
    merge_keys: tuple[str, ...] = Field(default=(), description="Key columns a merge matches on.")
    sequence_column: str | None = Field(
        default=None,
        description="Merge only: a change applies only if its value here is newer than the stored one.",
    )
    delete_column: str | None = Field(
        default=None,
        description="Merge only: boolean column; a true row deletes its key (and is remembered as a tombstone).",
    )
    schema_mode: Literal["strict", "merge", "overwrite"] = Field(
        default="strict",
        description=(
            "strict, merge (add new columns; in a merge, table columns the rows lack are stored as null) "
            "or overwrite (replace the schema)."
        ),
    )
    partition_columns: tuple[str, ...] = Field(
        default=(), description="Columns the table is partitioned by when it is created."
    )
    table_properties: dict[str, str] = Field(
        default_factory=dict, description="Delta table properties set when the table is created."
    )
    partition_expr: str | None = Field(
        default=None,
        description="Column that holds the time of a time-window partitioned asset; its partition is replaced with replaceWhere.",
    )
    replace_group: str | None = Field(
        default=None,
        description=(
            "Merge only: a newer change of a group (e.g. an order) replaces all its stored rows "
            "(e.g. its line items); needs sequence_column and delete_column."
        ),
    )

    @model_validator(mode="after")
    def _consistent(self) -> WriteSpec:
        if self.mode == "merge" and not self.merge_keys:
            raise ValueError("write mode 'merge' needs merge_keys")
        if self.mode != "merge" and (self.sequence_column or self.delete_column or self.replace_group):
            raise ValueError("sequence_column, delete_column and replace_group apply to write mode 'merge' only")
        if self.replace_group and not (self.sequence_column and self.delete_column):
            raise ValueError("replace_group needs sequence_column and delete_column")
        return self

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> WriteSpec:
        """Build the spec from asset definition metadata (``delta/*`` keys)."""

        def raw(key: str, default: Any = None) -> Any:
            value = metadata.get(key, default)
            return getattr(value, "value", value)  # MetadataValue wrappers

        return cls(
            mode=raw(WRITE_MODE, "overwrite"),
            merge_keys=tuple(raw(MERGE_KEYS, ()) or ()),
            sequence_column=raw(SEQUENCE_COLUMN),
            delete_column=raw(DELETE_COLUMN),
            schema_mode=raw(SCHEMA_MODE, "strict"),
            partition_columns=tuple(raw(PARTITION_COLUMNS, ()) or ()),
            table_properties=dict(raw(TABLE_PROPERTIES, {}) or {}),
            partition_expr=raw(PARTITION_EXPR),
            replace_group=raw(REPLACE_GROUP),
        )


def delta_table(
    *,
    write_mode: Literal["overwrite", "append", "merge"] = "overwrite",
    merge_keys: Sequence[str] = (),
    sequence_column: str | None = None,
    delete_column: str | None = None,
    schema_mode: Literal["strict", "merge", "overwrite"] = "strict",
    partition_columns: Sequence[str] = (),
    table_properties: Mapping[str, str] | None = None,
    partition_expr: str | None = None,
    replace_group: str | None = None,
) -> dict[str, Any]:
    """Asset metadata declaring how the Delta IO manager stores an asset.

    Validates the combination now (at definition time), so mistakes surface in
    ``dagster definitions validate``.

    Args:
        write_mode: overwrite, append or merge.
        merge_keys: columns a merge matches on.
        sequence_column: a change is applied only if newer than the stored row.
        delete_column: boolean column marking deletes (merge only).
        schema_mode: strict, merge or overwrite.
        partition_columns: physical partition columns of a new table.
        table_properties: Delta properties of a new table.
        partition_expr: time column of a time-window partitioned asset.
        replace_group: merge by groups: a group's newer change replaces all its rows.

    Returns:
        Metadata to pass to ``@asset(metadata=...)``.
    """
    spec = WriteSpec(
        mode=write_mode,
        merge_keys=tuple(merge_keys),
        sequence_column=sequence_column,
        delete_column=delete_column,
        schema_mode=schema_mode,
        partition_columns=tuple(partition_columns),
        table_properties=dict(table_properties or {}),
        partition_expr=partition_expr,
        replace_group=replace_group,
    )
    metadata: dict[str, Any] = {WRITE_MODE: spec.mode, SCHEMA_MODE: spec.schema_mode}
    if spec.merge_keys:
        metadata[MERGE_KEYS] = list(spec.merge_keys)
    if spec.sequence_column:
        metadata[SEQUENCE_COLUMN] = spec.sequence_column
    if spec.delete_column:
        metadata[DELETE_COLUMN] = spec.delete_column
    if spec.partition_columns:
        metadata[PARTITION_COLUMNS] = list(spec.partition_columns)
    if spec.table_properties:
        metadata[TABLE_PROPERTIES] = dict(spec.table_properties)
    if spec.partition_expr:
        metadata[PARTITION_EXPR] = spec.partition_expr
    if spec.replace_group:
        metadata[REPLACE_GROUP] = spec.replace_group
    return metadata


@dataclass(frozen=True)
class WriteResult:
    """What a write did: the table's version afterwards and, when nothing was committed, why.

    ``commit`` is the newest commit after the write (read once, so describing
    the output does not read the log again); ``None`` when there is no table.
    """

    version: int | None
    skipped_reason: str | None = None
    commit: CommitFacts | None = None


@dataclass
class _StepReads:
    """What an executing step read: recorded on its ``LOADED_INPUT`` events, collected for its outputs.

    Attributes:
        consumed: upstream -> the version a ``changes`` input read up to.
        advanced: whether a ``changes`` input read at least one new commit.
        inputs: upstream -> the version a whole-table input read.
    """

    consumed: dict[str, int] = field(default_factory=dict)
    advanced: bool = False
    inputs: dict[str, int] = field(default_factory=dict)


#: Input metadata of each loaded input, read back when the step's outputs are handled.
_READ_TABLE = "delta/table"
_READ_VERSION = "delta/version"
_READ_CHANGES_FROM = "delta/changes_from_version"


class DeltaTableClient:
    """Reads and writes Delta tables with one SparkSession, on the session's Delta engine.

    Knows storage and nothing about Dagster, so it can be used from scripts and
    maintenance jobs too. What the two engines spell differently is asked of
    :class:`~medallion_assets.engine.DeltaEngine`; the rest is delta-spark's
    surface, which both ``DeltaTable`` classes share.

    Args:
        spark: the session.
        engine: its Delta engine (default: the one the session runs).
    """

    def __init__(self, spark: SparkSession, engine: DeltaEngine | None = None) -> None:
        self.spark = spark
        self.engine = engine or engine_for(spark)

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
                idempotent by their keys and sequence) except for an empty commit.
            empty_commit: ``(application id, version)``: when an append or merge
                writes no row, commit anyway (no data, ``commit_metadata`` only)
                as this transaction, creating the table if needed, so the
                table's log records what the write was computed from.

        Returns:
            The version committed, or why no row was written.
        """
        _check_column_names(frame, path)
        frame = self.engine.prepare_write(frame)
        metadata = dict(commit_metadata or {})
        if spec.mode not in ("append", "merge"):
            return self._write(frame, path, spec, replace_where, metadata, transaction)
        # An append or merge source is checked for rows before it is written, and a
        # merge's is read again for its deletes: computed once, not once per action.
        frame = frame.persist()
        try:
            result = self._write(frame, path, spec, replace_where, metadata, transaction)
            if result.skipped_reason is None or empty_commit is None:
                return result
            stored = frame.drop(spec.delete_column) if spec.delete_column else frame
            return self._commit_empty(stored.schema, path, spec, metadata, empty_commit, result.skipped_reason)
        finally:
            frame.unpersist()

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
        self._create_if_missing(self.spark.createDataFrame([], schema), path, spec)
        app_id, version = transaction
        writer = self.spark.createDataFrame([], self.engine.schema(self.spark, path)).write.format("delta").mode("append")
        for key, value in self.engine.commit_metadata_options(commit_metadata).items():
            writer = writer.option(key, value)
        writer.option("txnAppId", app_id).option("txnVersion", str(int(version))).save(path)
        return self._result(path, f"{reason} (an empty commit records what the write was computed from)")

    def _write(
        self,
        frame: DataFrame,
        path: str,
        spec: WriteSpec,
        replace_where: str | None,
        commit_metadata: dict[str, str],
        transaction: tuple[str, int] | None,
    ) -> WriteResult:
        if spec.mode in ("append", "merge") and frame.isEmpty():
            return self._result(path, "no new rows")
        # Tables are created by the builder, which both engines accept with partitions
        # and properties (the delta-rs engine's writer cannot take partitionBy).
        if spec.partition_columns or spec.table_properties or (spec.mode == "merge") or replace_where:
            stored = frame.drop(spec.delete_column) if spec.delete_column else frame
            self._create_if_missing(stored, path, spec)
        if spec.mode == "merge":
            return self._merge(frame, path, spec, commit_metadata)
        writer = frame.write.format("delta").mode(spec.mode)
        if replace_where:
            writer = writer.option("replaceWhere", replace_where)
        if spec.schema_mode == "merge":
            writer = writer.option("mergeSchema", "true")
        elif spec.schema_mode == "overwrite":
            writer = writer.option("overwriteSchema", "true")
        for key, value in self.engine.commit_metadata_options(commit_metadata).items():
            writer = writer.option(key, value)
        if transaction is not None:
            app_id, version = transaction
            writer = writer.option("txnAppId", app_id).option("txnVersion", str(int(version)))
        writer.save(path)
        return self._result(path)

    def _create_if_missing(self, frame: DataFrame, path: str, spec: WriteSpec) -> None:
        # Python data sources cannot take .partitionBy(); the table builder can, on both engines.
        if self.exists(path):
            return
        properties = {key if key.startswith("delta.") else f"delta.{key}": value for key, value in spec.table_properties.items()}
        self.engine.create_table(
            self.spark, path, frame.schema, partition_columns=spec.partition_columns, properties=properties
        )

    def _merge(
        self, frame: DataFrame, path: str, spec: WriteSpec, commit_metadata: Mapping[str, str]
    ) -> WriteResult:
        """Upsert ``frame`` on the merge keys (on the delta-rs engine, in delta-rs on the driver).

        With a delete column, deleted keys are kept with their sequence value in
        a tombstone table next to the target, so a change older than a delete
        that arrives later cannot bring the row back.
        """
        if spec.replace_group:
            return self._merge_groups(frame, path, spec, commit_metadata)
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in spec.merge_keys)
        seq = spec.sequence_column
        newer = f"s.`{seq}` > t.`{seq}`" if seq else None
        source = frame
        if spec.delete_column:
            source = self._drop_superseded_by_tombstones(source, path, spec)
            if source.isEmpty():
                return self._result(path, "every change is older than a delete")
        stored_schema = self.engine.schema(self.spark, path)
        source, new_columns = _evolve_source(source, stored_schema, spec)
        # Explicit assignments so the delete flag is never stored in the table.
        assignments = {c: f"s.`{c}`" for c in [*stored_schema.fieldNames(), *new_columns]}
        if spec.delete_column:
            deleted = f"s.`{spec.delete_column}`"
            not_deleted = f"NOT {deleted}"
            clauses = [
                MergeClause("delete", f"{deleted} AND {newer}" if newer else deleted),
                MergeClause("update", f"{not_deleted} AND {newer}" if newer else not_deleted, assignments),
                MergeClause("insert", not_deleted, assignments),
            ]
        else:
            clauses = [MergeClause("update", newer, assignments), MergeClause("insert", None, assignments)]
        self.engine.merge(
            self.spark, path, source, on=on, clauses=clauses, schema_evolution=bool(new_columns), metadata=commit_metadata
        )
        if spec.delete_column:
            self._remember_deletes(frame, path, spec)
        return self._result(path)

    def _merge_groups(
        self, frame: DataFrame, path: str, spec: WriteSpec, commit_metadata: Mapping[str, str]
    ) -> WriteResult:
        """Merge where a group's newest change replaces every stored row of the group.

        ``frame`` holds, per changed group, its new rows (delete flag false) or
        one row with the delete flag set. A change applies only when its
        sequence is newer than the group's stored rows and its tombstone;
        stored rows of an applied group that the change lacks are deleted.
        """
        group, seq, deleted = spec.replace_group, spec.sequence_column, spec.delete_column
        changes = frame.groupBy(group).agg(
            F.max(seq).alias("_change_seq"), F.max(F.col(deleted).cast("int")).cast("boolean").alias("_change_deletes")
        )
        tombstones_path = self.tombstone_path(path)
        if self.exists(tombstones_path):
            tombstones = self.read(tombstones_path).select(group, F.col(seq).alias("_deleted_at"))
            changes = changes.join(tombstones, group, "left").where(
                F.col("_deleted_at").isNull() | (F.col("_change_seq") > F.col("_deleted_at"))
            ).drop("_deleted_at")
        stored = self.read(path)
        frame, new_columns = _evolve_source(frame, stored.schema, spec)
        stored_groups = stored.groupBy(group).agg(F.max(seq).alias("_stored_seq"))
        applied = (
            changes.join(stored_groups, group, "left")
            .where(F.col("_stored_seq").isNull() | (F.col("_change_seq") > F.col("_stored_seq")))
            .cache()
        )
        columns = [*stored.columns, *new_columns]
        upserts = (
            frame.where(~F.col(deleted))
            .join(applied.where(~F.col("_change_deletes")).select(group), group, "left_semi")
            .select(*columns)
        )
        keys = list(spec.merge_keys)
        removals = (
            stored.join(applied.select(group), group, "left_semi")
            .join(upserts.select(*keys), keys, "left_anti")
            .select(*stored.columns, *(F.lit(None).cast(frame.schema[c].dataType).alias(c) for c in new_columns))
        )
        source = upserts.withColumn("_remove", F.lit(False)).unionByName(removals.withColumn("_remove", F.lit(True)))
        if source.isEmpty():
            return self._result(path, "every change is older than the stored state")
        on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in keys)
        assignments = {c: f"s.`{c}`" for c in columns}
        clauses = [
            MergeClause("delete", "s._remove"),
            MergeClause("update", "NOT s._remove", assignments),
            MergeClause("insert", "NOT s._remove", assignments),
        ]
        self.engine.merge(
            self.spark, path, source, on=on, clauses=clauses, schema_evolution=bool(new_columns), metadata=commit_metadata
        )
        group_deletes = frame.where(F.col(deleted)).groupBy(group).agg(F.max(seq).alias(seq))
        if not group_deletes.isEmpty():
            tombstone_spec = WriteSpec(mode="merge", merge_keys=(group,), sequence_column=seq)
            self.write(group_deletes, tombstones_path, tombstone_spec)
        applied.unpersist()
        return self._result(path)

    @staticmethod
    def tombstone_path(path: str) -> str:
        """Where the deleted keys of a merge-with-deletes table are kept."""
        return path.rstrip("/") + "__tombstones"

    def _drop_superseded_by_tombstones(self, source: DataFrame, path: str, spec: WriteSpec) -> DataFrame:
        tombstones_path = self.tombstone_path(path)
        if not self.exists(tombstones_path) or not spec.sequence_column:
            return source
        seq = spec.sequence_column
        tombstones = self.read(tombstones_path).withColumnRenamed(seq, "_deleted_at")
        joined = source.join(tombstones, list(spec.merge_keys), "left")
        kept = joined.where(F.col("_deleted_at").isNull() | (F.col(seq) > F.col("_deleted_at")))
        return kept.select(*source.columns)

    def _remember_deletes(self, frame: DataFrame, path: str, spec: WriteSpec) -> None:
        columns = [*spec.merge_keys, *([spec.sequence_column] if spec.sequence_column else [])]
        deletes = frame.where(F.col(spec.delete_column)).select(*columns)
        if deletes.isEmpty():
            return
        tombstone_spec = WriteSpec(mode="merge", merge_keys=spec.merge_keys, sequence_column=spec.sequence_column)
        self.write(deletes, self.tombstone_path(path), tombstone_spec)

    # ---- describing ----------------------------------------------------
    def output_metadata(
        self, path: str, *, commit: CommitFacts | None = None, preview_rows: int = _PREVIEW_ROWS
    ) -> dict[str, Any]:
        """Dagster metadata describing the table's current version.

        Version, operation and its metrics, rows, files, bytes, the schema as
        ``dagster/column_schema``, partition columns and a preview. ``commit``:
        the newest commit when the caller has just read it (a write's result).

        Rows, files and bytes are those of the commit's version in the Delta
        log (the add actions' statistics), not a scan of the table; the rows are
        counted only when some file's statistics lack them.
        """
        commit = commit or self.engine.latest_commit(self.spark, path)
        state = self.engine.table_state(self.spark, path, commit.version)
        frame = state.frame
        rows = state.num_records if state.num_records is not None else frame.count()
        metrics = commit.operation_metrics
        return {
            "delta/engine": self.engine.name,
            "dagster/column_schema": spark_table_schema(frame),
            "dagster/row_count": rows,
            "dagster/uri": MetadataValue.path(path),
            "delta/version": commit.version,
            "delta/operation": commit.operation,
            "delta/operation_metrics": MetadataValue.json(json.loads(json.dumps(metrics, default=str))),
            "delta/num_files": state.num_files,
            "delta/size_bytes": state.size_bytes,
            "delta/partition_columns": MetadataValue.json(state.partition_columns),
            # A limit over the version just written: Spark reads the first file(s) only.
            "preview": MetadataValue.md(markdown_preview(frame, preview_rows)),
        }


#: Characters Delta refuses in column names of tables without column mapping
#: (delta-spark enforces it; delta-rs would store them): one rule for both engines.
_INVALID_COLUMN_CHARACTERS = " ,;{}()\n\t="


def _check_column_names(frame: DataFrame, path: str) -> None:
    """Refuse column names Delta cannot store without column mapping, before anything is written."""
    bad = [name for name in frame.columns if any(ch in name for ch in _INVALID_COLUMN_CHARACTERS)]
    if bad:
        raise ValueError(
            f"cannot write {path}: column name(s) {bad} contain a character Delta does not allow "
            f"in column names (one of {_INVALID_COLUMN_CHARACTERS!r}); give them plain names with "
            "alias(), e.g. F.sum('n').alias('total')"
        )


def _evolve_source(frame: DataFrame, stored: StructType, spec: WriteSpec) -> tuple[DataFrame, list[str]]:
    """Line a merge source up with the table when ``schema_mode`` is ``merge``.

    A merged row replaces the stored one, so a table column the source lacks
    is stored as null (a typed null column is added to the source). Source
    columns the table lacks are returned, for the merge to add. With any other
    schema mode the source is returned as it is, and no column is added.
    """
    if spec.schema_mode != "merge":
        return frame, []
    present = {c.lower() for c in frame.columns}
    stored_names = {f.name.lower() for f in stored.fields}
    missing = [F.lit(None).cast(f.dataType).alias(f.name) for f in stored.fields if f.name.lower() not in present]
    new_columns = [c for c in frame.columns if c.lower() not in stored_names and c != spec.delete_column]
    return (frame.select("*", *missing) if missing else frame), new_columns


def spark_table_schema(frame: DataFrame) -> TableSchema:
    """A DataFrame's schema as Dagster's table schema."""
    return TableSchema(
        columns=[
            TableColumn(name=f.name, type=f.dataType.simpleString(), description=None)
            for f in frame.schema.fields
        ]
    )


def markdown_preview(frame: DataFrame, rows: int = _PREVIEW_ROWS) -> str:
    """The first ``rows`` rows as a Markdown table."""
    columns = frame.columns
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in frame.limit(rows).collect():
        cells = [str(v).replace("|", "\\|").replace("\n", " ")[:60] for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


class SparkDataFrameTypeHandler:
    """Spark DataFrames in and out of the Delta IO manager.

    The only type the lake stores; a second engine (pyarrow, pandas) would be a
    second handler next to this one.
    """

    supported_types = (DataFrame,)

    def handle_output(
        self,
        client: DeltaTableClient,
        frame: DataFrame,
        path: str,
        spec: WriteSpec,
        *,
        replace_where: str | None,
        commit_metadata: Mapping[str, str],
        transaction: tuple[str, int] | None = None,
        empty_commit: tuple[str, int] | None = None,
    ) -> tuple[WriteResult, dict[str, Any]]:
        """Write ``frame`` and describe the table afterwards."""
        if not isinstance(frame, DataFrame):
            raise TypeError(f"the Delta IO manager stores Spark DataFrames, got {type(frame).__name__}")
        result = client.write(
            frame, path, spec, replace_where=replace_where, commit_metadata=commit_metadata, transaction=transaction,
            empty_commit=empty_commit,
        )
        metadata = client.output_metadata(path, commit=result.commit) if result.commit else {"dagster/row_count": 0}
        return result, metadata

    def load_input(
        self, client: DeltaTableClient, path: str, *, version: int | None, columns: Sequence[str] | None
    ) -> DataFrame:
        """The table as a DataFrame."""
        return client.read(path, version=version, columns=columns)


def _key_name(key: AssetKey) -> str:
    return "/".join(key.path)


class DeltaIOManager(ConfigurableIOManager):
    """Stores each asset as the Delta table ``<lake root>/<layer>/<table>``.

    Write behaviour comes from the asset's metadata (:func:`delta_table`);
    inputs read the latest version, a pinned ``delta/version``, selected
    ``delta/columns``, or with ``delta/read: changes`` only the rows the upstream
    gained since this step last consumed it.

    An overwrite whose inputs (upstream versions, partition, declared source)
    are the same as at its last materialization is not rewritten: rerunning with
    nothing new changes no table.
    """

    spark: SparkResource
    lake: LakeResource
    skip_unchanged: bool = Field(
        default=True,
        description="Do not rewrite an overwrite-mode table whose inputs have not changed since it was written.",
    )

    def _client(self) -> DeltaTableClient:
        return DeltaTableClient(self.spark.spark_session, self.spark.delta_engine_in_use)

    def _path(self, key: AssetKey) -> str:
        return self.lake.table_path(key.path)

    # ---- inputs --------------------------------------------------------
    def load_input(self, context: InputContext) -> DataFrame:
        client = self._client()
        key = context.asset_key
        path = self._path(key)
        metadata = dict(context.definition_metadata or {})
        version = metadata.get(VERSION)
        columns = metadata.get(COLUMNS)
        if not client.exists(path):
            raise FileNotFoundError(
                f"asset {key.to_user_string()} has no Delta table yet at {path}: materialize it first"
            )
        latest = client.latest_version(path)
        if metadata.get(READ) == "changes":
            after = self._consumed_version(client, context, key)
            # Recorded on the step's LOADED_INPUT event: its outputs read it from there.
            context.add_input_metadata(
                {_READ_TABLE: _key_name(key), _READ_CHANGES_FROM: after + 1, _READ_VERSION: latest},
                description=f"versions {after + 1}..{latest} read as changes",
            )
            frame = client.read_changes(path, after_version=after, to_version=latest)
            context.log.info(f"{key.to_user_string()}: reading versions {after + 1}..{latest}")
            return frame.select(*columns) if columns else frame
        context.add_input_metadata(
            {_READ_TABLE: _key_name(key), _READ_VERSION: int(version) if version is not None else latest}
        )
        frame = SparkDataFrameTypeHandler().load_input(client, path, version=version, columns=columns)
        if context.has_asset_partitions and context.upstream_output is not None:
            partition_expr = (context.upstream_output.definition_metadata or {}).get(PARTITION_EXPR)
            if partition_expr:
                frame = frame.where(_time_window_predicate(partition_expr, context.asset_partitions_time_window))
        return frame

    @staticmethod
    def _step_reads(context: OutputContext) -> _StepReads:
        """What this step's inputs read, from the ``LOADED_INPUT`` events of this run.

        The IO manager keeps no state between loading and storing, so it works
        with any executor; a retried step loads its inputs again, and its later
        events win.
        """
        step_key = context.step_context.step.key
        records = context.step_context.instance.get_records_for_run(
            run_id=context.run_id, of_type=DagsterEventType.LOADED_INPUT
        ).records
        reads = _StepReads()
        for record in records:
            entry = record.event_log_entry
            if entry.step_key != step_key or entry.dagster_event is None:
                continue
            loaded = entry.dagster_event.event_specific_data.metadata or {}
            if _READ_TABLE not in loaded or _READ_VERSION not in loaded:
                continue
            table, version = str(loaded[_READ_TABLE].value), int(loaded[_READ_VERSION].value)
            if _READ_CHANGES_FROM in loaded:
                reads.consumed[table] = version
                reads.advanced = reads.advanced or int(loaded[_READ_CHANGES_FROM].value) <= version
            else:
                reads.inputs[table] = version
        return reads

    def _consumed_version(self, client: DeltaTableClient, context: InputContext, upstream: AssetKey) -> int:
        """The newest upstream version every one of this step's tables has taken in (-1: none).

        Read from the tables' own Delta logs: each write of such a step records
        ``consumed.<upstream>`` in its commit (an empty commit when it had no
        rows), so the answer survives a wiped Dagster instance and a change of
        engine. The oldest over the step's outputs: when a blocking check stops
        a step after its quarantine was written but before its tables were, the
        tables have not consumed the increment, and the next run must read it
        again.
        """
        key = _CONSUMED_COMMIT_PREFIX + _key_name(upstream)
        versions = []
        for output in context.step_context.get_output_asset_keys():
            path = self._path(output)
            value = client.engine.newest_commit_value(client.spark, path, key) if client.exists(path) else None
            versions.append(-1 if value is None else int(value))
        return min(versions, default=-1)

    # ---- outputs -------------------------------------------------------
    def handle_output(self, context: OutputContext, obj: DataFrame) -> None:
        client = self._client()
        key = context.asset_key
        path = self._path(key)
        spec = WriteSpec.from_metadata(context.definition_metadata or {})
        reads = self._step_reads(context)

        replace_where = None
        fingerprint: dict[str, Any] = {"inputs": dict(sorted(reads.inputs.items()))}
        source = (context.output_metadata or {}).get(SOURCE)
        if source is not None:
            fingerprint["source"] = str(getattr(source, "value", source))
        if context.has_asset_partitions:
            if not spec.partition_expr:
                raise ValueError(f"{key.to_user_string()} is partitioned but declares no partition_expr")
            window = context.asset_partitions_time_window
            replace_where = _time_window_predicate(spec.partition_expr, window)
            fingerprint["partition"] = [window.start.isoformat(), window.end.isoformat()]
        fingerprint_json = json.dumps(fingerprint, sort_keys=True)

        step_metadata: dict[str, Any] = {_CONSUMED_PREFIX + k: v for k, v in reads.consumed.items()}
        step_metadata["dagster/table_name"] = ".".join(key.path)
        if spec.delete_column:
            # The deleted keys live in a Delta table of their own next to this one (maintained with it).
            step_metadata["delta/tombstones"] = MetadataValue.path(client.tombstone_path(path))
        # Spark lowercases writer option keys: snake_case keeps them readable in the commit.
        commit_metadata = {"dagster_run_id": context.run_id, "dagster_asset_key": _key_name(key)}
        commit_metadata.update({_CONSUMED_COMMIT_PREFIX + k: str(v) for k, v in reads.consumed.items()})

        if (
            self.skip_unchanged
            and spec.mode == "overwrite"
            and (reads.inputs or source is not None)
            and client.exists(path)
            and self._previous_fingerprint(context) == fingerprint_json
        ):
            metadata = client.output_metadata(path)
            metadata["delta/skipped"] = "inputs unchanged since the last materialization"
            context.add_output_metadata({**metadata, _INPUTS: fingerprint_json, **step_metadata})
            return

        # A step retried after its append committed (a retry policy, a lost executor)
        # must not append again: one Delta transaction per run, output and partition.
        window = fingerprint.get("partition")
        run_output = f"dagster:{_key_name(key)}:{context.run_id}" + (f":{window[0]}" if window else "")
        transaction = (run_output, 0) if spec.mode == "append" else None
        # A write that took in new upstream commits records them even without rows (an
        # empty commit), so the next run starts after them. Its own transaction, versioned
        # by the sum of the consumed versions (it grows with any of them): a retry that
        # read further commits records again, one that read the same does not.
        empty_commit = (run_output + ":consumed", sum(reads.consumed.values())) if reads.advanced else None

        context.log.info(f"{key.to_user_string()}: Delta engine {client.engine.describe()}")
        result, metadata = SparkDataFrameTypeHandler().handle_output(
            client, obj, path, spec, replace_where=replace_where, commit_metadata=commit_metadata,
            transaction=transaction, empty_commit=empty_commit,
        )
        if result.skipped_reason:
            metadata["delta/skipped"] = result.skipped_reason
        context.add_output_metadata({**metadata, _INPUTS: fingerprint_json, **step_metadata})

    def _previous_fingerprint(self, context: OutputContext) -> str | None:
        event = context.step_context.instance.get_latest_materialization_event(context.asset_key)
        if event is None or event.asset_materialization is None:
            return None
        # A partition's fingerprint includes its window, so only the same partition matches.
        value = event.asset_materialization.metadata.get(_INPUTS)
        return None if value is None else str(value.value)


def _time_window_predicate(column: str, window: Any) -> str:
    """``start <= column < end`` with typed literals, for Spark and for replaceWhere.

    Windows on day boundaries (daily, weekly, monthly partitions) use ``DATE``
    literals, which compare right with both date and timestamp columns in
    Spark SQL and in DataFusion (the delta-rs engine's replaceWhere). Other
    windows use ``TIMESTAMP`` literals.
    """
    def literal(moment: Any) -> str:
        if (moment.hour, moment.minute, moment.second, moment.microsecond) == (0, 0, 0, 0):
            return f"DATE '{moment.strftime('%Y-%m-%d')}'"
        return f"TIMESTAMP '{moment.strftime('%Y-%m-%d %H:%M:%S')}'"

    return f"`{column}` >= {literal(window.start)} AND `{column}` < {literal(window.end)}"
