"""Bronze: the landed files as delivered, plus where and when they came in.

Bronze keeps every line, good or bad, so silver can be rebuilt and a rejected
line can be traced to its file. The schemas below are the contract between
the streaming ingestion that writes bronze and the silver transforms.

Every text bronze stores is valid UTF-8. The landing contract says the files
are UTF-8, but a line can still arrive with bytes that are not (a Latin-1
producer, a multi-byte character cut in two). Bronze keeps such a line with
those bytes replaced by U+FFFD, the Unicode replacement character, as any
UTF-8 decoder that must not lose the rest of the file does, and the good
lines of the file go through. Spark's text source hands lines over as raw,
unchecked bytes, so :func:`landed_lines` replaces them with Spark's
``make_valid_utf8``; Spark's CSV reader decodes with Java's decoder, which
has already replaced them, and :func:`csv_records` applies the same
function so the guarantee does not rest on the reader. Without it, one such
line stopped a bronze stream for good: Parquet and Arrow strings must be
UTF-8, so the delta-rs writer failed on the batch, and every later run on the
same file. Silver rejects a line holding U+FFFD as ``not valid UTF-8`` (see
``medallion_assets.transforms.silver``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import PurePath
from typing import TypeVar
from urllib.parse import unquote, urlparse

from pyarrow import fs
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.functions import pandas_udf
from pyspark.sql.types import (
    ArrayType,
    AtomicType,
    DateType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from medallion_assets.feeds import CHANGE, DELETE, SNAPSHOT, UPSERT, Feed, KafkaTopic, LandingFiles

#: A landed file's path, as text or as a path: :func:`latest_snapshot` returns what it was given.
_SnapshotPath = TypeVar("_SnapshotPath", str, PurePath)

_INGESTION_FIELDS = [
    StructField("_source_file", StringType(), True),
    StructField("_ingested_at", TimestampType(), True),
]

#: A bronze table of landed lines (NDJSON): one row per line, the text untouched.
LINES_SCHEMA = StructType([StructField("value", StringType(), True), *_INGESTION_FIELDS])

#: Spark's CSV reader options for landed CSV files, before a source's own. RFC 4180
#: escapes a quote by doubling it, while Spark's default escape character is a backslash.
CSV_OPTIONS: dict[str, str] = {
    "header": "true",
    "sep": ",",
    "quote": '"',
    "escape": '"',
    "encoding": "UTF-8",
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": "_corrupt_record",
}


def csv_read_schema(feed: Feed) -> StructType:
    """The schema a feed's CSV files are read with: every declared field a string,
    so no value is lost to a failed conversion, plus Spark's corrupt-record column
    (set when a line does not have the header's number of fields)."""
    return StructType(
        [StructField(name, StringType(), True) for name in feed.field_names]
        + [StructField("_corrupt_record", StringType(), True)]
    )


def csv_options(source: LandingFiles) -> dict[str, str]:
    """:data:`CSV_OPTIONS` with the source's own options over them."""
    return {**CSV_OPTIONS, **dict(source.options)}


#: The column of a bronze CSV row holding its file's header, as the file's first
#: record's fields; after the ingestion columns, where an older table gains it.
HEADER_COLUMN = "_header"

_HEADER_FIELD = StructField(HEADER_COLUMN, ArrayType(StringType(), True), True)

#: How much of a CSV file is read for its header: the header is its first record.
_HEADER_BYTES = 1 << 20


def bronze_schema(feed: Feed) -> StructType:
    """The bronze table of a streamed feed (lines, CSV fields as text, or Kafka messages), or of a
    snapshot feed applied as changes (:func:`snapshot_changes_schema`)."""
    if isinstance(feed.source, KafkaTopic):
        return KAFKA_SCHEMA
    if feed.applies_snapshots:
        return snapshot_changes_schema(feed)
    if isinstance(feed.source, LandingFiles) and feed.source.format == "csv":
        return StructType([*csv_read_schema(feed).fields, *_INGESTION_FIELDS, _HEADER_FIELD])
    return LINES_SCHEMA


def with_ingestion_columns(files: DataFrame) -> DataFrame:
    """Add ``_source_file`` and ``_ingested_at`` to a file-source DataFrame.

    Args:
        files: A DataFrame straight from a file source (batch or streaming),
            so that its hidden ``_metadata`` column exists.

    Returns:
        ``files`` with ``_source_file`` (the file's URI) and ``_ingested_at``
        (the time of the query or micro-batch) appended.
    """
    return files.select(
        "*",
        F.col("_metadata.file_path").alias("_source_file"),
        F.current_timestamp().alias("_ingested_at"),
    )


def _as_valid_utf8(schema: StructType) -> list[Column]:
    """``schema``'s columns, the delivered text made valid UTF-8.

    Spark's built-in ``make_valid_utf8``: no Python UDF, and the identity on
    valid text. The ingestion columns are left alone: Spark makes them itself
    (valid already), and wrapping ``_source_file`` would turn it nullable,
    a schema change for the bronze tables that exist.
    """
    ingestion = {field.name for field in _INGESTION_FIELDS}
    return [
        F.make_valid_utf8(field.name).alias(field.name)
        if isinstance(field.dataType, StringType) and field.name not in ingestion
        else F.col(field.name)
        for field in schema.fields
    ]


def landed_lines(text_lines: DataFrame) -> DataFrame:
    """A bronze table of lines from ``spark.read.text`` / ``readStream.text``.

    Args:
        text_lines: The text source's DataFrame (column ``value``), one row per
            line, as bytes unchecked.

    Returns:
        A DataFrame with :data:`LINES_SCHEMA`'s columns; ``value`` is the
        line with any bytes that are not UTF-8 replaced by U+FFFD.
    """
    return with_ingestion_columns(text_lines).select(*_as_valid_utf8(LINES_SCHEMA))


def csv_records(csv_rows: DataFrame, read_schema: StructType, options: dict[str, str] | None = None) -> DataFrame:
    """A bronze table of CSV records, from a CSV source read with ``read_schema``
    (:func:`csv_read_schema`) and ``options`` (:func:`csv_options`, the default
    :data:`CSV_OPTIONS`).

    Spark reads the fields by position and does not compare the header with
    the schema (with ``enforceSchema`` false it would fail the whole batch), so
    each row also carries its file's header, :data:`HEADER_COLUMN`, and silver
    rejects the rows of a file whose header is not the declaration's.

    Returns:
        The read columns, the ingestion columns, then ``_header``; the CSV
        fields and ``_corrupt_record`` are valid UTF-8 (bytes that are not
        UTF-8 replaced by U+FFFD, which Spark's CSV reader has already done).
    """
    schema = StructType([*read_schema.fields, *_INGESTION_FIELDS])
    header = _file_header_udf(dict(options or CSV_OPTIONS))
    return with_ingestion_columns(csv_rows).select(
        *_as_valid_utf8(schema), header(F.col("_source_file")).alias(HEADER_COLUMN)
    )


def read_csv_header(uri: str, *, sep: str = ",", quote: str = '"') -> list[str] | None:
    """The first record of the CSV file at ``uri`` (a path or a URI as Spark's
    ``_metadata.file_path`` gives it): its header's column names.

    Read with Python's ``csv`` module, one record only, decoded as UTF-8 (bytes
    that are not replaced by U+FFFD, a leading byte order mark dropped).

    Returns:
        The names, or None when the file cannot be read (treated as matching:
        the rows are still judged field by field).
    """
    try:
        parsed = urlparse(uri)
        if parsed.scheme in ("", "file"):
            with open(unquote(parsed.path) if parsed.scheme else uri, "rb") as handle:
                head = handle.read(_HEADER_BYTES)
        else:
            filesystem, path = fs.FileSystem.from_uri(uri)
            with filesystem.open_input_stream(path) as handle:
                head = handle.read(_HEADER_BYTES)
    except (OSError, ValueError):
        return None
    text = head.decode("utf-8", errors="replace").removeprefix("\ufeff")
    return next(csv.reader(io.StringIO(text, newline=""), delimiter=sep, quotechar=quote, doublequote=True), [])


def _file_header_udf(options: dict[str, str]):
    """A vectorized UDF: each row's file path -> that file's header (:func:`read_csv_header`).

    A batch of rows comes from few files, so each file is read once per batch.
    """
    sep, quote = options.get("sep", ","), options.get("quote", '"')

    # The stubs' overloads without functionType match type-hinted functions only; this one is a scalar UDF.
    @pandas_udf(ArrayType(StringType(), True))  # type: ignore[call-overload]
    def file_header(paths):  # a pandas Series of file URIs
        headers = {path: read_csv_header(path, sep=sep, quote=quote) for path in paths.unique()}
        return paths.map(headers)

    return file_header


#: A bronze table of Kafka messages: one row per message of the topic, the
#: value as delivered (made valid UTF-8 like a landed line), where it was in
#: the topic, the broker's timestamp, and when it was ingested.
KAFKA_SCHEMA = StructType(
    [
        StructField("value", StringType(), True),
        StructField("key", StringType(), True),
        StructField("topic", StringType(), True),
        StructField("partition", IntegerType(), True),
        StructField("offset", LongType(), True),
        StructField("kafka_timestamp", TimestampType(), True),
        StructField("_ingested_at", TimestampType(), True),
    ]
)


def kafka_messages(messages: DataFrame) -> DataFrame:
    """A bronze table of Kafka messages from ``spark.readStream.format("kafka")``.

    Args:
        messages: The Kafka source's DataFrame (``key`` and ``value`` binary,
            ``topic``, ``partition``, ``offset``, ``timestamp``).

    Returns:
        A DataFrame with :data:`KAFKA_SCHEMA`'s columns. ``value`` and
        ``key`` are the bytes as text, any bytes that are not UTF-8 replaced by
        U+FFFD, as for a landed line (a cast alone would keep them, and the
        Parquet writer would refuse the batch).
    """
    return messages.select(
        F.make_valid_utf8(F.col("value").cast("string")).alias("value"),
        F.make_valid_utf8(F.col("key").cast("string")).alias("key"),
        F.col("topic").cast("string").alias("topic"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.current_timestamp().alias("_ingested_at"),
    )


def is_visible_data_file(name: str) -> bool:
    """Whether Spark's file sources read a file of this name.

    Names starting with ``_`` or ``.`` are skipped (state files, files being
    written), as Spark itself does.
    """
    return not name.startswith(("_", "."))


def latest_snapshot(files: Iterable[_SnapshotPath]) -> _SnapshotPath | None:
    """The snapshot that holds a snapshot feed's current state.

    Snapshot names sort by time, so the greatest visible ``.parquet`` name
    wins.

    Args:
        files: Paths of the files in the feed's landing folder.

    Returns:
        The newest snapshot's path, as given, or None when there is none.
    """
    candidates = [
        path for path in files if PurePath(path).name.endswith(".parquet") and is_visible_data_file(PurePath(path).name)
    ]
    return max(candidates, key=lambda path: PurePath(path).name, default=None)


_INGESTION_DESCRIPTIONS = {
    "_source_file": "URI of the landed file the row came from.",
    "_ingested_at": "When the micro-batch (or load) that took the row in ran, UTC.",
}

_KAFKA_DESCRIPTIONS = {
    "value": "The message's value as text (bytes that were not UTF-8 replaced by U+FFFD).",
    "key": "The message's key as text, if any.",
    "topic": "Kafka topic.",
    "partition": "Kafka partition.",
    "offset": "Offset within the partition.",
    "kafka_timestamp": "The broker's timestamp of the message.",
    "_ingested_at": _INGESTION_DESCRIPTIONS["_ingested_at"],
}


def bronze_column_descriptions(feed: Feed) -> dict[str, str]:
    """What each column of a feed's bronze table holds, for ``dagster/column_schema``."""
    if isinstance(feed.source, KafkaTopic):
        return dict(_KAFKA_DESCRIPTIONS)
    if isinstance(feed.source, LandingFiles) and feed.source.format == "ndjson":
        return {
            "value": "One delivered line, as text (bytes that were not UTF-8 replaced by U+FFFD).",
            **_INGESTION_DESCRIPTIONS,
        }
    as_text = isinstance(feed.source, LandingFiles) or feed.applies_snapshots
    described = {name: f"{text} As delivered (text)." if as_text else text for name, text in feed.descriptions.items()}
    if feed.applies_snapshots:
        return {
            **described,
            CHANGE: "upsert: the snapshot's row of a new or changed key; delete: a key the "
            "snapshot lacks (its other fields null).",
            SNAPSHOT: "The file name of the snapshot.",
            "_source_file": _INGESTION_DESCRIPTIONS["_source_file"],
            "_ingested_at": "When the snapshot was taken in, UTC (the history's valid_from).",
        }
    if isinstance(feed.source, LandingFiles):
        described["_corrupt_record"] = "The whole line when its field count differs from the header's, else null."
        return {
            **described,
            **_INGESTION_DESCRIPTIONS,
            HEADER_COLUMN: "The column names of the header of the file the row came from.",
        }
    return {**described, **_INGESTION_DESCRIPTIONS}


# ---- snapshots applied as changes ---------------------------------------------------

#: The text of a snapshot's timestamp: what silver validates a timestamp against (UTC, the session's time zone).
_SNAPSHOT_TIMESTAMP = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'"


def snapshot_changes_schema(feed: Feed) -> StructType:
    """The bronze table of a snapshot feed applied as changes (``Feed.applies_snapshots``).

    One row per change a snapshot made: every declared field as text,
    ``_change`` (``upsert``: the key's row is new or changed; ``delete``: the
    snapshot lacks the key, whose other fields are null), ``_snapshot`` (the
    snapshot's file name), ``_source_file`` and ``_ingested_at`` (when the
    snapshot was taken in, the history's ``valid_from``).
    """
    return StructType(
        [
            *(StructField(name, StringType(), True) for name in feed.field_names),
            StructField(CHANGE, StringType(), True),
            StructField(SNAPSHOT, StringType(), True),
            *_INGESTION_FIELDS,
        ]
    )


def _as_text(column: Column, kind) -> Column:
    """A snapshot value as the text silver validates: timestamps ``YYYY-MM-DDTHH:MM:SS.ffffffZ``, dates
    ``YYYY-MM-DD``, numbers and strings as Spark writes them, anything nested as JSON."""
    if isinstance(kind, (TimestampType, TimestampNTZType)):
        return F.date_format(column, _SNAPSHOT_TIMESTAMP)
    if isinstance(kind, DateType):
        return F.date_format(column, "yyyy-MM-dd")
    if isinstance(kind, AtomicType):
        return F.make_valid_utf8(column.cast("string")) if isinstance(kind, StringType) else column.cast("string")
    return F.to_json(column)


def snapshot_text(snapshot: DataFrame, feed: Feed) -> DataFrame:
    """A snapshot's declared fields as text (:func:`_as_text`), a field it lacks as null; other columns dropped.

    Silver validates the text as it validates a CSV field's, so a value that
    does not fit its declared type is quarantined with its reason, as in a
    change feed, rather than failing the load.
    """
    types = {field.name: field.dataType for field in snapshot.schema.fields}
    return snapshot.select(
        *(
            (_as_text(F.col(f"`{name}`"), types[name]) if name in types else F.lit(None).cast("string")).alias(name)
            for name in feed.field_names
        )
    )


def snapshot_state(changes: DataFrame, feed: Feed) -> DataFrame:
    """The rows of the last snapshot a snapshot feed's bronze table (``changes``) was built from, as
    :func:`snapshot_text`: per key, its newest snapshot's rows unless that deleted the key."""
    keys = list(feed.silver_keys)
    newest = F.max(SNAPSHOT).over(Window.partitionBy(*keys))
    return (
        changes.select("*", newest.alias("_newest"))
        .where((F.col(SNAPSHOT) == F.col("_newest")) & (F.col(CHANGE) == UPSERT))
        .select(*feed.field_names)
    )


def snapshot_changes(snapshot: DataFrame, before: DataFrame, feed: Feed) -> DataFrame:
    """What a snapshot changed, both as :func:`snapshot_text`: its rows that ``before`` lacks
    (``_change = 'upsert'``: new or changed), and the keys of ``before`` it lacks (``'delete'``,
    other fields null). A row that did not change is no change. Keys compare null-safe."""
    keys = list(feed.silver_keys)
    upserts = snapshot.exceptAll(before).withColumn(CHANGE, F.lit(UPSERT))
    kept = snapshot.select(*(F.col(k).alias(f"_kept_{k}") for k in keys)).distinct()
    gone = (
        before.select(*keys)
        .distinct()
        .join(kept, [F.col(k).eqNullSafe(F.col(f"_kept_{k}")) for k in keys], "left_anti")
    )
    deletes = gone.select(
        *(F.col(n) if n in keys else F.lit(None).cast("string").alias(n) for n in feed.field_names),
        F.lit(DELETE).alias(CHANGE),
    )
    return upserts.unionByName(deletes)
