"""Silver's building blocks: parse, validate, reject with a reason, keep the latest change, mask.

Pure DataFrame-in, DataFrame-out functions of a feed's declaration
(:class:`~medallion_assets.feeds.Feed`); the silver assets call them, and a
pipeline with records of its own shape (nested events) builds its parser from
:func:`validated`, :func:`not_valid_utf8` and :func:`text_schema` the same way.
The rules (``medallion_assets_tests/support/contract_reference`` implements them
independently for the TPC-H feeds):

- The first check of a line is its encoding: a line that held bytes that are
  not UTF-8 is rejected as ``not valid UTF-8`` before its fields are looked
  at. Silver knows such a line by the replacement character U+FFFD in
  bronze's text: bronze replaces undecodable bytes with it
  (:mod:`medallion_assets.transforms.bronze`). A line holding a *literal*
  U+FFFD (valid UTF-8 ``EF BF BD``) is rejected the same way: in a feed of
  UTF-8 text it means an earlier step already lost bytes. The check is on the
  text, so the JSON escape ``\\ufffd`` (six ASCII characters) is an ordinary
  value. Bronze rows still holding raw invalid bytes are rejected too.
- A value is read by its text: JSON leaves are read as strings (a number
  keeps its literal), CSV fields are text; each is validated with a regular
  expression and converted with ``try_cast``, so a bad value never throws
  under ANSI mode and never gets silently rounded.
- Integers match ``-?[0-9]+`` and fit the column; a ``decimal(p,s)`` has at
  most ``p - s`` integer and ``s`` fraction digits; dates are ``YYYY-MM-DD``;
  timestamps ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``. Empty is missing.
- A rejected record carries the reason of its first failing check: the
  delete marker, the keys and the sequence first (a delete needs only those),
  then the other fields in declared order, e.g. ``missing payment_id``,
  ``amount is not a decimal: 'abc'``, ``op is not I, U or D: 'X'``,
  ``not valid JSON``, ``malformed CSV line``.
- A CSV file's header must name the declared fields, in declared order
  (names after them are schema drift): otherwise every row of the file is
  rejected, first of all, with ``header does not match the declaration:
  expected (a, b), found (b, a)`` (:func:`header_mismatch`), since Spark reads
  the fields by position. Rows of bronze tables older than bronze's
  ``_header`` column are judged without it.
- Fields a feed does not declare are ignored: unknown JSON keys, and CSV
  fields past the declared ones, provided the declared fields of the line are
  valid (else the line is ``malformed CSV line``).
- The state of a key is its change with the greatest sequence (ties: the
  greater source file name). A delete removes the key.
- A snapshot feed applied as changes (``Feed.applies_snapshots``) is judged
  by its bronze table's changes, each field as text, with the rules above:
  a snapshot's value that does not fit its declared type is a reason, not a
  failed load.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from medallion_assets.expectations import MESSAGE_ORIGIN_PREFIX, meets_dropping_expectations
from medallion_assets.feeds import (
    SNAPSHOT_AT,
    SNAPSHOT_CHANGE_COLUMNS,
    ApplyChanges,
    Feed,
    KafkaTopic,
    LandingFiles,
    LandingSnapshots,
    MaskDigits,
)
from medallion_assets.transforms.bronze import HEADER_COLUMN

#: The reason of a line that held bytes that are not UTF-8.
NOT_VALID_UTF8 = "not valid UTF-8"

#: How the reason of every row of a CSV file whose header is not the declaration's starts.
HEADER_MISMATCH = "header does not match the declaration"

#: What bronze turns bytes that are not UTF-8 into (U+FFFD REPLACEMENT CHARACTER).
REPLACEMENT_CHARACTER = "\ufffd"

#: from_json fills the corrupt-record field for text that is not a JSON object,
#: so well-formed lines are parsed once only.
JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"}

_INTEGER_PATTERN = r"^-?[0-9]+$"
_DATE_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_TIMESTAMP_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$"
_TIMESTAMP_SORTABLE = "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"
_TIMESTAMP_TEXT = _TIMESTAMP_SORTABLE + "'Z'"


def _decimal_pattern(kind: DecimalType) -> str:
    whole = max(kind.precision - kind.scale, 1)
    fraction = rf"(\.[0-9]{{1,{kind.scale}}})?" if kind.scale else ""
    return rf"^-?[0-9]{{1,{whole}}}{fraction}$"


def text_schema(names: Iterable[str]) -> StructType:
    """A struct of string fields: how records are read before validation."""
    return StructType([StructField(name, StringType(), True) for name in names])


def validated(
    text: Column,
    name: str,
    kind: DataType,
    prefix: Column | None = None,
    *,
    required: bool = True,
    quoted: Column | None = None,
) -> tuple[Column, Column]:
    """Validate one text value against its column type.

    Args:
        text: The value's text (null when missing).
        name: The column name, used in the reason.
        kind: The target type (string, integer, long, decimal, date, timestamp).
        prefix: Prepended to the reason (``lineitem <n>: ``), if given.
        required: a missing or empty value is a reason (``missing <name>``);
            otherwise it is a null.
        quoted: what the reason quotes as the value (default ``text``; a masked field's masked text).

    Returns:
        (reason: null when valid, typed value: null when invalid or missing).

    Example:
        >>> reason, typed = validated(F.col("amount"), "amount", DecimalType(12, 2))
    """
    converted = typed_value(text, kind)
    return invalid_reason(text, converted, name, kind, prefix, required=required, quoted=quoted), converted


def _pattern(kind: DataType) -> tuple[str, str]:
    """The text pattern a value of ``kind`` must match, and what the reason calls it."""
    if isinstance(kind, (LongType, IntegerType)):
        return _INTEGER_PATTERN, "an integer"
    if isinstance(kind, DecimalType):
        return _decimal_pattern(kind), "a decimal"
    if isinstance(kind, DateType):
        return _DATE_PATTERN, "a date"
    if isinstance(kind, TimestampType):
        return _TIMESTAMP_PATTERN, "a timestamp"
    raise TypeError(f"no validation for {kind}")


def typed_value(text: Column, kind: DataType) -> Column:
    """The text as ``kind``: null when missing or not of that type; a string as it is.

    The half of :func:`validated` that costs per value (a pattern and a cast):
    inside an array's lambda Spark shares no expression between two uses, so
    a caller that needs the typed value and the reason of every element
    computes this once per element and hands it to :func:`invalid_reason`.
    """
    if isinstance(kind, StringType):
        return text
    pattern, _ = _pattern(kind)
    return F.when(text.rlike(pattern), text.try_cast(kind))


def is_present_and_valid(converted: Column, kind: DataType) -> Column:
    """True where a required value's :func:`invalid_reason` is null, read from its :func:`typed_value` alone.

    A check that builds no reason: ``converted`` is null when the text is
    missing or not of its type, and a text value must not be empty either.
    """
    present = converted.isNotNull()
    return present & (converted != F.lit("")) if isinstance(kind, StringType) else present


def invalid_reason(
    text: Column,
    converted: Column,
    name: str,
    kind: DataType,
    prefix: Column | None = None,
    *,
    required: bool = True,
    quoted: Column | None = None,
) -> Column:
    """Why ``text`` is not a valid ``kind`` (null when it is), given its :func:`typed_value` ``converted``.

    Arguments as :func:`validated`'s.
    """
    lead = prefix if prefix is not None else F.lit("")
    missing = text.isNull() | (text == F.lit(""))
    missing_reason = F.when(missing, F.concat(lead, F.lit(f"missing {name}"))) if required else None
    if isinstance(kind, StringType):
        return missing_reason if missing_reason is not None else F.lit(None).cast("string")
    _, what = _pattern(kind)
    wrong = F.concat(lead, F.lit(f"{name} is not {what}: '"), text if quoted is None else quoted, F.lit("'"))
    if missing_reason is None:
        return F.when(~missing & converted.isNull(), wrong)
    return missing_reason.when(converted.isNull(), wrong)


def not_valid_utf8(text: Column) -> Column:
    """Whether bronze's text shows bytes that were not UTF-8.

    True for text holding U+FFFD (what bronze replaces them with, or a
    literal one: see the module's rules) and for text that is still not valid
    UTF-8 (bronze rows written before bronze replaced the bytes).
    """
    return ~F.is_valid_utf8(text) | text.contains(REPLACEMENT_CHARACTER)


def not_json_object(text: Column) -> Column:
    """Whether a JSON text is not an object (from_json gives all-null fields for a scalar or array)."""
    return ~F.ltrim(text).startswith("{")


def not_a_json_object_reason(line: Column, parsed: Column) -> Column:
    """``not valid JSON`` / ``not a JSON object`` for a line from_json (with :data:`JSON_OPTIONS`) could not read.

    Only lines that are not a JSON object pay for the second parse that tells
    invalid JSON from a JSON scalar or array.
    """
    return F.when(
        parsed.isNull() | parsed["_corrupt_record"].isNotNull(),
        F.when(F.try_parse_json(line).isNull(), F.lit("not valid JSON")).otherwise(F.lit("not a JSON object")),
    )


def kafka_lines(messages: DataFrame) -> DataFrame:
    """Kafka messages of bronze in the shape of landed lines: ``value``, ``_source_file``, ``_ingested_at``.

    A message's origin goes where a landed line's file goes, as
    ``kafka://<topic>/<partition>/<offset>``, so a rejected message is
    quarantined with its partition and offset and everything after this
    treats both sources alike.
    """
    origin = F.concat(
        F.lit(MESSAGE_ORIGIN_PREFIX),
        F.col("topic"),
        F.lit("/"),
        F.col("partition").cast("string"),
        F.lit("/"),
        F.col("offset").cast("string"),
    )
    return messages.select("value", origin.alias("_source_file"), "_ingested_at")


# ---- a declared feed's changes ---------------------------------------------------------


def _checked_first(feed: Feed) -> list[str]:
    """The fields every change needs, a delete too: delete marker, keys, sequence (in that order)."""
    if not isinstance(feed.silver, ApplyChanges):
        return list(feed.field_names)
    changes = feed.silver
    first = [*(changes.delete_when[:1] if changes.delete_when else ()), *changes.keys, *changes.sequence_by]
    return list(dict.fromkeys(first))


def _is_delete(feed: Feed, text_of) -> Column:
    changes = feed.silver
    if isinstance(changes, ApplyChanges) and changes.delete_when:
        column, value = changes.delete_when
        return F.coalesce(text_of(column) == F.lit(value), F.lit(False))
    return F.lit(False)


def _judge_fields(feed: Feed, text_of) -> tuple[Column, dict[str, Column]]:
    """The first failing check's reason over a record's fields, and each field's typed value."""
    first = _checked_first(feed)
    is_delete = _is_delete(feed, text_of)
    reasons: dict[str, Column] = {}
    typed: dict[str, Column] = {}
    for f in feed.fields:
        text = text_of(f.name)
        # A reason quotes a masked field's value masked: the quarantine holds no text the declaration masks.
        quoted = masked_column(text, f.mask) if f.mask is not None else text
        reason, value = validated(text, f.name, f.type, required=not f.nullable or f.name in first, quoted=quoted)
        if f.values:
            allowed = f.values[0] if len(f.values) == 1 else f"{', '.join(f.values[:-1])} or {f.values[-1]}"
            out_of_domain = F.when(
                ~text.isin(*f.values), F.concat(F.lit(f"{f.name} is not {allowed}: '"), quoted, F.lit("'"))
            )
            reason = F.coalesce(reason, out_of_domain)
        reasons[f.name] = reason
        # A delete carries its key; whatever else it holds is not state.
        typed[f.name] = value if f.name in first else F.when(~is_delete, value)
    ordered = [reasons[n] for n in first] + [F.when(~is_delete, reasons[n]) for n in feed.field_names if n not in first]
    return F.coalesce(*ordered), typed


def parse_changes(bronze_rows: DataFrame, feed: Feed) -> tuple[DataFrame, DataFrame]:
    """Split a feed's bronze rows into typed records and rejects.

    Args:
        bronze_rows: the feed's bronze table (or its new rows): NDJSON lines
            (``value``), CSV fields as text (plus ``_corrupt_record``) or Kafka
            messages, with ``_source_file`` / ``_ingested_at``.
        feed: the declaration.

    Returns:
        ``(records, rejects)``. Records: the declared fields typed (a delete
        keeps only its marker, keys and sequence), ``_source_file``,
        ``_ingested_at``. Rejects: ``value`` (the line as delivered, made
        valid UTF-8; for a feed with masked fields, its declared fields with
        those masked, or ``sha256:<hex>`` of a line that cannot be split:
        :func:`judge_changes`), ``_source_file``, ``_ingested_at``, ``reason``. Both
        read every row; to parse once, cache :func:`judge_changes` and take
        :func:`typed_changes` and :func:`rejected_changes` of it.
    """
    judged = judge_changes(bronze_rows, feed)
    return typed_changes(judged, feed), rejected_changes(judged)


def judge_changes(bronze_rows: DataFrame, feed: Feed) -> DataFrame:
    """Every bronze row of a feed parsed once: its reject reason, or its typed fields.

    Returns:
        ``_reject_reason`` (null for a good row), ``_rejected_value`` (the row
        as delivered, made valid UTF-8, for rejects only; for a feed with
        masked fields, nothing it masks: a line split into its fields (a JSON
        object, a CSV line with the declared field count) as those fields'
        text with the masked ones masked by :func:`masked_column`, as a JSON
        object or a CSV line; any other line, or one not valid UTF-8, as
        :func:`line_digest` of its text), ``_typed_<field>``
        per declared field, ``_source_file`` and ``_ingested_at``.
    """
    if isinstance(feed.source, LandingFiles) and feed.source.format == "csv":
        return _parse_csv(bronze_rows, feed)
    if isinstance(feed.source, LandingSnapshots):
        return _parse_snapshot_changes(bronze_rows, feed.change_feed)
    lines = kafka_lines(bronze_rows) if isinstance(feed.source, KafkaTopic) else bronze_rows
    return _parse_json(lines.select("value", "_source_file", "_ingested_at"), feed)


def typed_changes(judged: DataFrame, feed: Feed) -> DataFrame:
    """The records of :func:`judge_changes`' good rows.

    The declared fields typed, ``_source_file`` and ``_ingested_at``.
    """
    return judged.where(F.col("_reject_reason").isNull()).select(
        *(F.col(f"_typed_{f.name}").cast(f.type).alias(f.name) for f in feed.fields),
        "_source_file",
        "_ingested_at",
    )


def rejected_changes(judged: DataFrame) -> DataFrame:
    """The rejected rows of :func:`judge_changes`: ``value``, ``_source_file``, ``_ingested_at``, ``reason``."""
    return judged.where(F.col("_reject_reason").isNotNull()).select(
        F.col("_rejected_value").alias("value"),
        "_source_file",
        "_ingested_at",
        F.col("_reject_reason").alias("reason"),
    )


def _parse_json(lines: DataFrame, feed: Feed) -> DataFrame:
    record = F.from_json("value", text_schema([*feed.field_names, "_corrupt_record"]), JSON_OPTIONS)
    parsed = lines.select("*", record.alias("_record"))
    field_reason, typed = _judge_fields(feed, lambda name: F.col("_record").getField(name))
    encoding_reason = F.when(not_valid_utf8(F.col("value")), F.lit(NOT_VALID_UTF8))
    object_reason = not_a_json_object_reason(F.col("value"), F.col("_record"))
    reason = F.coalesce(encoding_reason, object_reason, field_reason)
    delivered = F.make_valid_utf8("value")
    if not masked_fields(feed):
        return _judged(parsed, feed, reason, typed, delivered)
    # A JSON object: its declared fields as read, the masked ones masked; else no text of it.
    split = encoding_reason.isNull() & object_reason.isNull() & ~not_json_object(F.col("value"))
    record = F.to_json(
        F.struct(
            *(
                masked_column(F.col("_record").getField(f.name), f.mask).alias(f.name)
                if f.mask is not None
                else F.col("_record").getField(f.name).alias(f.name)
                for f in feed.fields
            )
        )
    )
    return _judged(parsed, feed, reason, typed, F.when(split, record).otherwise(line_digest(delivered)))


def _parse_csv(rows: DataFrame, feed: Feed) -> DataFrame:
    field_reason, typed = _judge_fields(feed, F.col)
    names = list(feed.field_names)
    # Every field of the line, the ones past the declared ones too (kept whole in
    # _corrupt_record), joined by an ASCII separator so no two fields' bytes
    # can join into a valid character.
    line_text = F.concat_ws(",", *names, "_corrupt_record")
    # Spark keeps a line whose field count is off in _corrupt_record. With too
    # few fields some declared field is missing; with more, the declared
    # fields come first and the extra ones are fields the feed does not know
    # (schema drift), which silver ignores as it does unknown JSON fields.
    reason = (
        F.when(not_valid_utf8(line_text), F.lit(NOT_VALID_UTF8))
        .when(F.col("_corrupt_record").isNotNull() & field_reason.isNotNull(), F.lit("malformed CSV line"))
        .otherwise(field_reason)
    )
    if HEADER_COLUMN in rows.columns:  # bronze tables from before bronze kept the header have none
        reason = F.coalesce(header_mismatch(F.col(HEADER_COLUMN), names), reason)
    value = F.make_valid_utf8(F.coalesce(F.col("_corrupt_record"), F.to_csv(F.struct(*names))))
    if not masked_fields(feed):
        return _judged(rows, feed, reason, typed, value)
    # Split into the declared fields: the masked ones masked; a line whose field count is
    # off (positions unreliable) or that was not UTF-8 keeps no text, only its digest.
    split = F.col("_corrupt_record").isNull() & ~not_valid_utf8(line_text)
    record = F.to_csv(
        F.struct(
            *(
                masked_column(F.col(f.name), f.mask).alias(f.name) if f.mask is not None else F.col(f.name)
                for f in feed.fields
            )
        )
    )
    return _judged(rows, feed, reason, typed, F.when(split, record).otherwise(line_digest(value)))


def _parse_snapshot_changes(rows: DataFrame, feed: Feed) -> DataFrame:
    """The changes of a snapshot feed's bronze table (``Feed.change_feed``'s fields as text), judged as a
    CSV line's fields are; ``_snapshot_at`` is when the snapshot was taken in. A rejected change is
    quarantined as a JSON object of its declared fields, the masked ones masked."""

    def text_of(name: str) -> Column:
        return F.date_format("_ingested_at", _TIMESTAMP_TEXT) if name == SNAPSHOT_AT else F.col(name)

    field_reason, typed = _judge_fields(feed, text_of)
    delivered = [f for f in feed.fields if f.name not in SNAPSHOT_CHANGE_COLUMNS]
    encoding = F.when(not_valid_utf8(F.concat_ws(",", *(f.name for f in delivered))), F.lit(NOT_VALID_UTF8))
    record = F.to_json(
        F.struct(
            *(
                (masked_column(F.col(f.name), f.mask) if f.mask is not None else F.col(f.name)).alias(f.name)
                for f in delivered
            )
        )
    )
    return _judged(rows, feed, F.coalesce(encoding, field_reason), typed, record)


def masked_fields(feed: Feed) -> tuple[str, ...]:
    """The fields the declaration masks (``Field.mask``), in declared order."""
    return tuple(f.name for f in feed.fields if f.mask is not None)


def line_digest(text: Column) -> Column:
    """``sha256:<hex>``: the SHA-256 of the text's UTF-8 bytes, what a masked feed's quarantine keeps of a line it
    cannot split into its fields (the line's text itself could hold a masked value)."""
    return F.concat(F.lit("sha256:"), F.sha2(text, 256))


def header_mismatch(header: Column, names: list[str]) -> Column:
    """The reason of a row whose file's header (an array of names) is not the declared
    fields in order, else null; a null header (unknown) matches.

    Names past the declared ones are schema drift and match, as fields past the
    declared ones of a line do: ``header does not match the declaration:
    expected (key, email, plan), found (id, name, favourite_colour)``.
    """
    declared = F.array(*(F.lit(name) for name in names))
    return F.when(
        header.isNotNull() & ~F.coalesce(F.slice(header, 1, len(names)) == declared, F.lit(False)),
        F.concat(
            F.lit(f"{HEADER_MISMATCH}: expected ({', '.join(names)}), found ("),
            F.array_join(header, ", "),
            F.lit(")"),
        ),
    )


def _judged(rows: DataFrame, feed: Feed, reason: Column, typed: dict[str, Column], value: Column) -> DataFrame:
    return rows.select(
        "*", reason.alias("_reject_reason"), *(typed[n].alias(f"_typed_{n}") for n in feed.field_names)
    ).select(
        "_reject_reason",
        # The delivered text of a rejected row only: a cache of this frame then holds
        # about what the records hold, not every row twice.
        F.when(F.col("_reject_reason").isNotNull(), value).alias("_rejected_value"),
        *(f"_typed_{n}" for n in feed.field_names),
        "_source_file",
        "_ingested_at",
    )


def change_sequence(feed: Feed) -> Column:
    """``_sequence``: one sortable text per change (its sequence fields, then its file), so a merge compares one column.

    Timestamps and dates sort as ISO text; integers are zero-padded to 20
    digits (sequence integers are not negative); the file name breaks ties,
    as the latest-change rule does.
    """
    parts = []
    for name in feed.apply_changes.sequence_by:
        kind = feed.field(name).type
        column = F.col(name)
        if isinstance(kind, TimestampType):
            parts.append(F.date_format(column, _TIMESTAMP_SORTABLE))
        elif isinstance(kind, (LongType, IntegerType)):
            parts.append(F.lpad(column.cast("string"), 20, "0"))
        else:
            parts.append(column.cast("string"))
    return F.concat_ws("|", *parts, F.col("_source_file")).alias("_sequence")


def latest_changes(records: DataFrame, feed: Feed) -> DataFrame:
    """The winning change of each key: greatest sequence, ties to the greater ``_source_file``.

    For an incremental MERGE: match on the keys, replace when the incoming
    ``_sequence`` is greater, delete when ``_deleted``.

    Returns:
        One row per key: the declared fields, ``_source_file`` (the winner's),
        ``_sequence`` and ``_deleted``.
    """
    changes = feed.apply_changes
    payload = [n for n in (*feed.field_names, "_source_file") if n not in changes.keys]
    order = F.struct(*changes.sequence_by, "_source_file")
    winners = records.groupBy(*changes.keys).agg(F.max_by(F.struct(*payload), order).alias("_winner"))
    latest = winners.select(*changes.keys, *(F.col(f"_winner.{n}").alias(n) for n in payload))
    return latest.select(
        *feed.field_names, "_source_file", change_sequence(feed), _is_delete(feed, F.col).alias("_deleted")
    )


def silver_rows(latest: DataFrame, feed: Feed) -> DataFrame:
    """The rows silver stores for the changes that are not deletes.

    Its fields (masked), ``_sequence`` and ``_source_file``.
    """
    kept = [f.name for f in feed.silver_fields]
    return mask_pii(latest.where(~F.col("_deleted")).select(*kept, "_sequence", "_source_file"), feed)


def deleted_keys(latest: DataFrame, feed: Feed) -> DataFrame:
    """The keys the changes delete, with their ``_sequence`` (a masked key masked, as silver holds it)."""
    return mask_pii(latest.where(F.col("_deleted")).select(*feed.silver_keys, "_sequence"), feed)


def rows_to_merge(kept: DataFrame, deleted: DataFrame) -> DataFrame:
    """What a merge with deletes takes: the kept rows (``_deleted`` false, their ``_source_file``
    dropped) and the deleted keys with their ``_sequence`` (``_deleted`` true, other columns null)."""
    return (
        kept.drop("_source_file")
        .withColumn("_deleted", F.lit(False))
        .unionByName(deleted.withColumn("_deleted", F.lit(True)), allowMissingColumns=True)
    )


def mask_pii(frame: DataFrame, feed: Feed) -> DataFrame:
    """Mask the feed's PII fields that ``frame`` has, deterministically so joins still work.

    - ``"sha256"``: the hex SHA-256 of the value's UTF-8 bytes.
    - :class:`~medallion_assets.feeds.MaskDigits`: the first ``keep`` characters
      stay, every later digit becomes ``*``: ``25-989-741-2988`` -> ``25-***-***-****``.

    Returns:
        The same columns in the same order.
    """
    masks = {f.name: f.mask for f in feed.fields if f.mask is not None and f.name in frame.columns}
    return frame.select(
        *(masked_column(F.col(n), masks[n]).alias(n) if n in masks else F.col(n) for n in frame.columns)
    )


def masked_column(column: Column, mask) -> Column:
    """One value masked by its declared mask, the rule :func:`mask_pii` applies (null stays null)."""
    if isinstance(mask, MaskDigits):
        rest = column.substr(F.lit(mask.keep + 1), F.greatest(F.length(column), F.lit(1)))
        return F.concat(column.substr(F.lit(1), F.lit(mask.keep)), F.regexp_replace(rest, r"[0-9]", "*"))
    return F.sha2(column, 256)


def adopted_sequences(silver: DataFrame, tombstones: DataFrame | None, feed: Feed) -> DataFrame:
    """Per key, the ``_sequence`` of the change silver adopted last, as ``_adopted``.

    A key silver holds: its row's ``_sequence``. A key silver does not hold:
    its newest delete in the tombstones (``<table>__tombstones``), if any.
    Keys are as silver stores them (masked when declared masked).

    Args:
        silver: the silver table (its keys and ``_sequence``).
        tombstones: the silver table's tombstones (keys, ``_sequence``), None before any delete.
    """
    keys = list(feed.silver_keys)
    held = silver.select(*keys, F.col("_sequence").alias("_held"))
    if tombstones is None:
        return held.select(*keys, F.col("_held").alias("_adopted"))
    deleted = tombstones.groupBy(*keys).agg(F.max("_sequence").alias("_deleted_at"))
    return held.join(deleted, keys, "full_outer").select(
        *keys, F.coalesce(F.col("_held"), F.col("_deleted_at")).alias("_adopted")
    )


def adopted_in_one_run(records: DataFrame, feed: Feed) -> DataFrame:
    """:func:`adopted_sequences` of a silver built by one run of all ``records``: each key's winning
    change when it is a delete or meets the drop/fail expectations (masked, as silver judges it)."""
    latest = mask_pii(latest_changes(records, feed), feed)
    adopted = latest.where(F.col("_deleted") | meets_dropping_expectations(feed.expectations))
    return adopted.select(*feed.silver_keys, F.col("_sequence").alias("_adopted"))


def history_rows(records: DataFrame, feed: Feed, adopted: DataFrame) -> DataFrame:
    """Type-2 history of silver: one row per distinct change silver's rules let in, PII masked.

    A change enters when it parsed (``records`` are typed changes), meets
    every ``drop``/``fail`` expectation of the feed judged on the change
    itself, masked, as silver judges a run's winner (a delete is not judged),
    and its ``_sequence`` (:func:`change_sequence`) is at most the one silver
    adopted for its key (:func:`adopted_sequences`): a key without an
    adopted change has no history. So the current row of a key is silver's
    row (or the delete that removed it from silver); a change that silver
    refused, or that lost its run to a refused change, is not current, while
    a late, older change slots in between two rows. Each change is valid from
    its first sequence field until the key's next change; a delete is a row
    with ``is_deleted`` and null fields but its keys, sequence and marker.

    Returns:
        The silver fields, ``valid_from``, ``valid_to`` (null while current),
        ``is_current``, ``is_deleted``.
    """
    changes = feed.apply_changes
    keys = list(changes.keys)
    since = changes.sequence_by[0]
    staged = mask_pii(
        records.select(
            *feed.field_names, "_source_file", change_sequence(feed), _is_delete(feed, F.col).alias("_deleted")
        ),
        feed,
    )
    entered = (
        staged.where(F.col("_deleted") | meets_dropping_expectations(feed.expectations))
        .join(adopted, keys, "inner")
        .where(F.col("_sequence") <= F.col("_adopted"))
    )
    distinct = entered.dropDuplicates(list(feed.field_names))
    marker = [changes.delete_when[0]] if changes.delete_when else []
    by_key = Window.partitionBy(*keys).orderBy(*changes.sequence_by, "_source_file", *marker)
    valid_to = F.lead(since).over(by_key)
    return distinct.select(
        *(F.col(f.name) for f in feed.silver_fields),
        F.col(since).alias("valid_from"),
        valid_to.alias("valid_to"),
        valid_to.isNull().alias("is_current"),
        F.col("_deleted").alias("is_deleted"),
    )


def history_of_changed_keys(records: DataFrame, changed: DataFrame, feed: Feed, adopted: DataFrame) -> DataFrame:
    """The type-2 history (:func:`history_rows`) of the keys ``changed`` names, from all their records.

    A change can close the row before it or, arriving late and older, slot in
    between two rows, so a key's history is rebuilt from every record of the
    key; keys without a new record keep the rows they have.

    Args:
        records: every typed record of the feed (its whole bronze table, parsed).
        changed: the typed records that arrived since the history was last written.
        adopted: :func:`adopted_sequences` of silver as the same run left it.

    Returns:
        The history rows of the changed keys only, columns as :func:`history_rows`.
    """
    keys = list(feed.silver_keys)
    return history_rows(records.join(changed.select(*keys).distinct(), keys, "left_semi"), feed, adopted)


def conform_snapshot(snapshot: DataFrame, feed: Feed) -> DataFrame:
    """A snapshot with exactly the feed's fields, cast to their types."""
    return snapshot.select(*(F.col(f.name).cast(f.type).alias(f.name) for f in feed.fields))
