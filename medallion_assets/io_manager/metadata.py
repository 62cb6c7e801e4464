"""Dagster output metadata of a Delta table, from the client's :class:`~.client.TableDescription`."""

from __future__ import annotations

import json
from typing import Any

from dagster import MetadataValue, TableColumn, TableSchema
from pyspark.sql import DataFrame

from medallion_assets.engine import CommitFacts
from medallion_assets.io_manager.client import DeltaTableClient, TableDescription

_PREVIEW_ROWS = 5


def table_metadata(
    client: DeltaTableClient, path: str, *, commit: CommitFacts | None = None, preview_rows: int = _PREVIEW_ROWS
) -> dict[str, Any]:
    """Dagster metadata describing the table's current version (:meth:`DeltaTableClient.describe`).

    ``commit``: the newest commit when the caller has just read it (a write's result).
    """
    return description_metadata(client.describe(path, commit=commit), preview_rows=preview_rows)


def description_metadata(description: TableDescription, *, preview_rows: int = _PREVIEW_ROWS) -> dict[str, Any]:
    """Output metadata of a described version.

    The engine, the schema as ``dagster/column_schema``, rows, the location,
    version, operation and its metrics, files, bytes, partition columns and a
    preview of ``preview_rows`` rows.
    """
    frame = description.frame
    metrics = description.operation_metrics
    return {
        "delta/engine": description.engine,
        "dagster/column_schema": spark_table_schema(frame),
        "dagster/row_count": description.rows,
        "dagster/uri": MetadataValue.path(description.path),
        "delta/version": description.version,
        "delta/operation": description.operation,
        "delta/operation_metrics": MetadataValue.json(json.loads(json.dumps(metrics, default=str))),
        "delta/num_files": description.num_files,
        "delta/size_bytes": description.size_bytes,
        "delta/partition_columns": MetadataValue.json(description.partition_columns),
        # A limit over the version just written: Spark reads the first file(s) only.
        "preview": MetadataValue.md(markdown_preview(frame, preview_rows)),
    }


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
