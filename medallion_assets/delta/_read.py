"""Reading a snapshot's files: the fast route through Spark's native Parquet reader.

delta-rs resolves the snapshot on the driver (version, schema, live files and
their partition values); Spark's own Parquet reader then scans exactly those
files, with column pruning, vectorized decoding and filter pushdown, which a
Python data source cannot offer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from urllib.parse import unquote

import deltalake
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.datasource import InputPartition

from medallion_assets.delta._schema import conform_table
from medallion_assets.delta._snapshot import DataFile, Snapshot, resolve_snapshot
from medallion_assets.delta.errors import DeltaError, DeltaOptionError

# Spark plans one scan over many files cheaply, but one union branch per
# partition gets slow; past this many distinct partitions we refuse the union.
_MAX_UNION_PARTITIONS = 2000


def read_data_file(
    data_file: DataFile,
    arrow_schema: pa.Schema,
    partition_columns: list[str],
    *,
    table: str,
    row_groups: list[int] | None = None,
) -> pa.Table:
    """One data file as Arrow with the table's schema, partition columns filled in."""
    batches = iter_data_file_batches(data_file, arrow_schema, partition_columns, table=table, row_groups=row_groups)
    return pa.Table.from_batches(list(batches), schema=arrow_schema)


def iter_data_file_batches(
    data_file: DataFile,
    arrow_schema: pa.Schema,
    partition_columns: list[str],
    *,
    table: str,
    row_groups: list[int] | None = None,
    batch_rows: int = 65_536,
):
    """A data file as Arrow batches of the table's schema, partition columns filled in.

    Batch by batch, so that decoding overlaps with whoever consumes the batches.
    """
    parquet = pq.ParquetFile(data_file.path)
    stored = set(parquet.schema_arrow.names)
    wanted = [f.name for f in arrow_schema if f.name not in partition_columns and f.name in stored]
    constants = {
        name: partition_scalar(data_file.partition_values.get(name), arrow_schema.field(name).type, table=table)
        for name in partition_columns
    }
    for batch in parquet.iter_batches(batch_size=batch_rows, row_groups=row_groups, columns=wanted, use_threads=False):
        for name, value in constants.items():
            batch = batch.append_column(name, pa.repeat(value, batch.num_rows))
        yield conform_table(batch, arrow_schema, table=table)


def partition_scalar(raw: str | None, type_: pa.DataType, *, table: str) -> pa.Scalar:
    """A partition value as the log stores it (text), as a value of its column's type.

    pyarrow's cast parses the text. The log writes timestamps without a zone,
    meaning UTC, which a cast to a zoned type wants said explicitly.
    """
    text = pa.array([raw], pa.string())
    try:
        if pa.types.is_timestamp(type_) and type_.tz is not None:
            try:
                return text.cast(type_)[0]
            except pa.ArrowInvalid:
                return text.cast(pa.timestamp(type_.unit)).cast(type_)[0]
        return text.cast(type_)[0]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DeltaError(f"partition value {raw!r} is not a valid {type_} ({exc})", table=table) from exc


def _folder_matches(data_file: DataFile, partition_columns: list[str]) -> bool:
    """Whether the file's folders spell its partition values as Spark parses them."""
    folders = data_file.path.replace("\\", "/").split("/")[-1 - len(partition_columns) : -1]
    if len(folders) != len(partition_columns):
        return False
    for folder, name in zip(folders, partition_columns, strict=False):
        key, _, raw = folder.partition("=")
        if key != name:
            return False
        value = data_file.partition_values.get(name)
        decoded = None if raw == "__HIVE_DEFAULT_PARTITION__" else unquote(raw)
        if decoded != value:
            return False
    return True


def snapshot_dataframe(spark: SparkSession, snapshot: Snapshot, *, columns: list[str] | None = None) -> DataFrame:
    """The snapshot as a DataFrame read by Spark's native Parquet reader."""
    schema = snapshot.schema
    if columns is not None:
        unknown = [c for c in columns if c not in schema.fieldNames()]
        if unknown:
            raise DeltaOptionError(
                f"columns {unknown} are not in the table (columns: {', '.join(schema.fieldNames())})",
                table=snapshot.location,
            )
    if not snapshot.files:
        frame = spark.createDataFrame([], schema)
        return frame.select(*columns) if columns is not None else frame
    paths = [f.path for f in snapshot.files]
    parts = snapshot.partition_columns
    reader = spark.read.format("parquet")
    if not parts:
        frame = reader.schema(snapshot.data_schema).load(paths)
    elif all(_folder_matches(f, parts) for f in snapshot.files):
        # Partition values come back from the Hive-style folder names, typed by the schema.
        frame = (
            reader.schema(T.StructType([*snapshot.data_schema.fields, *[schema[c] for c in parts]]))
            .option("basePath", snapshot.location)
            .load(paths)
        )
    else:
        frame = _union_by_partition(spark, snapshot)
    ordered = columns if columns is not None else schema.fieldNames()
    return frame.select(*[F.col(f"`{c}`") for c in ordered])


def _union_by_partition(spark: SparkSession, snapshot: Snapshot) -> DataFrame:
    groups: dict[tuple, list[str]] = {}
    for f in snapshot.files:
        groups.setdefault(tuple(f.partition_values.get(c) for c in snapshot.partition_columns), []).append(f.path)
    if len(groups) > _MAX_UNION_PARTITIONS:
        raise DeltaOptionError(
            f"the table's {len(groups)} partitions are not laid out in Hive-style folders; "
            "read it with spark.read.format('delta') instead",
            table=snapshot.location,
        )
    frames = []
    for values, paths in groups.items():
        frame = spark.read.schema(snapshot.data_schema).parquet(*paths)
        for name, raw in zip(snapshot.partition_columns, values, strict=False):
            frame = frame.withColumn(name, F.lit(raw).cast(snapshot.schema[name].dataType))
        frames.append(frame)
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return result


def read_delta(
    spark: SparkSession,
    path: str,
    *,
    version: int | None = None,
    timestamp: str | datetime | None = None,
    columns: list[str] | None = None,
    storage_options: dict[str, str] | None = None,
) -> DataFrame:
    """Read a Delta table through Spark's native Parquet reader (the fast route).

    delta-rs resolves the snapshot on the driver; Spark scans its files with
    column pruning and filter pushdown. Tables needing deletion vectors or
    column mapping are refused with :class:`UnsupportedFeatureError`.

    Args:
        spark: the session to read with.
        path: the table's location.
        version: read this version (time travel).
        timestamp: read the version current at this time (ISO 8601).
        columns: read only these columns.
        storage_options: object-store options for delta-rs.

    Returns:
        A DataFrame with the table's columns in table order.

    Example:
        >>> df = read_delta(spark, "lakehouse/silver/orders", version=3, columns=["o_orderkey"])
    """
    snapshot = resolve_snapshot(path, version=version, timestamp=timestamp, storage_options=storage_options)
    return snapshot_dataframe(spark, snapshot, columns=columns)


def read_added_rows(
    spark: SparkSession,
    path: str,
    *,
    after_version: int,
    to_version: int,
    storage_options: dict[str, str] | None = None,
) -> DataFrame | None:
    """The rows commits ``after_version + 1 .. to_version`` added, read by Spark's Parquet reader.

    For a table that only grows (bronze), the rows added in a range of
    versions are the rows of the files live at ``to_version`` that were not
    live at ``after_version``. delta-rs lists both snapshots and the commits'
    operations; Spark reads the new files, so the rows never pass through the
    driver (a change data feed read builds them there). OPTIMIZE inside the
    range is fine as long as it compacted only new files.

    Args:
        spark: the session to read with.
        path: the table's location.
        after_version: the last version already consumed (-1: none).
        to_version: the last version to include.
        storage_options: object-store options for delta-rs.

    Returns:
        The added rows in table column order, or ``None`` when a commit in
        the range did more than append or compact (it removed a file live at
        ``after_version``, or is an operation such as MERGE or DELETE): then
        only the change data feed tells inserts from rewrites.

    Example:
        >>> new_rows = read_added_rows(spark, "lakehouse/bronze/orders_raw", after_version=4, to_version=7)
    """
    if to_version <= after_version:
        return None
    commits = _commits_after(path, after_version, storage_options)
    if commits is None:
        return None
    commits = [c for c in commits if c["version"] <= to_version]
    if len(commits) != to_version - after_version or not all(_only_adds_or_compacts(c) for c in commits):
        return None
    target = resolve_snapshot(path, version=to_version, storage_options=storage_options)
    before = (
        resolve_snapshot(path, version=after_version, storage_options=storage_options).files
        if after_version >= 0
        else []
    )
    added, removed = files_added_and_removed(before, target.files)
    if removed:
        return None
    return snapshot_dataframe(spark, replace(target, files=added))


def _commits_after(
    path: str, after_version: int, storage_options: dict[str, str] | None, attempts: int = 3
) -> list[dict] | None:
    """The ``history()`` entries of the commits after ``after_version``; None if commits kept landing.

    delta-rs 1.6 labels ``history()`` entries counting down from the version
    the table was loaded at, but lists the newest commit files in storage: a
    commit landing between the load and the listing shifts every label by one.
    The labels are right when the table's newest version is the same after the
    listing as at the load (versions only grow), so the listing is retried
    until it is.
    """
    table = deltalake.DeltaTable(path, storage_options=storage_options)
    for _ in range(attempts):
        loaded = table.version()
        commits = [c for c in table.history(loaded - after_version) if c["version"] > after_version]
        table.update_incremental()
        if table.version() == loaded:
            return commits
    return None


def files_added_and_removed(
    before: Iterable[DataFile], after: Iterable[DataFile]
) -> tuple[list[DataFile], list[DataFile]]:
    """What changed between two snapshots' files: the files live only ``after``, those live only ``before``.

    Files are told apart by path (a Delta table never reuses a data file's
    path for other rows). Both lists keep their snapshot's order.
    """
    before, after = list(before), list(after)
    before_paths, after_paths = {f.path for f in before}, {f.path for f in after}
    return [f for f in after if f.path not in before_paths], [f for f in before if f.path not in after_paths]


def is_compaction(commit: dict) -> bool:
    """Whether a commit (a ``history()`` entry) only rewrote files without changing rows (OPTIMIZE)."""
    return commit.get("operation") == "OPTIMIZE"


def _only_adds_or_compacts(commit: dict) -> bool:
    """Whether a commit (a ``history()`` entry) adds rows without removing any, or only compacts files."""
    operation = commit.get("operation")
    parameters = commit.get("operationParameters") or {}
    if operation == "CREATE TABLE" or is_compaction(commit):
        return True
    if operation == "WRITE":
        return str(parameters.get("mode", "")).lower() == "append"
    if operation == "STREAMING UPDATE":
        return str(parameters.get("outputMode", "")).lower() == "append"
    return False


# ---------------------------------------------------------------- input partitions (batch and stream reads)

# Arrow batches handed to Spark; large enough to amortize the hand-over.
BATCH_ROWS = 65_536


@dataclass(frozen=True)
class FileSlice:
    """A file, or some of its row groups, read by one task."""

    file: DataFile
    row_groups: tuple[int, ...] | None = None


class DeltaInputPartition(InputPartition):
    def __init__(self, slices: list[FileSlice]) -> None:
        super().__init__(len(slices))
        self.slices = slices


# Spark's file sources do not make a split smaller than this (spark.sql.files.openCostInBytes).
_MIN_SPLIT_BYTES = 4 * 1024 * 1024


def split_budget(files: Sequence[DataFile], max_bytes: int, parallelism: int | None = None) -> int:
    """Bytes per input partition: at most ``max_bytes``, but small enough to use every core.

    Spark's own file sources size splits the same way, from the session's default
    parallelism. A Python reader cannot see the session, so the cores of the
    planning process stand in for it (the same number on an embedded session).
    """
    total = sum(f.size for f in files)
    cores = parallelism or max(2, os.cpu_count() or 2)
    return max(1, min(max_bytes, max(_MIN_SPLIT_BYTES, total // cores + 1)))


def plan_input_partitions(files: Sequence[DataFile], max_bytes: int) -> list[DeltaInputPartition]:
    """Pack files into partitions of about ``max_bytes``, splitting big files by row group."""
    slices: list[tuple[int, FileSlice]] = []
    for f in files:
        if f.size <= max_bytes:
            slices.append((f.size, FileSlice(f)))
            continue
        meta = pq.ParquetFile(f.path).metadata
        group: list[int] = []
        group_bytes = 0
        for i in range(meta.num_row_groups):
            size = meta.row_group(i).total_byte_size
            if group and group_bytes + size > max_bytes:
                slices.append((group_bytes, FileSlice(f, tuple(group))))
                group, group_bytes = [], 0
            group.append(i)
            group_bytes += size
        if group:
            slices.append((group_bytes, FileSlice(f, tuple(group))))
    # First-fit decreasing keeps partitions even without reordering rows within a file.
    slices.sort(key=lambda item: -item[0])
    bins: list[tuple[int, list[FileSlice]]] = []
    for size, piece in slices:
        for i, (used, members) in enumerate(bins):
            if used + size <= max_bytes:
                members.append(piece)
                bins[i] = (used + size, members)
                break
        else:
            bins.append((size, [piece]))
    return [DeltaInputPartition(members) for _, members in bins]


def read_slices(
    partition: DeltaInputPartition, arrow_schema: pa.Schema, partition_columns: list[str], *, table: str
) -> Iterator[pa.RecordBatch]:
    """The rows of one input partition: each slice's row groups (or whole file), once."""
    for piece in partition.slices:
        yield from iter_data_file_batches(
            piece.file,
            arrow_schema,
            partition_columns,
            table=table,
            row_groups=list(piece.row_groups) if piece.row_groups is not None else None,
            batch_rows=BATCH_ROWS,
        )
