"""Dagster output metadata of a Delta table: from the table client's
:class:`~medallion_assets.storage.client.TableDescription`, or read by deltalake (:func:`arrow_table_metadata`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from dagster import MetadataValue, TableColumn, TableSchema
from pyspark.sql import DataFrame
from pyspark.sql import types as T

from medallion_assets.storage.arrow_client import (
    DELTA_RS_CANNOT_READ,
    ArrowDeltaClient,
    files_size,
    rows_by_statistics,
)
from medallion_assets.storage.client import DeltaTableClient, TableDescription
from medallion_assets.storage.engines import CommitFacts

log = logging.getLogger(__name__)

_PREVIEW_ROWS = 5
#: A table of at most this many rows (known from its Delta log) previews its first rows by key, a
#: top-k over the whole table (cheap at this size, on delta-rs); a larger
#: one previews the rows a limit reads first, in key order, so the preview never scans it.
SORTED_PREVIEW_MAX_ROWS = 10_000
#: Types Spark sorts and Python compares alike (maps, structs, arrays and variants are left out of the order).
_ORDERABLE_TYPES = (T.NumericType, T.StringType, T.BooleanType, T.DateType, T.TimestampType, T.TimestampNTZType)


def table_metadata(
    client: DeltaTableClient,
    path: str,
    *,
    commit: CommitFacts | None = None,
    preview_rows: int = _PREVIEW_ROWS,
    column_descriptions: Mapping[str, str] | None = None,
    key_columns: Sequence[str] = (),
    newest_first: bool = False,
    earlier: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Dagster metadata describing the table's current version (:meth:`DeltaTableClient.describe`).

    Args:
        client: reads the table.
        path: the table's location.
        commit: the newest commit when the caller has just read it (a write's result).
        preview_rows: rows of the Markdown preview.
        column_descriptions: column name -> description, for ``dagster/column_schema``.
        key_columns: the columns the preview is sorted by (see :func:`preview_order`).
        newest_first: preview the newest rows (a table only appended to; :func:`arrow_markdown_preview`).
        earlier: the metadata of the asset's latest materialization. When it
            described this same version, with this engine and these column
            descriptions, its description is returned as it was: a run with
            nothing new reads no table for its metadata.

    Raises:
        ValueError: a description names a column the table does not have.
    """
    commit = commit or client.engine.latest_commit(client.spark, path)
    reused = _same_description(
        earlier,
        version=commit.version,
        engine=client.engine.name,
        column_descriptions=column_descriptions or {},
        preview_rows=preview_rows,
    )
    if reused is not None:
        return reused
    return description_metadata(
        client.describe(path, commit=commit),
        preview_rows=preview_rows,
        column_descriptions=column_descriptions,
        key_columns=key_columns,
        newest_first=newest_first,
    )


def description_metadata(
    description: TableDescription,
    *,
    preview_rows: int = _PREVIEW_ROWS,
    column_descriptions: Mapping[str, str] | None = None,
    key_columns: Sequence[str] = (),
    newest_first: bool = False,
) -> dict[str, Any]:
    """Output metadata of a described version.

    The engine, the schema as ``dagster/column_schema`` (with
    ``column_descriptions``), rows, the location, version, operation and its
    metrics, files, bytes, partition columns and a preview of ``preview_rows``
    rows sorted by ``key_columns``, else by the partition columns, else by the
    first column (:func:`preview_order`); with ``newest_first``, rows of the
    newest file, where delta-rs reads the table (:func:`arrow_markdown_preview`).

    Raises:
        ValueError: a description names a column the table does not have.
    """
    frame = description.frame
    # Counts as numbers: delta-spark (and the delta-rs engine's writes) record them as strings.
    metrics = {
        name: int(value) if isinstance(value, str) and value.isdigit() else value
        for name, value in description.operation_metrics.items()
    }
    descriptions = column_descriptions or {}
    check_column_descriptions(descriptions, frame.columns, table=f"Delta table {description.path}")
    preview_key = list(key_columns) or description.partition_columns
    return {
        "delta/engine": description.engine,
        "dagster/column_schema": spark_table_schema(frame, descriptions),
        "dagster/row_count": description.rows,
        "dagster/uri": MetadataValue.path(description.path),
        "delta/version": version_metadata(description.version),
        "delta/operation": description.operation,
        "delta/operation_metrics": MetadataValue.json(json.loads(json.dumps(metrics, default=str))),
        "delta/num_files": description.num_files,
        "delta/size_bytes": description.size_bytes,
        "delta/partition_columns": MetadataValue.json(description.partition_columns),
        "preview": MetadataValue.md(
            _preview_from_files(description, preview_rows, key_columns=preview_key, newest_first=newest_first)
            or markdown_preview(frame, preview_rows, key_columns=preview_key, total_rows=description.rows)
        ),
    }


def _preview_from_files(
    description: TableDescription, rows: int, *, key_columns: Sequence[str], newest_first: bool = False
) -> str | None:
    """The preview of the described version read by delta-rs, or None where delta-rs cannot open the table.

    delta-rs reads a few rows of one file in milliseconds; Spark's first read of a
    new version costs delta-spark a snapshot of it on every write of every run
    (docs/decisions/0010-writes-computed-once.md). Where
    delta-rs cannot open the location (a Hadoop-only scheme, a lake only the Spark
    server sees) or a table feature it does not read, Spark previews it. Column
    mapping is one: delta-rs opens such a table, but its Arrow dataset reads the
    files' physical column names as missing columns, all null.
    """
    try:
        client = ArrowDeltaClient()
        table = client.readable_table(description.path, version=description.version)
        dataset = client.pruned_dataset(table, description.path)
        newest_of = pa.table(table.get_add_actions(flatten=True)) if newest_first else None
        return arrow_markdown_preview(
            dataset, rows, key_columns=key_columns, total_rows=description.rows, newest_of=newest_of
        )
    except DELTA_RS_CANNOT_READ as error:
        log.debug("delta-rs cannot preview %s (%s); Spark reads it", description.path, error)
        return None


def arrow_markdown_preview(
    dataset: ds.Dataset,
    rows: int = _PREVIEW_ROWS,
    *,
    key_columns: Sequence[str] = (),
    total_rows: int,
    newest_of: pa.Table | None = None,
) -> str:
    """A few rows of an Arrow dataset as Markdown, picked and ordered as :func:`markdown_preview` does.

    Nulls sort first, as Spark sorts ascending, so both routes show the same rows.
    With ``newest_of`` (the table's add actions), the rows are the first of the
    newest file instead (:func:`newest_files_first`): a table only appended to
    shows what its last write added, not its oldest rows.
    """
    sortable = [
        f.name
        for f in dataset.schema
        if not (pa.types.is_nested(f.type) or pa.types.is_map(f.type) or pa.types.is_binary(f.type))
    ]
    key = [name for name in key_columns if name in sortable] or sortable[:1]
    order = key + [name for name in sortable if name not in key]
    whole = total_rows <= SORTED_PREVIEW_MAX_ROWS and newest_of is None
    if newest_of is not None:
        picked = first_rows(newest_files_first(dataset, newest_of), rows)
    else:
        picked = dataset.to_table() if whole else first_rows(dataset, rows)
    if order:
        picked = picked.sort_by([(name, "ascending", "at_start") for name in order])
    picked = picked.slice(0, rows)
    columns = picked.column_names
    values = [[row[c] for c in columns] for row in picked.to_pylist()]
    return preview_markdown(
        columns, values, key=key, whole_order=whole, total_rows=total_rows, newest=newest_of is not None
    )


def newest_files_first(dataset: ds.FileSystemDataset, actions: pa.Table) -> ds.FileSystemDataset:
    """``dataset`` with its files in the order of their add actions' ``modification_time``, newest first.

    A Delta table's files carry no row order, but each add action records when
    its file was written: an append's newest file holds rows of the last write
    that added any (after an OPTIMIZE, the compacted file, which holds old rows too).

    Args:
        dataset: the table's version as delta-rs opens it (one fragment per file).
        actions: that version's add actions (``get_add_actions(flatten=True)``: ``path``, ``modification_time``).
    """
    written = {
        unquote(path): when
        for path, when in zip(
            actions.column("path").to_pylist(), actions.column("modification_time").to_pylist(), strict=False
        )
    }

    def when(fragment: ds.Fragment) -> Any:
        path = unquote(fragment.path)
        found = written.get(path)
        if found is None:  # a file system that names files from its root: the action's path is their end
            found = next((t for p, t in written.items() if path.endswith("/" + p)), None)
        return (found is not None, found or 0)

    fragments = sorted(dataset.get_fragments(), key=when, reverse=True)
    return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem)


def first_rows(dataset: ds.FileSystemDataset, rows: int) -> pa.Table:
    """The first ``rows`` rows of the dataset's first non-empty file, with the dataset's schema.

    Read through ``pyarrow.parquet.ParquetFile`` with a buffered stream and no
    pre-buffering, it holds about one page per column. A dataset scan holds the
    whole first row group instead, even for a ``head`` of five rows without read-ahead
    (up to 128 MB a row group compressed; docs/decisions/0010-writes-computed-once.md).
    Where a file does not convert to the dataset's schema, the dataset's own scan reads it.
    """
    schema = dataset.schema
    for fragment in dataset.get_fragments():
        with dataset.filesystem.open_input_file(fragment.path) as source:
            reader = pq.ParquetFile(source, pre_buffer=False, buffer_size=1 << 20)
            if reader.metadata.num_rows == 0:
                continue
            in_file = [name for name in schema.names if name in reader.schema_arrow.names]
            batch = next(reader.iter_batches(batch_size=rows, columns=in_file))
        partition = ds.get_partition_keys(fragment.partition_expression)
        columns = [
            batch.column(name)
            if name in in_file
            else pa.array([partition.get(name)] * batch.num_rows, type=schema.field(name).type)
            for name in schema.names
        ]
        try:
            return pa.Table.from_arrays(columns, names=schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            break
    return dataset.head(rows, batch_size=max(rows, 1024), batch_readahead=0, fragment_readahead=0)


#: What output metadata names as the engine of the writes deltalake makes itself (pandas, polars and
#: Arrow outputs, small Spark overwrites), whatever engine the Spark session runs (the Spark path
#: names the session's: delta-spark or delta-rs).
ENGINE_NAME = "deltalake (no Spark)"

#: What :func:`description_metadata` records: the same for every look at one version of a table.
_DESCRIPTION_KEYS = (
    "delta/engine",
    "dagster/column_schema",
    "dagster/row_count",
    "dagster/uri",
    "delta/version",
    "delta/operation",
    "delta/operation_metrics",
    "delta/num_files",
    "delta/size_bytes",
    "delta/partition_columns",
    "preview",
)


def _same_description(
    earlier: Mapping[str, Any] | None,
    *,
    version: int,
    engine: str,
    column_descriptions: Mapping[str, str],
    preview_rows: int,
) -> dict[str, Any] | None:
    """``earlier``'s description of the table when it described ``version`` as this call would, else None.

    A description deltalake made of the version it wrote (a small overwrite) counts too: the
    version is the same, and describing it again on delta-spark would build its snapshot.
    """
    if earlier is None or preview_rows != _PREVIEW_ROWS or any(key not in earlier for key in _DESCRIPTION_KEYS):
        return None
    if str(getattr(earlier["delta/version"], "value", None)) != str(version) or getattr(
        earlier["delta/engine"], "value", None
    ) not in (engine, ENGINE_NAME):
        return None
    schema = getattr(earlier["dagster/column_schema"], "schema", None)
    described = {c.name: c.description for c in schema.columns if c.description} if schema else None
    if described != dict(column_descriptions):
        return None
    return {key: earlier[key] for key in _DESCRIPTION_KEYS}


def arrow_table_metadata(
    client: ArrowDeltaClient,
    path: str,
    *,
    column_descriptions: Mapping[str, str] | None = None,
    key_columns: Sequence[str] = (),
    newest_first: bool = False,
) -> dict[str, Any]:
    """Output metadata of the table's current version read by deltalake, with the Spark path's keys.

    Rows, files and bytes come from the Delta log's add actions; the preview
    reads at most the first :data:`SORTED_PREVIEW_MAX_ROWS` rows, or with
    ``newest_first`` the rows of the newest file (:func:`arrow_markdown_preview`).

    Raises:
        ValueError: a description names a column the table does not have.
    """
    table = client.open_table(path)
    info, _ = client.newest_commit(path)
    actions = pa.table(table.get_add_actions(flatten=True))
    rows = rows_by_statistics(actions)
    rows = table.count() if rows is None else rows
    schema = pa.schema(table.schema())
    descriptions = dict(column_descriptions or {})
    check_column_descriptions(descriptions, schema.names, table=f"Delta table {path}")
    partitions = list(table.metadata().partition_columns)
    metrics = info.get("operationMetrics") or {}
    return {
        "delta/engine": ENGINE_NAME,
        "dagster/column_schema": arrow_table_schema(schema, descriptions),
        "dagster/row_count": rows,
        "dagster/uri": MetadataValue.path(path),
        "delta/version": version_metadata(table.version()),
        "delta/operation": str(info.get("operation", "")),
        "delta/operation_metrics": MetadataValue.json(json.loads(json.dumps(metrics, default=str))),
        "delta/num_files": actions.num_rows,
        "delta/size_bytes": files_size(actions),
        "delta/partition_columns": MetadataValue.json(partitions),
        "preview": MetadataValue.md(
            arrow_markdown_preview(
                table.to_pyarrow_dataset(),
                key_columns=list(key_columns) or partitions,
                total_rows=rows,
                newest_of=actions if newest_first else None,
            )
        ),
    }


def arrow_table_schema(schema: pa.Schema, column_descriptions: Mapping[str, str] | None = None) -> TableSchema:
    """An Arrow schema as Dagster's table schema (Arrow's type names).

    Args:
        schema: the table's schema.
        column_descriptions: column name -> description; other columns have none.
    """
    descriptions = column_descriptions or {}
    return TableSchema(
        columns=[TableColumn(name=f.name, type=str(f.type), description=descriptions.get(f.name)) for f in schema]
    )


def version_metadata(version: int) -> MetadataValue:
    """A table version as metadata: text, so Dagster does not plot it as a metric; ``int(value)`` reads it back.

    Dagster plots every integer and float entry of a materialization on the asset's
    Plots tab. A Delta version (or the upstream version a step consumed) is an
    identifier that only grows, not a quantity to chart.
    """
    return MetadataValue.text(str(version))


def latest_materialization_metadata(instance: Any, asset_key: Any) -> Mapping[str, Any] | None:
    """The metadata of ``asset_key``'s latest materialization in a Dagster instance (None: never materialized).

    What :func:`table_metadata` takes as ``earlier``.
    """
    entry = instance.get_latest_materialization_event(asset_key)
    materialization = entry.asset_materialization if entry is not None else None
    return materialization.metadata if materialization is not None else None


def spark_table_schema(frame: DataFrame, column_descriptions: Mapping[str, str] | None = None) -> TableSchema:
    """A DataFrame's schema as Dagster's table schema.

    Args:
        frame: the DataFrame.
        column_descriptions: column name -> description; other columns have none.
    """
    descriptions = column_descriptions or {}
    return TableSchema(
        columns=[
            TableColumn(name=f.name, type=f.dataType.simpleString(), description=descriptions.get(f.name))
            for f in frame.schema.fields
        ]
    )


def check_column_descriptions(column_descriptions: Mapping[str, str], columns: Iterable[str], *, table: str) -> None:
    """Refuse descriptions of columns the table does not have (a typo, a renamed or dropped column).

    Args:
        column_descriptions: column name -> description.
        columns: the table's columns.
        table: names the table (or asset) in the error.

    Raises:
        ValueError: naming the unknown columns and the table's columns.
    """
    columns = list(columns)
    unknown = sorted(set(column_descriptions) - set(columns))
    if unknown:
        raise ValueError(
            f"{table}: column descriptions are declared for column(s) {unknown} it does not have "
            f"(its columns: {', '.join(columns)}); rename or remove them in the column_descriptions "
            "given to delta_table(...) (or to table_metadata(...))"
        )


def preview_order(frame: DataFrame, key_columns: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """What a preview of ``frame`` is sorted by: its key, then its other columns to break ties.

    Args:
        frame: the table.
        key_columns: the columns that identify a row (merge keys, partition
            columns); the first column when none is given. Columns the frame
            lacks, or of types that do not sort (maps, structs, arrays), are left out.

    Returns:
        ``(key, order)``: the key the preview names, and every column it is sorted by.
    """
    orderable = [f.name for f in frame.schema.fields if isinstance(f.dataType, _ORDERABLE_TYPES)]
    key = [name for name in key_columns if name in orderable] or orderable[:1]
    return key, key + [name for name in orderable if name not in key]


def markdown_preview(
    frame: DataFrame,
    rows: int = _PREVIEW_ROWS,
    *,
    key_columns: Sequence[str] = (),
    total_rows: int | None = None,
) -> str:
    """``rows`` rows as a Markdown table, in key order (:func:`preview_order`), with a line saying which.

    A table of at most :data:`SORTED_PREVIEW_MAX_ROWS` rows shows its first
    rows by key. A larger one, or one whose size ``total_rows`` does not give,
    shows the rows a limit reads first (Spark reads the first file(s) only),
    sorted by key: ordering a large table would scan it.

    Args:
        frame: the table.
        rows: how many rows to show.
        key_columns: the columns that identify a row; the first column when empty.
        total_rows: the table's rows, when known without a scan (the Delta log's statistics).
    """
    key, order = preview_order(frame, key_columns)
    whole_order = total_rows is not None and total_rows <= SORTED_PREVIEW_MAX_ROWS
    if whole_order and order:
        picked = frame.orderBy(*order).limit(rows).collect()
    else:
        # Nulls first, as Spark sorts ascending.
        picked = sorted(
            frame.limit(rows).collect(), key=lambda row: tuple((row[name] is not None, row[name]) for name in order)
        )
    return preview_markdown(frame.columns, picked, key=key, whole_order=whole_order, total_rows=total_rows)


def preview_markdown(
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    key: Sequence[str],
    whole_order: bool,
    total_rows: int | None,
    newest: bool = False,
) -> str:
    """A preview's rows (values in column order) as a Markdown table, with a caption saying how they were picked.

    Shared by the Spark and the delta-rs (pandas, polars, Arrow) routes, so both read alike.

    Args:
        columns: the column names.
        rows: the rows shown, in order.
        key: the columns they are ordered by.
        whole_order: whether they are the table's first rows by key (else the first read, then ordered).
        total_rows: the table's rows, when known.
        newest: whether they are rows of the table's newest file (then ordered).
    """
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [str(v).replace("|", "\\|").replace("\n", " ")[:60] for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    by = ", ".join(f"`{name}`" for name in key)
    of = f" of {total_rows:,}" if total_rows is not None else ""
    if newest:
        caption = f"{len(rows)}{of} rows, the newest (from the last file written), ordered by {by}."
    elif not rows or not key:
        caption = f"{len(rows)}{of} rows."
    elif whole_order:
        caption = f"The first {len(rows)}{of} rows by {by}."
    else:
        # Sorting a large table would scan it: say these are not its first rows by key.
        caption = f"{len(rows)}{of} rows, the first read (not the first by key), ordered by {by}."
    return "\n".join(lines) + "\n\n" + caption
