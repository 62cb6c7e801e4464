"""Resolving a table's snapshot with delta-rs: its version, schema and live files.

Both read routes (the ``delta`` data source and the native-Parquet fast route)
start here, so time travel, feature checks and file statistics behave the same
whichever route a caller takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote, urlparse

import deltalake
import pyarrow as pa
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import types as T

from medallion_assets.delta._files import serialize_partition_value
from medallion_assets.delta._schema import delta_to_spark_schema, spark_to_arrow_schema
from medallion_assets.delta.errors import DeltaOptionError, NotADeltaTableError, UnsupportedFeatureError

# Reader features this package reads correctly. Anything else changes what the
# Parquet files mean (deletion vectors hide rows, column mapping renames them).
SUPPORTED_READER_FEATURES = frozenset({"timestampNtz", "v2Checkpoint", "vacuumProtocolCheck"})
_MAX_READER_VERSION = 3


def normalize_path(path: str) -> str:
    """A table location as delta-rs wants it: local paths absolute, URIs as given."""
    if "://" in path and not path.startswith("file://"):
        return path.rstrip("/")
    if path.startswith("file:"):
        # Spark's catalog hands a table's location over as file:/abs/path (one slash).
        path = unquote(urlparse(path).path)
    return os.path.abspath(os.path.expanduser(path))


def parse_timestamp(value: str | datetime, *, table: str) -> datetime:
    """Parse a ``timestampAsOf`` value (ISO 8601 or ``YYYY-MM-DD[ HH:MM:SS]``) as UTC."""
    if isinstance(value, datetime):
        parsed = value
    else:
        text = str(value).strip().replace("Z", "+00:00")
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError as exc:
            raise DeltaOptionError(
                f"timestampAsOf '{value}' is not a timestamp; use ISO 8601, e.g. '2024-05-01 12:00:00'",
                table=table,
            ) from exc
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def open_table(
    path: str,
    *,
    version: int | None = None,
    timestamp: str | datetime | None = None,
    storage_options: dict[str, str] | None = None,
    check_features: bool = True,
) -> deltalake.DeltaTable:
    """Open the table at ``path`` with delta-rs, optionally at a version or timestamp.

    Raises:
        NotADeltaTableError: nothing at ``path`` is a Delta table, or the version does not exist.
        DeltaOptionError: both a version and a timestamp were given.
        UnsupportedFeatureError: the table needs a reader feature this package lacks.
    """
    location = normalize_path(path)
    if version is not None and timestamp is not None:
        raise DeltaOptionError("give versionAsOf or timestampAsOf, not both", table=location)
    try:
        table = deltalake.DeltaTable(location, storage_options=storage_options)
    except TableNotFoundError as exc:
        raise NotADeltaTableError(
            f"'{location}' is not a Delta table (no _delta_log); write one with "
            "df.write.format('delta').save(path) or create it with DeltaTable.create(spark)",
            table=location,
        ) from exc
    if version is not None:
        try:
            table.load_as_version(int(version))
        except Exception as exc:
            raise NotADeltaTableError(
                f"version {version} of the table cannot be read ({exc}); the latest version is "
                f"{deltalake.DeltaTable(location, storage_options=storage_options).version()}",
                table=location,
            ) from exc
    elif timestamp is not None:
        when = parse_timestamp(timestamp, table=location)
        try:
            table.load_as_version(when)
        except Exception as exc:
            raise NotADeltaTableError(
                f"the table has no version at or before {when.isoformat()} ({exc})", table=location
            ) from exc
    if check_features:
        check_read_support(table, location)
    return table


def check_read_support(table: deltalake.DeltaTable, location: str) -> None:
    """Refuse tables whose files cannot be read as plain Parquet."""
    protocol = table.protocol()
    features = set(protocol.reader_features or [])
    unsupported = sorted(features - SUPPORTED_READER_FEATURES)
    config = table.metadata().configuration
    if config.get("delta.columnMapping.mode", "none") not in ("none", None):
        unsupported.append("columnMapping")
    if protocol.min_reader_version > _MAX_READER_VERSION or unsupported:
        raise UnsupportedFeatureError(
            f"the table needs reader features this package does not support: "
            f"{', '.join(sorted(set(unsupported))) or f'reader version {protocol.min_reader_version}'}; "
            "read it with an engine that supports them (delta-spark, delta-rs), or rewrite it without "
            "deletion vectors and column mapping (e.g. delta.enableDeletionVectors=false, then OPTIMIZE)",
            table=location,
        )


@dataclass(frozen=True)
class DataFile:
    """One live data file of a snapshot."""

    path: str
    """Absolute path or URI of the file, decoded."""
    size: int
    partition_values: dict[str, str | None]
    num_records: int | None = None
    min_values: dict[str, Any] = field(default_factory=dict)
    max_values: dict[str, Any] = field(default_factory=dict)
    null_counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """A table at one version: what a read needs, resolved once on the driver."""

    location: str
    version: int
    schema: T.StructType
    partition_columns: list[str]
    files: list[DataFile]
    configuration: dict[str, str]

    @property
    def arrow_schema(self) -> pa.Schema:
        return spark_to_arrow_schema(self.schema, table=self.location)

    @property
    def data_schema(self) -> T.StructType:
        """The columns stored inside the Parquet files (all but the partition columns)."""
        parts = set(self.partition_columns)
        return T.StructType([f for f in self.schema.fields if f.name not in parts])


def _split_stats(row: dict[str, Any], prefix: str) -> dict[str, Any]:
    cut = len(prefix)
    return {k[cut:]: v for k, v in row.items() if k.startswith(prefix) and v is not None}


def file_location(location: str, action_path: str) -> str:
    """The decoded location of a file named by an add/remove action's (URI-encoded) path."""
    decoded = unquote(action_path)
    if "://" in decoded or os.path.isabs(decoded):
        return decoded
    return f"{location}/{decoded}"


def file_key(uri: str) -> str:
    """A file's location as :attr:`DataFile.path` spells it (delta-rs's ``file_uris`` may add ``file://``)."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


def resolve_snapshot(
    path: str,
    *,
    version: int | None = None,
    timestamp: str | datetime | None = None,
    storage_options: dict[str, str] | None = None,
    table: deltalake.DeltaTable | None = None,
) -> Snapshot:
    """Resolve the snapshot of ``path`` (latest, or as of a version or timestamp)."""
    dt = table or open_table(path, version=version, timestamp=timestamp, storage_options=storage_options)
    location = normalize_path(path)
    metadata = dt.metadata()
    partition_columns = list(metadata.partition_columns)
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    files = []
    for row in actions:
        files.append(
            DataFile(
                path=file_location(location, row["path"]),
                size=int(row["size_bytes"]),
                # delta-rs hands partition values over typed; the log (and the rest of
                # this package) speaks the Delta protocol's strings.
                partition_values={c: serialize_partition_value(row.get(f"partition.{c}")) for c in partition_columns},
                num_records=row.get("num_records"),
                min_values=_split_stats(row, "min."),
                max_values=_split_stats(row, "max."),
                null_counts=_split_stats(row, "null_count."),
            )
        )
    return Snapshot(
        location=location,
        version=dt.version(),
        schema=delta_to_spark_schema(dt.schema()),
        partition_columns=partition_columns,
        files=files,
        configuration=dict(metadata.configuration),
    )


def table_schema(
    path: str,
    *,
    version: int | None = None,
    timestamp: str | datetime | None = None,
    storage_options: dict[str, str] | None = None,
) -> T.StructType:
    """The Spark schema of ``path`` (latest, or as of a version or timestamp), as :func:`resolve_snapshot` gives it.

    Opens and checks the table as :func:`resolve_snapshot` does, without
    building its list of live files, which a schema does not need.
    """
    dt = open_table(path, version=version, timestamp=timestamp, storage_options=storage_options)
    return delta_to_spark_schema(dt.schema())


def table_path(options) -> str:
    """The normalized table location of a reader's or writer's options (``load(path)``/``save(path)``)."""
    path = options.get("path")
    if not path:
        raise DeltaOptionError(
            f"no table path: use .load(path) or .save(path), or a table registered with a "
            f"LOCATION (options given: {sorted(options.keys())})"
        )
    return normalize_path(path)
