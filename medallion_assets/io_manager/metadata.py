"""Dagster output metadata of a Delta table, from the client's :class:`~.client.TableDescription`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from dagster import MetadataValue, TableColumn, TableSchema
from pyspark.sql import DataFrame

from medallion_assets.engine import CommitFacts
from medallion_assets.io_manager.client import DeltaTableClient, TableDescription

_PREVIEW_ROWS = 5


def table_metadata(
    client: DeltaTableClient,
    path: str,
    *,
    commit: CommitFacts | None = None,
    preview_rows: int = _PREVIEW_ROWS,
    column_descriptions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Dagster metadata describing the table's current version (:meth:`DeltaTableClient.describe`).

    Args:
        client: reads the table.
        path: the table's location.
        commit: the newest commit when the caller has just read it (a write's result).
        preview_rows: rows of the Markdown preview.
        column_descriptions: column name -> description, for ``dagster/column_schema``.

    Raises:
        ValueError: a description names a column the table does not have.
    """
    return description_metadata(
        client.describe(path, commit=commit), preview_rows=preview_rows, column_descriptions=column_descriptions
    )


def description_metadata(
    description: TableDescription,
    *,
    preview_rows: int = _PREVIEW_ROWS,
    column_descriptions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Output metadata of a described version.

    The engine, the schema as ``dagster/column_schema`` (with
    ``column_descriptions``), rows, the location, version, operation and its
    metrics, files, bytes, partition columns and a preview of ``preview_rows`` rows.

    Raises:
        ValueError: a description names a column the table does not have.
    """
    frame = description.frame
    metrics = description.operation_metrics
    descriptions = column_descriptions or {}
    check_column_descriptions(descriptions, frame.columns, table=f"Delta table {description.path}")
    return {
        "delta/engine": description.engine,
        "dagster/column_schema": spark_table_schema(frame, descriptions),
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


def markdown_preview(frame: DataFrame, rows: int = _PREVIEW_ROWS) -> str:
    """The first ``rows`` rows as a Markdown table."""
    columns = frame.columns
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in frame.limit(rows).collect():
        cells = [str(v).replace("|", "\\|").replace("\n", " ")[:60] for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
