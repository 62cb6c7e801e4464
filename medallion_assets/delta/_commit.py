"""Planning a write on the driver and committing its files through delta-rs.

A write happens in three steps: :func:`plan_write` (driver, before any task:
schema enforcement, options, constraints), the tasks' :class:`TableFileWriter`
(Parquet files and their statistics), and :func:`commit_write` (driver: one
Delta transaction through ``create_write_transaction``). If the commit fails,
the files the tasks wrote are deleted, so a failed write commits nothing and
leaves nothing behind but what vacuum would remove anyway.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote

import deltalake
import pyarrow as pa
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.exceptions import DeltaError as DeltaRsError
from deltalake.schema import Field
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction, create_table_with_add_actions
from pyspark import TaskContext
from pyspark.sql import types as T
from pyspark.sql.datasource import WriterCommitMessage

from medallion_assets.delta._engine import PredicateError, check_predicate, holds
from medallion_assets.delta._files import TableFileWriter, WrittenFile
from medallion_assets.delta._merge import add_assigned_fields
from medallion_assets.delta._options import WriteOptions
from medallion_assets.delta._read import read_data_file
from medallion_assets.delta._schema import (
    delta_to_spark_schema,
    refuse_growth_inside_maps,
    resolve_write_schema,
    spark_to_arrow_schema,
    spark_to_delta_schema,
)
from medallion_assets.delta._snapshot import (
    DataFile,
    Snapshot,
    check_read_support,
    file_key,
    file_location,
    normalize_path,
    resolve_snapshot,
)
from medallion_assets.delta.errors import (
    ConcurrentWriteError,
    DeltaError,
    DeltaOptionError,
    SchemaMismatchError,
    UnsupportedFeatureError,
)

# Writer features whose rules this writer follows (or that need nothing of it).
SUPPORTED_WRITER_FEATURES = frozenset(
    {
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "timestampNtz",
        "domainMetadata",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "deletionVectors",
    }
)


@dataclass(frozen=True)
class WritePlan:
    """Everything tasks and the commit need, decided once on the driver."""

    location: str
    mode: Literal["append", "overwrite"]
    options: WriteOptions
    table_exists: bool
    read_version: int | None
    table_schema: T.StructType
    """The table's schema after this write."""
    partition_columns: list[str]
    checks: list[tuple[str, str]] = field(default_factory=list)
    """``(description, SQL predicate)`` every written row must satisfy."""
    replace_where: str | None = None
    """The ``replaceWhere`` predicate, as the user wrote it (DataFusion evaluates it)."""
    schema_changed: bool = False

    @property
    def arrow_schema(self) -> pa.Schema:
        return spark_to_arrow_schema(self.table_schema, table=self.location)

    def file_writer(self, task_id: int) -> TableFileWriter:
        kwargs = {}
        if self.options.target_file_size:
            kwargs["file_bytes"] = self.options.target_file_size
        if self.options.max_records_per_file:
            kwargs["row_group_rows"] = self.options.max_records_per_file
            kwargs["file_bytes"] = 1  # one row group per file: at most maxRecordsPerFile rows
        return TableFileWriter(
            self.location,
            self.arrow_schema,
            self.partition_columns,
            task_id=task_id,
            checks=self.checks,
            table_name=self.location,
            **kwargs,
        )


def _check_writer_features(table: deltalake.DeltaTable, location: str) -> None:
    protocol = table.protocol()
    features = set(protocol.writer_features or [])
    unsupported = sorted(features - SUPPORTED_WRITER_FEATURES)
    config = table.metadata().configuration
    if config.get("delta.columnMapping.mode", "none") not in ("none", None):
        unsupported.append("columnMapping")
    if protocol.min_writer_version > 7 or unsupported:
        raise UnsupportedFeatureError(
            f"the table needs writer features this package does not support: {', '.join(unsupported)}; "
            "write it with an engine that supports them (delta-spark, delta-rs)",
            table=location,
        )


def table_checks(configuration: Mapping[str, str], schema: T.StructType, *, location: str) -> list[tuple[str, str]]:
    """The CHECK constraints of a table, each planned over ``schema`` by the engine that evaluates it.

    Raises:
        UnsupportedFeatureError: a constraint the writer could not evaluate (the write is refused
            before any task runs, rather than skipping the constraint).
    """
    arrow_schema = spark_to_arrow_schema(schema, table=location)
    checks = []
    for key, text in configuration.items():
        if not key.startswith("delta.constraints."):
            continue
        name = key[len("delta.constraints.") :]
        try:
            check_predicate(text, arrow_schema)
        except PredicateError as exc:
            raise UnsupportedFeatureError(
                f"CHECK constraint {name} ({text}) cannot be evaluated on the table's columns by DataFusion, "
                f"the SQL engine of delta-rs and of this writer ({exc.message}); drop it with "
                "DeltaTable.dropConstraint, or write with delta-spark",
                table=location,
            ) from exc
        checks.append((f"CHECK constraint {name} ({text})", text))
    return checks


def _planned_replace_where(text: str, schema: T.StructType, *, location: str) -> str:
    try:
        check_predicate(text, spark_to_arrow_schema(schema, table=location))
    except PredicateError as exc:
        raise DeltaOptionError(
            f'replaceWhere "{text}" cannot be evaluated on the table\'s columns ({exc.message}); '
            "it takes a SQL predicate as delta-rs reads SQL (DataFusion)",
            table=location,
        ) from exc
    return text


def open_existing(location: str, storage_options: dict[str, str] | None = None) -> deltalake.DeltaTable | None:
    try:
        return deltalake.DeltaTable(location, storage_options=storage_options)
    except TableNotFoundError:
        return None


def plan_write(
    path: str,
    data_schema: T.StructType,
    *,
    mode: Literal["append", "overwrite"],
    options: Mapping[str, str],
) -> WritePlan:
    """Check a write against the table before any task runs.

    Raises:
        DeltaOptionError: an unknown or bad option.
        SchemaMismatchError: the data does not fit the table's schema.
        UnsupportedTypeError: a column type Delta cannot store.
        UnsupportedFeatureError: the table needs features this writer lacks.
    """
    location = normalize_path(path)
    parsed = WriteOptions.parse(options, table=location, mode=mode)
    table = open_existing(location)
    # Delta tables written from DataFrames have nullable columns, as delta-spark makes them.
    incoming = T.StructType([T.StructField(f.name, f.dataType, True, f.metadata) for f in data_schema.fields])
    if table is None:
        spark_to_delta_schema(incoming, table=location)  # raises for unstorable types
        replace_where = (
            _planned_replace_where(parsed.replace_where, incoming, location=location) if parsed.replace_where else None
        )
        checks = [(f"replaceWhere ({replace_where})", replace_where)] if replace_where else []
        return WritePlan(location, mode, parsed, False, None, incoming, [], checks, replace_where)
    _check_writer_features(table, location)
    check_read_support(table, location)
    metadata = table.metadata()
    current = delta_to_spark_schema(table.schema())
    partition_columns = list(metadata.partition_columns)
    if mode == "overwrite" and parsed.overwrite_schema:
        missing = [c for c in partition_columns if c not in incoming.fieldNames()]
        if missing:
            raise SchemaMismatchError(
                f"overwriteSchema keeps the table's partition columns {partition_columns}, but the data lacks "
                f"{missing}; recreate the table with DeltaTable.createOrReplace(spark) to change partitioning",
                table=location,
            )
        new_schema = incoming
    else:
        new_schema = resolve_write_schema(current, data_schema, merge_schema=parsed.merge_schema, table=location)
        if parsed.merge_schema and _keeps_files(mode, parsed):
            refuse_growth_inside_maps(current, data_schema, table=location)
    missing_parts = [c for c in partition_columns if c.lower() not in {n.lower() for n in data_schema.fieldNames()}]
    if missing_parts:
        raise SchemaMismatchError(
            f"the data lacks the partition column(s) {missing_parts} of the table", table=location
        )
    if config_true(metadata.configuration, "delta.appendOnly") and mode == "overwrite":
        raise DeltaError(
            "the table is append-only (delta.appendOnly=true); overwrite and replaceWhere are refused. "
            "Append instead, or unset the property",
            table=location,
        )
    checks = table_checks(metadata.configuration, new_schema, location=location)
    replace_where = None
    if parsed.replace_where:
        replace_where = _planned_replace_where(parsed.replace_where, new_schema, location=location)
        checks.append((f"replaceWhere ({replace_where}); only rows it matches may be written", replace_where))
    return WritePlan(
        location=location,
        mode=mode,
        options=parsed,
        table_exists=True,
        read_version=table.version(),
        table_schema=new_schema,
        partition_columns=partition_columns,
        checks=checks,
        replace_where=replace_where,
        schema_changed=new_schema != current,
    )


def config_true(configuration: Mapping[str, str], key: str) -> bool:
    return str(configuration.get(key, "false")).lower() == "true"


def _add_actions(files: Iterable[WrittenFile], *, data_change: bool) -> list[AddAction]:
    return [
        AddAction(
            path=f.path,
            size=f.size,
            partition_values=f.partition_values,
            modification_time=f.modification_time,
            data_change=data_change,
            stats=f.stats,
        )
        for f in files
    ]


def delete_files(location: str, files: Iterable[WrittenFile]) -> None:
    """Remove data files a failed or skipped write left (never ones in the log)."""
    for f in files:
        try:
            os.remove(os.path.join(location, f.path))
        except FileNotFoundError:
            pass


def delete_uncommitted_files(location: str, files: Iterable[WrittenFile]) -> None:
    """Remove files of an aborted write, keeping any that a commit did reference.

    Spark aborts a write also when its commit raised after the Delta commit
    went through; files the log names must survive that.
    """
    files = list(files)
    if not files:
        return
    table = open_existing(location)
    live = set()
    if table is not None:
        live = {unquote(p) for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()}
    delete_files(location, [f for f in files if f.path not in live])


def _commit_properties(
    plan: WritePlan, extra: Mapping[str, object] | None = None, *, retries: int | None = None
) -> CommitProperties:
    metadata: dict[str, object] = dict(plan.options.commit_info)
    if plan.options.user_metadata is not None:
        metadata["userMetadata"] = plan.options.user_metadata
    if extra:
        metadata.update(extra)
    txns = None
    if plan.options.txn_app_id is not None and plan.options.txn_version is not None:  # set together
        txns = [Transaction(plan.options.txn_app_id, plan.options.txn_version)]
    return CommitProperties(custom_metadata=metadata or None, app_transactions=txns, max_commit_retries=retries)


def _relative_action_path(location: str, data_file: DataFile) -> str:
    # As for adds, delta-rs URI-encodes the path it is given.
    prefix = location.rstrip("/") + "/"
    return data_file.path[len(prefix) :] if data_file.path.startswith(prefix) else data_file.path


def _remove(location: str, data_file: DataFile, now: int) -> RemoveAction:
    return RemoveAction(
        path=_relative_action_path(location, data_file),
        data_change=True,
        deletion_timestamp=now,
        size=data_file.size,
        partition_values=data_file.partition_values,
    )


def _replace_where_actions(plan: WritePlan, table: deltalake.DeltaTable) -> tuple[list, list[WrittenFile]]:
    """Removes for the files whose rows the predicate replaces, and rewrites of the rows it keeps.

    delta-rs prunes the files that cannot hold a matching row (partition values and
    statistics); DataFusion then says, for each remaining file, which rows match:
    from its partition values alone when the predicate needs no other column, from
    its rows otherwise. A row is replaced only where the predicate is TRUE.
    """
    snapshot = resolve_snapshot(plan.location, table=table)
    predicate = plan.replace_where
    assert predicate is not None, "called for a replaceWhere write"
    candidates = _files_that_may_match(table, predicate)
    files = [f for f in snapshot.files if candidates is None or file_key(f.path) in candidates]
    if not files:
        return [], []
    by_partition = _partition_verdicts(table, snapshot, predicate)
    now = int(time.time() * 1000)
    actions: list = []
    rewritten: list[WrittenFile] = []
    for data_file in files:
        if by_partition is not None:
            if by_partition[data_file.path]:
                actions.append(_remove(plan.location, data_file, now))
            continue
        rows = _read_file(data_file, snapshot)
        replaced = holds(predicate, rows)
        if replaced.true_count == 0:
            continue
        actions.append(_remove(plan.location, data_file, now))
        if replaced.true_count == rows.num_rows:
            continue
        # Some rows match: keep the others in a new file.
        keep = rows.filter(pa.compute.invert(replaced))
        writer = TableFileWriter(
            plan.location, plan.arrow_schema, plan.partition_columns, task_id=99999, table_name=plan.location
        )
        rewritten.extend(writer.write_batches(keep.to_batches()))
    return actions, rewritten


def _files_that_may_match(table: deltalake.DeltaTable, predicate: str) -> set[str] | None:
    """The files delta-rs cannot rule out for ``predicate``; None when it cannot prune with it."""
    try:
        return {file_key(uri) for uri in table.file_uris(file_pruning_predicate=predicate)}
    except DeltaRsError:
        return None  # e.g. LIKE or functions: delta-rs prunes only with comparisons; every file is a candidate


def _partition_verdicts(table: deltalake.DeltaTable, snapshot: Snapshot, predicate: str) -> dict[str, bool] | None:
    """Whether ``predicate`` holds for each file, judged on its partition values alone.

    None when the predicate needs columns other than the partition columns, or the
    table has none: then only the rows can tell.
    """
    if not snapshot.partition_columns:
        return None
    actions = pa.table(table.get_add_actions(flatten=True))
    try:
        # delta-rs hands the partition values over typed.
        values = pa.table(
            {
                c: actions.column(f"partition.{c}").cast(snapshot.arrow_schema.field(c).type)
                for c in snapshot.partition_columns
            }
        )
        verdicts = holds(predicate, values)
    except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, PredicateError):
        return None
    paths = [file_location(snapshot.location, p) for p in actions.column("path").to_pylist()]
    return dict(zip(paths, verdicts.to_pylist(), strict=False))


def _read_file(data_file: DataFile, snapshot: Snapshot) -> pa.Table:
    return read_data_file(data_file, snapshot.arrow_schema, snapshot.partition_columns, table=snapshot.location)


def _dynamic_partition_removes(plan: WritePlan, table: deltalake.DeltaTable, files: list[WrittenFile]) -> list:
    touched = {tuple(sorted(f.partition_values.items(), key=lambda kv: kv[0])) for f in files}
    snapshot = resolve_snapshot(plan.location, table=table)
    now = int(time.time() * 1000)
    return [
        _remove(plan.location, f, now)
        for f in snapshot.files
        if tuple(sorted(f.partition_values.items(), key=lambda kv: kv[0])) in touched
    ]


def already_committed(table: deltalake.DeltaTable, app_id: str | None, version: int | None) -> bool:
    """Whether application ``app_id`` committed ``version`` (or a later one) to ``table``."""
    if app_id is None or version is None:  # txnAppId and txnVersion are set together
        return False
    done = table.transaction_version(app_id)
    return done is not None and done >= version


def write_metrics(files: Iterable[WrittenFile]) -> dict[str, str]:
    """A write's ``operationMetrics``: files, rows and bytes it wrote, in delta-spark's keys.

    String values, as delta-spark records them, so either engine's history
    reads alike. The files an overwrite removes are chosen by delta-rs inside
    the transaction, so their number is not known here.
    """
    files = list(files)
    return {
        "numFiles": str(len(files)),
        "numOutputRows": str(sum(f.num_records for f in files)),
        "numOutputBytes": str(sum(f.size for f in files)),
    }


def commit_write(
    plan: WritePlan, files: list[WrittenFile], *, extra_metadata: Mapping[str, object] | None = None
) -> int | None:
    """Commit the tasks' files as one transaction; returns the new version, or None if skipped.

    A write whose ``txnAppId`` already committed ``txnVersion`` (or a later one)
    is skipped and its files are deleted: that is how replays stay idempotent.
    The commit records :func:`write_metrics` (delta-rs's transactions record
    none of their own) unless ``extra_metadata`` brings its own ``operationMetrics``.

    Raises:
        ConcurrentWriteError: a concurrent commit conflicts with this one.
    """
    extra_metadata = {"operationMetrics": write_metrics(files), **(extra_metadata or {})}
    created: list[WrittenFile] = list(files)
    committed = False
    try:
        table = open_existing(plan.location)
        if table is not None and already_committed(table, plan.options.txn_app_id, plan.options.txn_version):
            delete_files(plan.location, created)
            return None
        if table is None:
            version = _create(plan, files, extra_metadata)
            if version is not None:
                return version
            table = open_existing(plan.location)
            assert table is not None, "another writer created the table: it exists"
        if plan.read_version is not None and plan.mode == "overwrite" and table.version() != plan.read_version:
            # An overwrite replaces what it read. delta-rs lets a blind append
            # slip under it, so refuse any commit since the planned version,
            # as delta-spark's ConcurrentAppendException does.
            winners = sorted(
                (h["version"], h.get("operation")) for h in table.history() if h["version"] > plan.read_version
            )
            described = ", ".join(f"{version}: {operation}" for version, operation in winners)
            raise ConcurrentWriteError(
                f"the overwrite was planned against version {plan.read_version}, but concurrent commits "
                f"({described}) changed the table since; nothing was committed: rerun the write",
                table=plan.location,
            )
        adds: list[AddAction | RemoveAction] = [*_add_actions(files, data_change=plan.options.data_change)]
        schema = spark_to_delta_schema(plan.table_schema, table=plan.location)
        if plan.schema_changed and _keeps_files(plan.mode, plan.options):
            # A whole overwrite writes its new schema in its own commit, below; the others cannot.
            _add_new_columns(table, plan)
        # A write that replaces data (overwrite, replaceWhere, dynamic partitions) must
        # land right after the version it checked: delta-rs would otherwise retry it
        # on top of a blind append that slipped in after the check, and its removes
        # would miss the appended files. Without retries the commit fails instead.
        exact = plan.mode != "append" and plan.read_version is not None
        props = _commit_properties(plan, extra_metadata, retries=0 if exact else None)
        if plan.mode == "append":
            table.create_write_transaction(adds, "append", schema, plan.partition_columns, commit_properties=props)
        elif plan.replace_where is not None:
            removes, rewritten = _replace_where_actions(plan, table)
            created.extend(rewritten)
            actions = adds + _add_actions(rewritten, data_change=True) + removes
            table.create_write_transaction(actions, "append", schema, plan.partition_columns, commit_properties=props)
        elif plan.options.dynamic_partition_overwrite:
            removes = _dynamic_partition_removes(plan, table, files)
            table.create_write_transaction(
                adds + removes, "append", schema, plan.partition_columns, commit_properties=props
            )
        else:
            table.create_write_transaction(adds, "overwrite", schema, plan.partition_columns, commit_properties=props)
        committed = True
        table.update_incremental()
        return table.version()
    except ConcurrentWriteError:
        delete_files(plan.location, created)
        raise
    except CommitFailedError as exc:
        delete_files(plan.location, created)
        raise ConcurrentWriteError(
            f"the {plan.mode} lost to a concurrent writer whose commit conflicts with it ({exc}); "
            "nothing was committed: rerun the write",
            table=plan.location,
        ) from exc
    except DeltaRsError as exc:
        delete_files(plan.location, created)
        raise DeltaError(f"the {plan.mode} could not be committed: {exc}", table=plan.location) from exc
    except BaseException:
        if not committed:
            delete_files(plan.location, created)
        raise


def _keeps_files(mode: str, options: WriteOptions) -> bool:
    """Whether the table keeps files written before this write: all but a whole overwrite do."""
    return mode == "append" or bool(options.replace_where) or options.dynamic_partition_overwrite


def _add_new_columns(table: deltalake.DeltaTable, plan: WritePlan) -> None:
    """Add the columns and struct fields mergeSchema brings, in commits of their own.

    delta-rs writes a new schema in the same commit only for overwrites, so an
    append that evolves the schema takes more commits: the new nullable
    columns first (with their metadata), then the fields that struct columns
    gain, then the data. If the data commit then fails, the table keeps the
    new (empty) columns and fields, and no rows.
    """
    current = {f.name.lower() for f in delta_to_spark_schema(table.schema()).fields}
    new = [f for f in plan.table_schema.fields if f.name.lower() not in current]
    if new:
        fields = [Field.from_json(json.dumps(f.jsonValue())) for f in new]
        table.alter.add_columns(fields, commit_properties=CommitProperties(custom_metadata={"mergeSchema": "true"}))
        table.update_incremental()
    add_assigned_fields(table, plan.arrow_schema, None)


def _create(plan: WritePlan, files: list[WrittenFile], extra_metadata) -> int | None:
    """Create the table with the write's files; None when someone else created it first."""
    schema = spark_to_delta_schema(plan.table_schema, table=plan.location)
    try:
        create_table_with_add_actions(
            plan.location,
            schema,
            _add_actions(files, data_change=True),
            mode="error",
            partition_by=plan.partition_columns or None,
            configuration=plan.options.properties or None,
            commit_properties=_commit_properties(plan, extra_metadata),
        )
    except DeltaRsError as exc:
        if "exist" in str(exc).lower() and open_existing(plan.location) is not None:
            return None
        raise
    return deltalake.DeltaTable(plan.location).version()


class DeltaCommitMessage(WriterCommitMessage):
    """The files one task wrote."""

    def __init__(self, files: list[WrittenFile]) -> None:
        self.files = files


def task_id() -> int:
    """The partition id of the Spark task running this code (0 on the driver)."""
    context = TaskContext.get()
    return context.partitionId() if context is not None else 0
