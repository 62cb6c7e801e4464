"""Writing a task's rows as Parquet data files of a Delta table.

Runs inside Spark's Python workers. Each task buffers the Arrow batches Spark
hands it into large row groups (Spark's 10k-row batches as row groups make
bigger files and slower reads), splits rows by partition values into Hive-style
folders, and returns one :class:`WrittenFile` per file, with the statistics the
Delta log keeps (numRecords, minValues, maxValues, nullCount). Nothing here
touches the log: the driver commits the files in one transaction.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medallion_assets.delta._engine import holds
from medallion_assets.delta._schema import conform_table
from medallion_assets.delta.errors import ConstraintViolationError

# Delta readers truncate string statistics to a prefix; longer values lose
# their max (a truncated max would be wrong) but keep a truncated min.
STRING_STATS_PREFIX = 32
DEFAULT_ROW_GROUP_ROWS = 1_000_000
DEFAULT_ROW_GROUP_BYTES = 128 * 1024 * 1024
DEFAULT_FILE_BYTES = 512 * 1024 * 1024

# Characters Spark and Hive escape in partition folder names.
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^") | {chr(c) for c in range(0x20)}
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def escape_partition_value(value: str) -> str:
    """Escape a partition value for a folder name, as Spark and Hive do."""
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPED else ch for ch in value)


def serialize_partition_value(value: Any) -> str | None:
    """The string the Delta log stores for a partition value."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(dt.UTC).replace(tzinfo=None)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        raise ValueError("binary partition columns are not supported")
    return str(value)


@dataclass(frozen=True)
class WrittenFile:
    """A data file a task wrote, ready to become an Add action."""

    path: str
    """Path relative to the table root, as on disk (delta-rs URI-encodes it in the log)."""
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    stats: str
    num_records: int


# ---------------------------------------------------------------- statistics


def _json_value(value: Any) -> Any:
    """A statistic as JSON; None when the value cannot be a statistic."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    return value


def _format_stat(value: Any, type_: pa.DataType, *, is_max: bool) -> Any:
    if value is None:
        return None
    if pa.types.is_timestamp(type_):
        # The log keeps milliseconds; round the bounds outwards so they stay bounds.
        micros = value.microsecond % 1000
        if micros:
            value = value - dt.timedelta(microseconds=micros)
            if is_max:
                value = value + dt.timedelta(milliseconds=1)
        if type_.tz is not None:
            return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}"
    if pa.types.is_date(type_):
        return value.isoformat()
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        if len(value) > STRING_STATS_PREFIX:
            return None if is_max else value[:STRING_STATS_PREFIX]
        return value
    return _json_value(value)


def _has_min_max(type_: pa.DataType) -> bool:
    return (
        pa.types.is_integer(type_)
        or pa.types.is_floating(type_)
        or pa.types.is_decimal(type_)
        or pa.types.is_date(type_)
        or pa.types.is_timestamp(type_)
        or pa.types.is_string(type_)
        or pa.types.is_large_string(type_)
    )


@dataclass
class _ColumnStats:
    nulls: int | None = 0  # None: a file without a null count
    lo: Any = None
    hi: Any = None
    usable: bool = True

    def update(self, column: pa.ChunkedArray | pa.Array) -> None:
        self.nulls += column.null_count
        if not self.usable or not _has_min_max(column.type):
            self.usable = False
            return
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            self.usable = False  # NaN has no place in a min/max range
            return
        if column.null_count == len(column):
            return
        mm = pc.min_max(column)
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        self.lo = lo if self.lo is None or lo < self.lo else self.lo
        self.hi = hi if self.hi is None or hi > self.hi else self.hi


def _encode(value: Any) -> str:
    # json.dumps cannot write a Decimal as a number without losing digits.
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{_encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Decimal):
        return format(value, "f")
    return json.dumps(value)


@dataclass
class _FileStats:
    schema: pa.Schema
    rows: int = 0
    columns: dict[str, Any] = field(default_factory=dict)

    def update(self, data: pa.Table) -> None:
        self.rows += data.num_rows
        for name in data.column_names:
            self._update(self.columns, name, data.column(name))

    def _update(self, into: dict, name: str, column) -> None:
        if pa.types.is_struct(column.type):
            nested = into.setdefault(name, {})
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            for i, child in enumerate(column.type):
                self._update(nested, child.name, pa.chunked_array([c.field(i) for c in chunks], type=child.type))
            return
        into.setdefault(name, _ColumnStats()).update(column)

    def to_json(self) -> str:
        def collect(node: dict, types: dict[str, pa.DataType], attr: str):
            out = {}
            for name, value in node.items():
                t = types[name]
                if isinstance(value, dict):
                    child_types = {c.name: c.type for c in t}
                    sub = collect(value, child_types, attr)
                    if sub:
                        out[name] = sub
                elif attr == "nulls":
                    out[name] = value.nulls
                elif value.usable:
                    stat = _format_stat(value.lo if attr == "lo" else value.hi, t, is_max=attr == "hi")
                    if stat is not None:
                        out[name] = stat
            return out

        types = {f.name: f.type for f in self.schema}
        return _encode(
            {
                "numRecords": self.rows,
                "minValues": collect(self.columns, types, "lo"),
                "maxValues": collect(self.columns, types, "hi"),
                "nullCount": collect(self.columns, types, "nulls"),
            }
        )


# ---------------------------------------------------------------- the writer


@dataclass
class _OpenFile:
    relative_path: str
    full_path: str
    writer: pq.ParquetWriter
    stats: _FileStats
    partition_values: dict[str, str | None]
    buffered: list[pa.RecordBatch] = field(default_factory=list)
    buffered_rows: int = 0
    buffered_bytes: int = 0
    written_bytes: int = 0


class TableFileWriter:
    """Writes Arrow data as Parquet files of one Delta table and returns their Add actions.

    Args:
        location: the table's root folder (local path).
        schema: the table's Arrow schema, partition columns included.
        partition_columns: partition columns, in the table's order.
        task_id: a number for file names, so files of one job sort by task.
        checks: constraints every row must satisfy: ``(description, SQL predicate)``,
            evaluated by DataFusion (a row passes only where the predicate is TRUE).
        row_group_rows: rows to buffer before writing a row group.
        file_bytes: roll to a new file once a file holds about this many bytes.
    """

    def __init__(
        self,
        location: str,
        schema: pa.Schema,
        partition_columns: list[str],
        *,
        task_id: int = 0,
        checks: list[tuple[str, str]] | None = None,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        file_bytes: int = DEFAULT_FILE_BYTES,
        table_name: str | None = None,
    ) -> None:
        self.location = location
        self.schema = schema
        self.partition_columns = list(partition_columns)
        self.data_schema = pa.schema([f for f in schema if f.name not in set(partition_columns)])
        self.task_id = task_id
        self.checks = checks or []
        self.row_group_rows = row_group_rows
        self.row_group_bytes = row_group_bytes
        self.file_bytes = file_bytes
        self.table_name = table_name or location
        self.not_null = [f.name for f in schema if not f.nullable]
        self._open: dict[tuple, _OpenFile] = {}
        self._done: list[WrittenFile] = []
        self._all_paths: list[str] = []

    # -- public

    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> list[WrittenFile]:
        """Write every batch, close the files and return them; on error remove them."""
        try:
            for batch in batches:
                self.write(batch)
            return self.close()
        except BaseException:
            self.discard()
            raise

    def write(self, batch: pa.RecordBatch | pa.Table) -> None:
        if batch.num_rows == 0:
            return
        data = conform_table(batch, self.schema, table=self.table_name)
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        self._check(data)
        if not self.partition_columns:
            self._append((), {}, data)
            return
        keys = data.select(self.partition_columns)
        groups = keys.group_by(self.partition_columns, use_threads=False).aggregate([])
        for key_row in groups.to_pylist():
            mask = None
            for name in self.partition_columns:
                value = key_row[name]
                test = (
                    pc.is_null(data.column(name))
                    if value is None
                    else pc.equal(data.column(name), pa.scalar(value, data.schema.field(name).type))
                )
                mask = test if mask is None else pc.and_(mask, test)
            part = data.filter(pc.fill_null(mask, False))
            values = {name: serialize_partition_value(key_row[name]) for name in self.partition_columns}
            self._append(tuple(values.values()), values, part)

    def close(self) -> list[WrittenFile]:
        for key in list(self._open):
            self._finish(key)
        return list(self._done)

    def discard(self) -> None:
        """Close and delete every file this writer created (a failed task)."""
        for handle in self._open.values():
            try:
                handle.writer.close()
            except Exception:
                pass
        self._open.clear()
        for path in self._all_paths:
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
        self._done.clear()

    # -- internals

    def _check(self, data: pa.Table) -> None:
        for name in self.not_null:
            if data.column(name).null_count:
                raise ConstraintViolationError(
                    f"column '{name}' is NOT NULL but {data.column(name).null_count} row(s) have null; "
                    "fill or drop them before writing",
                    table=self.table_name,
                )
        for description, predicate in self.checks:
            mask = holds(predicate, data)
            failing = data.num_rows - mask.true_count
            if failing:
                first = data.filter(pc.invert(mask)).slice(0, 1).to_pylist()[0]
                raise ConstraintViolationError(
                    f"{failing} row(s) violate {description}; first violating row: {first}",
                    table=self.table_name,
                )

    def _new_file(self, values: dict[str, str | None]) -> _OpenFile:
        folders = [f"{name}={NULL_PARTITION if v is None else escape_partition_value(v)}" for name, v in values.items()]
        name = f"part-{self.task_id:05d}-{uuid.uuid4()}-c000.snappy.parquet"
        relative = "/".join([*folders, name])
        full = os.path.join(self.location, *folders, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        self._all_paths.append(full)
        writer = pq.ParquetWriter(
            full,
            self.data_schema,
            compression="snappy",
            coerce_timestamps="us",
            allow_truncated_timestamps=False,
            use_dictionary=True,
            write_statistics=True,
            # As Spark writes them: decimals of up to 18 digits as INT32/INT64,
            # which Spark's vectorized reader decodes much faster than fixed bytes.
            store_decimal_as_integer=True,
        )
        return _OpenFile(relative, full, writer, _FileStats(self.data_schema), values)

    def _append(self, key: tuple, values: dict[str, str | None], data: pa.Table) -> None:
        handle = self._open.get(key)
        if handle is None:
            handle = self._open[key] = self._new_file(values)
        data = data.select(self.data_schema.names)
        handle.buffered.extend(data.to_batches())
        handle.buffered_rows += data.num_rows
        handle.buffered_bytes += data.nbytes
        if handle.buffered_rows >= self.row_group_rows or handle.buffered_bytes >= self.row_group_bytes:
            self._flush(handle)
            if handle.written_bytes >= self.file_bytes:
                self._finish(key)

    def _flush(self, handle: _OpenFile) -> None:
        if not handle.buffered:
            return
        table = pa.Table.from_batches(handle.buffered, schema=self.data_schema)
        handle.writer.write_table(table, row_group_size=max(table.num_rows, 1))
        handle.stats.update(table)
        handle.written_bytes += table.nbytes
        handle.buffered, handle.buffered_rows, handle.buffered_bytes = [], 0, 0

    def _finish(self, key: tuple) -> None:
        handle = self._open.pop(key)
        self._flush(handle)
        handle.writer.close()
        self._done.append(
            WrittenFile(
                path=handle.relative_path,
                size=os.path.getsize(handle.full_path),
                partition_values=handle.partition_values,
                modification_time=int(time.time() * 1000),
                stats=handle.stats.to_json(),
                num_records=handle.stats.rows,
            )
        )


def write_table_files(data: pa.Table, writer: TableFileWriter) -> list[WrittenFile]:
    """Write a whole Arrow table with ``writer`` (driver-side rewrites, tests)."""
    return writer.write_batches(data.to_batches(max_chunksize=DEFAULT_ROW_GROUP_ROWS))


# ---------------------------------------------------------------- files written by Spark


def _stat_leaves(schema: pa.Schema) -> dict[str, tuple[tuple[str, ...], pa.DataType]]:
    """Leaf columns that carry Delta statistics, by their Parquet path: top-level and struct fields."""
    leaves: dict[str, tuple[tuple[str, ...], pa.DataType]] = {}

    def walk(path: tuple[str, ...], type_: pa.DataType) -> None:
        if pa.types.is_struct(type_):
            for child in type_:
                walk((*path, child.name), child.type)
        elif not (pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_map(type_)):
            leaves[".".join(path)] = (path, type_)

    for f in schema:
        walk((f.name,), f.type)
    return leaves


def footer_stats(metadata: pq.FileMetaData, schema: pa.Schema) -> str:
    """The Delta statistics of a Parquet file, from the row-group statistics in its footer.

    A column gets a min and max only when every row group that holds a value has
    them (Parquet writers leave them out e.g. for INT96), and a null count only
    when every row group has statistics.

    Args:
        metadata: the file's footer (``pyarrow.parquet.read_metadata``).
        schema: the file's columns as the table types them (partition columns excluded).
    """
    leaves = _stat_leaves(schema)
    merged: dict[str, _ColumnStats] = {}
    for rg_index in range(metadata.num_row_groups):
        row_group = metadata.row_group(rg_index)
        for col_index in range(row_group.num_columns):
            chunk = row_group.column(col_index)
            if chunk.path_in_schema not in leaves:
                continue
            acc = merged.setdefault(chunk.path_in_schema, _ColumnStats())
            stats = chunk.statistics
            if stats is None or not stats.has_null_count:
                acc.nulls = None
                acc.usable = False
                continue
            if acc.nulls is not None:
                acc.nulls += stats.null_count
            if stats.has_min_max:
                acc.lo = stats.min if acc.lo is None else min(acc.lo, stats.min)
                acc.hi = stats.max if acc.hi is None else max(acc.hi, stats.max)
            elif stats.null_count < row_group.num_rows:
                acc.usable = False  # values without bounds: no bounds for the file
    mins: dict[str, Any] = {}
    maxes: dict[str, Any] = {}
    nulls: dict[str, Any] = {}

    def put(into: dict, path: tuple[str, ...], value: Any) -> None:
        for name in path[:-1]:
            into = into.setdefault(name, {})
        into[path[-1]] = value

    for key, acc in merged.items():
        path, type_ = leaves[key]
        if acc.nulls is not None:
            put(nulls, path, acc.nulls)
        # Writers differ on whether NaN counts in a float's bounds; leave them out.
        if acc.usable and _has_min_max(type_) and not pa.types.is_floating(type_):
            lo = _format_stat(acc.lo, type_, is_max=False)
            hi = _format_stat(acc.hi, type_, is_max=True)
            if lo is not None:
                put(mins, path, lo)
            if hi is not None:
                put(maxes, path, hi)
    return _encode({"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxes, "nullCount": nulls})


def unescape_partition_value(text: str) -> str | None:
    """The partition value a Hive-style folder name stands for (None for the null folder)."""
    return None if text == NULL_PARTITION else unquote(text)
