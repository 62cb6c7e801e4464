"""Writing a DataFrame to a Delta table with Spark's own Parquet writer: :func:`write_delta`.

The twin of :func:`~medallion_assets.delta.read_delta`. ``format("delta")``
hands every row to Python through the Data Source API and encodes it there;
here Spark's native Parquet writer writes the files (partitioned as the table
is, in the executors, at Parquet speed), and the driver commits them in one
delta-rs transaction, with statistics read from the files' footers. The write
is planned and committed by the same code as ``format("delta")``
(:func:`~medallion_assets.delta._commit.plan_write` and
:func:`~medallion_assets.delta._commit.commit_write`), so schema
enforcement, options, ``replaceWhere``, application transactions and conflict
checks are the same; CHECK and NOT NULL constraints are evaluated by Spark in
the same pass that writes the rows.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from medallion_assets.delta._commit import WritePlan, already_committed, commit_write, open_existing, plan_write
from medallion_assets.delta._files import WrittenFile, footer_stats, unescape_partition_value
from medallion_assets.delta._snapshot import normalize_path
from medallion_assets.delta._streaming import query_id_from_checkpoint, streaming_commit_info
from medallion_assets.delta.errors import (
    ConstraintViolationError,
    DeltaOptionError,
    SchemaMismatchError,
    UnsupportedFeatureError,
)

# Spark writes the files of one write here, inside the table's folder (so moving
# them into place is a rename), then they move to their partition folders. The
# name is not hidden, so a write killed before its commit leaves files that
# VACUUM removes like any other file the log does not name.
STAGING_PREFIX = "spark-write-"
# Marks the error a violating row raises, to tell it from other task failures.
_VIOLATION = "medallion_assets.delta constraint violation:"
_TIMESTAMP_CONF = "spark.sql.parquet.outputTimestampType"


def write_delta(
    df: DataFrame,
    path: str,
    *,
    mode: Literal["append", "overwrite"] = "append",
    partition_by: Sequence[str] | None = None,
    options: Mapping[str, object] | None = None,
) -> int | None:
    """Write ``df`` to the Delta table at ``path`` through Spark's Parquet writer (the fast route).

    Takes the options of ``df.write.format("delta")`` (``replaceWhere``,
    ``partitionOverwriteMode``, ``mergeSchema``, ``overwriteSchema``,
    ``txnAppId``/``txnVersion``, ``userMetadata``, ``commitInfo.*``,
    ``maxRecordsPerFile``, ``delta.*`` table properties) and behaves as it
    does; ``targetFileSize`` is left to Spark's file layout. The table's folder
    must be a path this process can reach, as for every delta-rs commit.

    Args:
        df: the rows to write.
        path: the table's location.
        mode: ``append`` or ``overwrite``.
        partition_by: partition columns of a table this write creates; an existing
            table keeps its own (naming others is an error).
        options: writer options, as for ``format("delta")``.

    Returns:
        The version committed, or ``None`` when ``txnAppId`` already committed
        ``txnVersion`` (nothing is written then).

    Raises:
        SchemaMismatchError: the data does not fit the table's schema or partitioning.
        ConstraintViolationError: a row breaks a CHECK or NOT NULL constraint or falls
            outside ``replaceWhere``; nothing is committed.
        ConcurrentWriteError: a concurrent commit conflicts with this one; nothing is committed.
        UnsupportedFeatureError: the table needs what this route cannot do (a timestamp
            partition column, or a constraint Spark cannot evaluate); ``format("delta")`` can.

    Example:
        >>> write_delta(orders, "lakehouse/silver/orders", mode="overwrite",
        ...             partition_by=["o_orderdate"], options={"userMetadata": "nightly"})
    """
    return _write(df, path, mode=mode, partition_by=partition_by, options=options)


def _write(
    df: DataFrame,
    path: str,
    *,
    mode: Literal["append", "overwrite"],
    partition_by: Sequence[str] | None = None,
    options: Mapping[str, object] | None = None,
    commit_info: Callable[[list[WrittenFile]], Mapping[str, object]] | None = None,
) -> int | None:
    """:func:`write_delta`, with ``commit_info`` adding keys to the commit from the files written."""
    location = normalize_path(path)
    plan = _with_partitioning(
        plan_write(location, df.schema, mode=mode, options={k: str(v) for k, v in (options or {}).items()}),
        partition_by,
    )
    if _already_committed(plan):
        return None
    staging = os.path.join(location, f"{STAGING_PREFIX}{uuid.uuid4().hex}")
    try:
        _write_parquet(_conformed(df, plan), plan, staging)
    except BaseException:
        _remove_once_tasks_stop(staging)
        raise
    try:
        files = _move_into_table(plan, staging)
        return commit_write(plan, files, extra_metadata=commit_info(files) if commit_info else None)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_once_tasks_stop(staging: str, *, quiet_seconds: float = 1.0, timeout_seconds: float = 30.0) -> None:
    """Remove a failed write's staging folder, again while it reappears.

    A job's error reaches the driver when its first task fails; Spark cancels the
    others asynchronously, and one still running can write into the folder (and
    create it again) after a first removal.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        shutil.rmtree(staging, ignore_errors=True)
        time.sleep(quiet_seconds)
        if not os.path.exists(staging) or time.monotonic() > deadline:
            return


@dataclass(frozen=True)
class MicroBatchAppender:
    """A ``foreachBatch`` function that appends each micro-batch with :func:`write_delta`, exactly once.

    Each batch commits with the application transaction ``(query id, batch id)``,
    the query id read from the checkpoint, so a batch Spark replays after a crash
    commits nothing the second time; the commit records ``queryId``/``epochId``
    and the batch's metrics as the ``delta`` stream sink and delta-spark's
    DeltaSink do. Build it with :func:`append_micro_batches`.
    """

    path: str
    checkpoint_location: str
    options: Mapping[str, str]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        query_id = query_id_from_checkpoint(self.checkpoint_location)
        if query_id is None:
            raise DeltaOptionError(
                f"cannot read the streaming query's id from {self.checkpoint_location}/metadata; the checkpoint "
                "must be on a path this process can read",
                table=self.path,
            )
        _write(
            batch,
            self.path,
            mode="append",
            options={**self.options, "txnAppId": query_id, "txnVersion": str(batch_id)},
            commit_info=lambda files: streaming_commit_info(query_id, batch_id, complete=False, files=files),
        )


def append_micro_batches(
    path: str, *, checkpoint_location: str, options: Mapping[str, object] | None = None
) -> MicroBatchAppender:
    """A ``foreachBatch`` function appending a stream to the Delta table at ``path`` through :func:`write_delta`.

    Args:
        path: the table's location.
        checkpoint_location: the query's ``checkpointLocation`` (its id makes the batches idempotent).
        options: writer options for every batch (``userMetadata``, ``commitInfo.*``, ``mergeSchema``).

    Example:
        >>> query = (events.writeStream.option("checkpointLocation", "lake/_checkpoints/orders")
        ...          .foreachBatch(append_micro_batches("lake/bronze/orders",
        ...                                             checkpoint_location="lake/_checkpoints/orders"))
        ...          .trigger(availableNow=True).start())
    """
    if any(key.lower() in ("txnappid", "txnversion") for key in (options or {})):
        raise DeltaOptionError("txnAppId/txnVersion are set per batch (query id, batch id); leave them out", table=path)
    return MicroBatchAppender(path, checkpoint_location, {k: str(v) for k, v in (options or {}).items()})


def _with_partitioning(plan: WritePlan, partition_by: Sequence[str] | None) -> WritePlan:
    if not partition_by:
        return plan
    wanted = list(partition_by)
    if plan.table_exists:
        if wanted != plan.partition_columns:
            raise SchemaMismatchError(
                f"the table is partitioned by {plan.partition_columns}, not {wanted}; drop partition_by, "
                "or recreate the table to change its partitioning",
                table=plan.location,
            )
        return plan
    names = plan.table_schema.fieldNames()
    missing = [c for c in wanted if c not in names]
    if missing:
        raise SchemaMismatchError(f"partition_by names {missing}, which the data lacks", table=plan.location)
    return replace(plan, partition_columns=wanted)


def _already_committed(plan: WritePlan) -> bool:
    # Checked before writing any file, so a replayed write costs no Spark job;
    # commit_write checks again at commit time.
    if plan.options.txn_app_id is None or not plan.table_exists:
        return False
    table = open_existing(plan.location)
    return table is not None and already_committed(table, plan.options.txn_app_id, plan.options.txn_version)


def _conformed(df: DataFrame, plan: WritePlan) -> DataFrame:
    """``df`` in the table's column order and types, failing on the first row that breaks a constraint."""
    given = {f.name: f.dataType for f in df.schema.fields}
    if list(given.items()) == [(f.name, f.dataType) for f in plan.table_schema.fields]:
        # Already the table's columns, names, order and types: building the same
        # projection column by column would cost two JVM round trips per column.
        conformed = df
    else:
        by_name = {name.lower(): name for name in given}
        columns: list[Column] = []
        for field in plan.table_schema.fields:
            source = by_name.get(field.name.lower())
            if source is None:  # a column of the table the data lacks (mergeSchema or an older writer)
                columns.append(F.lit(None).cast(field.dataType).alias(field.name))
            elif given[source] != field.dataType:
                columns.append(F.col(_quoted(source)).cast(field.dataType).alias(field.name))
            else:
                columns.append(F.col(_quoted(source)).alias(field.name))
        conformed = df.select(*columns)
    checks = [
        (f"NOT NULL column '{f.name}'", f"{_quoted(f.name)} IS NOT NULL")
        for f in plan.table_schema.fields
        if not f.nullable
    ] + list(plan.checks)
    if not checks:
        return conformed
    row = F.to_json(F.struct(*[F.col(_quoted(n)) for n in conformed.columns]))
    first = conformed.columns[0]
    guarded = F.col(_quoted(first))
    for description, predicate in reversed(checks):
        # A row passes only where the predicate is TRUE (NULL fails), as in format("delta").
        holds = F.coalesce(_spark_predicate(predicate, description, plan.location), F.lit(False))
        violation = F.raise_error(F.concat(F.lit(f"{_VIOLATION} a row violates {description}; row: "), row))
        guarded = F.when(holds, guarded).otherwise(violation.cast(conformed.schema[first].dataType))
    return conformed.select(guarded.alias(first), *[F.col(_quoted(n)) for n in conformed.columns[1:]])


def _spark_predicate(predicate: str, description: str, location: str) -> Column:
    try:
        return F.expr(predicate)
    except PySparkException as exc:
        raise UnsupportedFeatureError(
            f'{description} cannot be parsed by Spark SQL ({exc}); write with format("delta"), which '
            "evaluates it with DataFusion",
            table=location,
        ) from exc


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _write_parquet(conformed: DataFrame, plan: WritePlan, staging: str) -> None:
    timestamp_partitions = [
        c
        for c in plan.partition_columns
        if isinstance(plan.table_schema[c].dataType, (T.TimestampType, T.TimestampNTZType))
    ]
    if timestamp_partitions:
        # Spark names such folders in the session's time zone; Delta stores the value in UTC.
        raise UnsupportedFeatureError(
            f'write_delta cannot write timestamp partition columns {timestamp_partitions}; write with format("delta")',
            table=plan.location,
        )
    if plan.options.target_file_size:
        warnings.warn(
            f"write_delta leaves file sizes to Spark's writer and ignores targetFileSize for {plan.location}; "
            "use maxRecordsPerFile, or repartition the DataFrame",
            stacklevel=3,
        )
    writer = conformed.write.mode("error").option("compression", "snappy")
    if plan.partition_columns:
        writer = writer.partitionBy(*plan.partition_columns)
    if plan.options.max_records_per_file:
        writer = writer.option("maxRecordsPerFile", str(plan.options.max_records_per_file))
    spark = conformed.sparkSession
    # Delta readers (delta-rs, DuckDB) expect INT64 microsecond timestamps with
    # statistics; Spark's default INT96 has neither statistics nor a Delta type.
    previous = spark.conf.get(_TIMESTAMP_CONF, None)
    spark.conf.set(_TIMESTAMP_CONF, "TIMESTAMP_MICROS")
    try:
        writer.parquet(staging)
    except PySparkException as exc:
        message = str(exc)
        if _VIOLATION in message:
            detail = message.split(_VIOLATION, 1)[1].splitlines()[0].split(" SQLSTATE:")[0].strip()
            raise ConstraintViolationError(f"{detail}; nothing was committed", table=plan.location) from None
        raise
    finally:
        if previous is None:
            spark.conf.unset(_TIMESTAMP_CONF)
        else:
            spark.conf.set(_TIMESTAMP_CONF, previous)


def _move_into_table(plan: WritePlan, staging: str) -> list[WrittenFile]:
    """Move the data files Spark wrote to their partition folders in the table; return them as Add actions.

    Every footer is read before the first file moves, so a file that cannot be
    read leaves nothing in the table's folders.
    """
    data_schema = pa.schema([f for f in plan.arrow_schema if f.name not in set(plan.partition_columns)])
    found: list[tuple[list[str], str, pq.FileMetaData]] = []
    for folder, _, names in os.walk(staging):
        relative_folder = os.path.relpath(folder, staging)
        parts = [] if relative_folder == "." else relative_folder.split(os.sep)
        for name in sorted(names):
            if name.startswith((".", "_")) or not name.endswith(".parquet"):
                continue  # _SUCCESS and checksum files
            metadata = pq.read_metadata(os.path.join(folder, name))
            if metadata.num_rows:  # Spark writes a file with no rows for an empty write
                found.append((parts, name, metadata))
    files: list[WrittenFile] = []
    for parts, name, metadata in found:
        values = dict(part.split("=", 1) for part in parts)
        target = os.path.join(plan.location, *parts, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.replace(os.path.join(staging, *parts, name), target)
        stat = os.stat(target)
        files.append(
            WrittenFile(
                path="/".join([*parts, name]),
                size=stat.st_size,
                partition_values={c: unescape_partition_value(values[c]) for c in plan.partition_columns},
                modification_time=int(stat.st_mtime * 1000),
                stats=footer_stats(metadata, data_schema),
                num_records=metadata.num_rows,
            )
        )
    return files
