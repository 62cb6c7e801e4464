"""Reading a table's change data feed (CDF) with delta-rs.

delta-spark's ``readChangeFeed`` returns the table's columns plus
``_change_type`` (``insert``, ``delete``, ``update_preimage``,
``update_postimage``), ``_commit_version`` (long) and ``_commit_timestamp``
(timestamp). delta-rs' ``load_cdf`` gives the same rows with other Arrow types
(string views, ``uint64``, ``timestamp[ms]`` without a zone); this module casts
them to what Spark expects: plain strings, ``int64`` and
``timestamp[us, tz=UTC]``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator

import pyarrow as pa
from deltalake import DeltaTable as _RsTable
from deltalake.exceptions import DeltaError as _RsDeltaError
from deltalake.exceptions import TableNotFoundError

from medallion_assets.delta.errors import DeltaError, DeltaOptionError, NotADeltaTableError

__all__ = ["CDF_COLUMNS", "change_feed_schema", "read_change_feed_batches"]

#: The metadata columns the change data feed adds to the table's columns.
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")

_CDF_FIELDS = [
    pa.field("_change_type", pa.string()),
    pa.field("_commit_version", pa.int64()),
    pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC")),
]


def _plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with view/large string and binary types replaced by the plain ones."""
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(_plain_field(t.value_field))
    if pa.types.is_map(t):
        return pa.map_(_plain_field(t.key_field), _plain_field(t.item_field))
    if pa.types.is_struct(t):
        return pa.struct([_plain_field(t.field(i)) for i in range(t.num_fields)])
    return t


def _plain_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, _plain_type(f.type), f.nullable, f.metadata)


def change_feed_schema(table_schema: pa.Schema) -> pa.Schema:
    """The Arrow schema of the change feed of a table with ``table_schema``."""
    fields = [_plain_field(f) for f in table_schema if f.name not in CDF_COLUMNS]
    return pa.schema(fields + _CDF_FIELDS)


def _timestamp_text(value: str | _dt.datetime | _dt.date | None, what: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        return value.isoformat()
    if isinstance(value, _dt.date):
        return _dt.datetime(value.year, value.month, value.day, tzinfo=_dt.UTC).isoformat()
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as exc:
            raise DeltaOptionError(
                f"{what} {value!r} is not an ISO 8601 timestamp such as '2024-01-31 12:00:00'."
            ) from exc
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=_dt.UTC)
        return parsed.isoformat()
    raise DeltaOptionError(f"{what} must be a string or a datetime, got {type(value).__name__}.")


def _check_version(value, what: str) -> int | None:
    if value is None:
        return None
    try:
        version = int(value)
    except (TypeError, ValueError) as exc:
        raise DeltaOptionError(f"{what} must be a table version (an integer), got {value!r}.") from exc
    if version < 0:
        raise DeltaOptionError(f"{what} must be >= 0, got {version}.")
    return version


def read_change_feed_batches(
    path: str,
    *,
    starting_version: int | None = None,
    ending_version: int | None = None,
    starting_timestamp: str | _dt.datetime | None = None,
    ending_timestamp: str | _dt.datetime | None = None,
    columns: list[str] | None = None,
    storage_options: dict[str, str] | None = None,
) -> pa.RecordBatchReader:
    """Read the change data feed of the table at ``path`` between two versions.

    Like delta-spark's ``readChangeFeed``: both ends are inclusive; with neither
    a starting version nor timestamp the feed starts at version 0; with no end
    it runs to the latest version. Runs with delta-rs in this process.

    Args:
        path: the table's folder or URI.
        starting_version: first commit version to include.
        ending_version: last commit version to include.
        starting_timestamp: include commits made at or after this time (ISO
            8601 text or a datetime; naive values are UTC).
        ending_timestamp: include commits made at or before this time.
        columns: table columns to keep (the three CDF columns are always kept).
        storage_options: delta-rs object-store options.

    Returns:
        A ``pyarrow.RecordBatchReader`` with the table's columns plus
        ``_change_type`` (string), ``_commit_version`` (int64) and
        ``_commit_timestamp`` (``timestamp[us, tz=UTC]``).

    Raises:
        NotADeltaTableError: ``path`` holds no Delta table.
        DeltaOptionError: both a version and a timestamp start (or end) given,
            or a malformed value.
        DeltaError: the change data feed (``delta.enableChangeDataFeed``) was
            not on for every commit in the range, or the range is outside the
            table's history.

    Example:
        >>> import pyarrow as pa
        >>> from medallion_assets.delta._cdf import read_change_feed_batches
        >>> changes = pa.table(read_change_feed_batches("/tmp/t", starting_version=1))  # doctest: +SKIP
        >>> changes.column("_change_type").to_pylist()  # doctest: +SKIP
        ['update_preimage', 'update_postimage']
    """
    if starting_version is not None and starting_timestamp is not None:
        raise DeltaOptionError(
            "Give either startingVersion or startingTimestamp for the change feed, not both.",
            table=str(path),
        )
    if ending_version is not None and ending_timestamp is not None:
        raise DeltaOptionError(
            "Give either endingVersion or endingTimestamp for the change feed, not both.",
            table=str(path),
        )
    start_v = _check_version(starting_version, "startingVersion")
    end_v = _check_version(ending_version, "endingVersion")
    if start_v is not None and end_v is not None and end_v < start_v:
        raise DeltaOptionError(f"endingVersion {end_v} is before startingVersion {start_v}.", table=str(path))
    start_ts = _timestamp_text(starting_timestamp, "startingTimestamp")
    end_ts = _timestamp_text(ending_timestamp, "endingTimestamp")

    try:
        dt = _RsTable(str(path), storage_options=storage_options)
    except TableNotFoundError as exc:
        raise NotADeltaTableError(f"No Delta table here: {exc}", table=str(path)) from exc

    latest = dt.version()
    if start_v is not None and start_v > latest:
        raise DeltaError(
            f"startingVersion {start_v} is after the table's latest version {latest}.",
            table=str(path),
        )
    try:
        changes = dt.load_cdf(
            starting_version=start_v if start_v is not None else 0,
            ending_version=end_v,
            starting_timestamp=start_ts,
            ending_timestamp=end_ts,
            columns=None if columns is None else [*columns, *CDF_COLUMNS],
        )
        reader = pa.RecordBatchReader.from_stream(changes)
    except (_RsDeltaError, ValueError) as exc:
        text = str(exc)
        if "change data" in text.lower():
            raise DeltaError(
                "The change data feed is not enabled for every version in the requested range "
                f"({text}). Set the table property delta.enableChangeDataFeed = true "
                "(DeltaTable.forPath(spark, path).setProperty('delta.enableChangeDataFeed', "
                "'true')); changes are recorded only from that commit on.",
                table=str(path),
            ) from exc
        raise DeltaError(f"Cannot read the change data feed: {text}", table=str(path)) from exc

    # delta-rs puts partition columns last; Spark lists columns in the table's order.
    table_order = [f.name for f in pa.schema(dt.schema().to_arrow())]
    got = {f.name: f for f in reader.schema}
    ordered = [got[n] for n in table_order if n in got]
    ordered += [f for f in reader.schema if f.name not in table_order and f.name not in CDF_COLUMNS]
    target = change_feed_schema(pa.schema(ordered))

    def batches() -> Iterator[pa.RecordBatch]:
        for batch in reader:
            cols = [batch.column(f.name).cast(f.type) for f in target]
            yield pa.RecordBatch.from_arrays(cols, schema=target)

    return pa.RecordBatchReader.from_batches(target, batches())
