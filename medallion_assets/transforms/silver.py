"""Silver: typed, validated, deduplicated latest state.

Parsing splits each bronze table into typed rows and rejects with a reason.
The rules (also written down in ``medallion_assets_tests/contract_reference``,
which implements them independently):

- The first check of an order line or a customer CSV row is its encoding: a
  line that held bytes that are not UTF-8 is rejected as ``not valid UTF-8``,
  before JSON or CSV fields are looked at (a Latin-1 ``é`` inside an otherwise
  valid event rejects the event). Silver knows such a line by the replacement
  character U+FFFD in bronze's text: bronze replaces undecodable bytes with it
  (``medallion_assets.transforms.bronze``), and bronze's schema stays as it
  is. So a line that holds a *literal* U+FFFD (its valid UTF-8 bytes
  ``EF BF BD``) is rejected the same way: in a feed of UTF-8 text, a U+FFFD
  means some earlier step already replaced bytes it could not decode, so the
  line has lost data either way. The check is on the text, so the JSON escape
  ``\\ufffd`` (six ASCII characters) is an ordinary value. Bronze rows
  that still hold raw invalid bytes (written before bronze replaced them) are
  rejected too, and quarantined as valid UTF-8.
- A JSON value is read by its text: ``from_json`` reads every leaf as a
  string (a number keeps its literal), and each column is then validated with
  a regular expression and converted with ``try_cast``, so a bad value never
  throws under ANSI mode and never gets silently rounded.
- Integers match ``-?[0-9]+`` and fit the column; decimals match
  ``-?[0-9]{1,13}(.[0-9]{1,2})?``, exactly what decimal(15,2) holds; dates are
  ``YYYY-MM-DD``; timestamps ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z``. Empty is missing.
- A rejected row carries the reason of its first failing check, e.g.
  ``not valid UTF-8``, ``not valid JSON``, ``missing o_orderkey``,
  ``o_totalprice is not a decimal: 'abc'``,
  ``lineitem 2: l_quantity is not a decimal: 'x'``.
- Fields the contract does not define are ignored (unless silver's ``evolve``
  policy keeps order fields): unknown JSON keys, and CSV fields past the
  contract's columns, provided the contract's fields of the line are valid
  (else the line is ``malformed CSV line``).
- The state of an order is its event with the greatest ``(event_time,
  event_id)``; of a customer its change with the greatest ``updated_at``
  (ties: the greater source file name). Deletes remove the row.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    ArrayType,
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

from medallion_assets.contract import ORDER_EVENT_FIELDS, REFERENCE_TABLES, TPCH_SCHEMAS


def _spark_schema(table: str) -> StructType:
    return from_arrow_schema(TPCH_SCHEMAS[table], prefer_timestamp_ntz=False)


#: TPC-H ``orders`` as silver stores it.
ORDERS_SCHEMA = _spark_schema("orders")

#: TPC-H ``lineitem`` as silver stores it.
LINEITEM_SCHEMA = _spark_schema("lineitem")

#: TPC-H ``customer`` as silver stores it (``c_phone``/``c_address`` masked).
CUSTOMER_SCHEMA = _spark_schema("customer")

#: The reference tables' contract schemas.
REFERENCE_SCHEMAS: dict[str, StructType] = {table: _spark_schema(table) for table in REFERENCE_TABLES}

#: A line item inside an order event (its order key is the event's).
EVENT_LINEITEM_SCHEMA = StructType([field for field in LINEITEM_SCHEMA.fields if field.name != "l_orderkey"])

#: ``parse_order_events``'s typed events.
ORDER_EVENTS_SCHEMA = StructType(
    [
        StructField("event_id", StringType(), True),
        StructField("event_time", TimestampType(), True),
        StructField("op", StringType(), True),
        *ORDERS_SCHEMA.fields,
        StructField("lineitems", ArrayType(EVENT_LINEITEM_SCHEMA, True), True),
        StructField("_source_file", StringType(), True),
        StructField("_ingested_at", TimestampType(), True),
    ]
)


@dataclass(frozen=True)
class KeptOrderFields:
    """Fields of order events the landing contract does not define, kept as text columns.

    Silver's ``evolve`` drift policy fills this from :func:`drifted_order_fields`;
    the default keeps none, so unknown fields are ignored.

    Attributes:
        order: Extra ``order`` fields; they become columns of ``silver.orders``.
        lineitem: Extra line item fields; they become columns of ``silver.lineitem``.
    """

    order: tuple[str, ...] = ()
    lineitem: tuple[str, ...] = ()


def _with_text_fields(schema: StructType, names: Sequence[str]) -> StructType:
    return StructType([*schema.fields, *(StructField(name, StringType(), True) for name in names)])


def order_events_schema(kept: KeptOrderFields = KeptOrderFields()) -> StructType:
    """:data:`ORDER_EVENTS_SCHEMA` with the kept extra fields as string columns."""
    if not kept.order and not kept.lineitem:
        return ORDER_EVENTS_SCHEMA
    fields = ORDER_EVENTS_SCHEMA.fields
    lineitems_at = ORDER_EVENTS_SCHEMA.fieldNames().index("lineitems")
    items = StructField("lineitems", ArrayType(_with_text_fields(EVENT_LINEITEM_SCHEMA, kept.lineitem), True), True)
    extra = [StructField(name, StringType(), True) for name in kept.order]
    return StructType([*fields[:lineitems_at], *extra, items, *fields[lineitems_at + 1:]])


_ORDER_COLUMNS = ORDERS_SCHEMA.fieldNames()
_CUSTOMER_COLUMNS = CUSTOMER_SCHEMA.fieldNames()

#: The top-level fields of an order event line.
ORDER_ENVELOPE_FIELDS = ORDER_EVENT_FIELDS["event"]


def _as_text(names: Iterable[str]) -> StructType:
    return StructType([StructField(name, StringType(), True) for name in names])


# Every leaf is read as a string: Spark then keeps a number's literal text,
# and nested values (``order``, ``lineitems``) their raw JSON, which lets each
# level be validated with its own reason.
_ENVELOPE_TEXT_SCHEMA = _as_text([*ORDER_ENVELOPE_FIELDS, "_corrupt_record"])
# from_json fills the corrupt-record field for text that is not a JSON object,
# so well-formed lines are parsed once only.
_ENVELOPE_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt_record"}

_INTEGER_PATTERN = r"^-?[0-9]+$"
_DECIMAL_PATTERN = r"^-?[0-9]{1,13}(\.[0-9]{1,2})?$"
_DATE_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_TIMESTAMP_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$"


def _validated(text: Column, name: str, kind: DataType, prefix: Column | None = None) -> tuple[Column, Column]:
    """Validate one text value against its column type.

    Args:
        text: The value's text (null when missing).
        name: The column name, used in the reason.
        kind: The target type.
        prefix: Prepended to the reason (``lineitem <n>: ``), if given.

    Returns:
        (reason: null when valid, typed value: null when invalid or missing).
    """
    lead = prefix if prefix is not None else F.lit("")

    def message(text_after: str, with_value: bool = True) -> Column:
        parts = [lead, F.lit(f"{name}{text_after}")]
        if with_value:
            parts += [text, F.lit("'")]
        return F.concat(*parts)

    missing = text.isNull() | (text == F.lit(""))
    if isinstance(kind, StringType):
        return F.when(missing, F.concat(lead, F.lit(f"missing {name}"))), text
    if isinstance(kind, (LongType, IntegerType)):
        converted = F.when(text.rlike(_INTEGER_PATTERN), text.try_cast(kind))
        wrong = message(" is not an integer: '")
    elif isinstance(kind, DecimalType):
        converted = F.when(text.rlike(_DECIMAL_PATTERN), text.try_cast(kind))
        wrong = message(" is not a decimal: '")
    elif isinstance(kind, DateType):
        converted = F.when(text.rlike(_DATE_PATTERN), text.try_cast(kind))
        wrong = message(" is not a date: '")
    elif isinstance(kind, TimestampType):
        converted = F.when(text.rlike(_TIMESTAMP_PATTERN), text.try_cast(kind))
        wrong = message(" is not a timestamp: '")
    else:
        raise TypeError(f"no validation for {kind}")
    reason = F.when(missing, F.concat(lead, F.lit(f"missing {name}"))).when(converted.isNull(), wrong)
    return reason, converted


#: The reason of a line that held bytes that are not UTF-8.
NOT_VALID_UTF8 = "not valid UTF-8"

#: What bronze turns bytes that are not UTF-8 into (U+FFFD REPLACEMENT CHARACTER).
REPLACEMENT_CHARACTER = "\ufffd"


def _not_valid_utf8(text: Column) -> Column:
    """Whether bronze's text shows bytes that were not UTF-8.

    True for text holding U+FFFD (what bronze replaces them with, or a
    literal one: see the module's rules) and for text that is still not valid
    UTF-8 (bronze rows written before bronze replaced the bytes).
    """
    return ~F.is_valid_utf8(text) | text.contains(REPLACEMENT_CHARACTER)


def _not_json_object(text: Column) -> Column:
    # from_json gives all-null fields for a JSON scalar or array, so the
    # object check looks at the text itself.
    return ~F.ltrim(text).startswith("{")


def order_lines(orders_raw: DataFrame, orders_kafka: DataFrame) -> DataFrame:
    """Order event lines from both bronze sources, in ``bronze.orders_raw``'s shape.

    A Kafka message's origin goes where a landed line's file goes, as
    ``kafka://<topic>/<partition>/<offset>``, so a rejected message is
    quarantined with its partition and offset and everything after this
    treats both sources alike.

    Args:
        orders_raw: ``value``, ``_source_file``, ``_ingested_at`` (landed files).
        orders_kafka: ``value``, ``topic``, ``partition``, ``offset``, ``_ingested_at`` (Kafka).

    Returns:
        ``value``, ``_source_file``, ``_ingested_at``: the rows of both.
    """
    origin = F.concat(
        F.lit("kafka://"), F.col("topic"), F.lit("/"), F.col("partition").cast("string"),
        F.lit("/"), F.col("offset").cast("string"),
    )
    from_kafka = orders_kafka.select("value", origin.alias("_source_file"), "_ingested_at")
    return orders_raw.select("value", "_source_file", "_ingested_at").unionByName(from_kafka)


def parse_order_events(
    orders_raw: DataFrame, kept: KeptOrderFields = KeptOrderFields()
) -> tuple[DataFrame, DataFrame]:
    """Split ``bronze.orders_raw`` into typed order events and rejects.

    Args:
        orders_raw: Columns ``value`` (one NDJSON line), ``_source_file``,
            ``_ingested_at``.
        kept: Fields the contract does not define that are kept (as their
            JSON text, null when absent); any other unknown field is ignored.

    Returns:
        ``(events, rejects)``: events with :func:`order_events_schema`
        (order columns null for deletes, except ``o_orderkey``); rejects with
        ``value``, ``_source_file``, ``_ingested_at`` and ``reason``.
    """
    events_schema = order_events_schema(kept)
    envelope = F.from_json("value", _ENVELOPE_TEXT_SCHEMA, _ENVELOPE_OPTIONS)
    order = F.from_json(F.col("_envelope.order"), _as_text([*_ORDER_COLUMNS, *kept.order, "lineitems"]))
    item_text = _as_text([*EVENT_LINEITEM_SCHEMA.fieldNames(), *kept.lineitem])
    lineitems = F.from_json(F.col("_order.lineitems"), ArrayType(item_text, True))
    parsed = (
        orders_raw.select("value", "_source_file", "_ingested_at", envelope.alias("_envelope"))
        .select("*", order.alias("_order"))
        .select("*", lineitems.alias("_lineitems"))
    )

    event_id_reason, _ = _validated(F.col("_envelope.event_id"), "event_id", StringType())
    event_time_reason, event_time = _validated(F.col("_envelope.event_time"), "event_time", TimestampType())
    op = F.col("_envelope.op")
    op_reason = F.when(op.isNull() | (op == ""), F.lit("missing op")).when(
        ~op.isin("upsert", "delete"), F.concat(F.lit("op is not upsert or delete: '"), op, F.lit("'"))
    )
    order_text = F.col("_envelope.order")
    order_reason = F.when(order_text.isNull(), F.lit("missing order")).when(
        _not_json_object(order_text), F.lit("order is not a JSON object")
    )

    order_reasons, typed_order = [], []
    for field in ORDERS_SCHEMA.fields:
        reason, typed = _validated(F.col(f"_order.{field.name}"), field.name, field.dataType)
        order_reasons.append(reason)
        typed_order.append(typed.alias(field.name))
    orderkey_reason, upsert_reasons = order_reasons[0], order_reasons[1:]

    items_text = F.col("_order.lineitems")
    items = F.col("_lineitems")
    items_reason = F.when(items_text.isNull(), F.lit("missing lineitems")).when(
        ~F.ltrim(items_text).startswith("[") | items.isNull() | F.exists(items, lambda item: item.isNull()),
        F.lit("lineitems is not an array of objects"),
    )

    def item_reason(item: Column, index: Column) -> Column:
        prefix = F.concat(F.lit("lineitem "), (index + 1).cast("string"), F.lit(": "))
        return F.coalesce(
            *(_validated(item[f.name], f.name, f.dataType, prefix)[0] for f in EVENT_LINEITEM_SCHEMA.fields)
        )

    def typed_item(item: Column) -> Column:
        return F.struct(
            *(_validated(item[f.name], f.name, f.dataType)[1].alias(f.name) for f in EVENT_LINEITEM_SCHEMA.fields),
            *(item[name].alias(name) for name in kept.lineitem),
        )

    first_item_reason = F.try_element_at(
        F.filter(F.transform(items, item_reason), lambda reason: reason.isNotNull()), F.lit(1)
    )
    is_upsert = op == F.lit("upsert")
    reason = F.coalesce(
        F.when(_not_valid_utf8(F.col("value")), F.lit(NOT_VALID_UTF8)),
        # Only lines that are not a JSON object pay for the second parse that
        # tells invalid JSON from a JSON scalar or array.
        F.when(
            F.col("_envelope").isNull() | F.col("_envelope._corrupt_record").isNotNull(),
            F.when(F.try_parse_json("value").isNull(), F.lit("not valid JSON")).otherwise(F.lit("not a JSON object")),
        ),
        event_id_reason,
        event_time_reason,
        op_reason,
        order_reason,
        orderkey_reason,
        *(F.when(is_upsert, upsert_reason) for upsert_reason in upsert_reasons),
        F.when(is_upsert, items_reason),
        F.when(is_upsert, first_item_reason),
    )
    judged = parsed.select(
        "*",
        reason.alias("reason"),
        event_time.alias("_event_time"),
        *(typed.alias(f"_typed_{name}") for typed, name in zip(typed_order, _ORDER_COLUMNS)),
        F.transform(items, typed_item).alias("_typed_lineitems"),
    )

    def upsert_only(column: Column) -> Column:
        return F.when(F.col("op") == F.lit("upsert"), column)

    events = judged.where(F.col("reason").isNull()).select(
        F.col("_envelope.event_id").alias("event_id"),
        F.col("_event_time").alias("event_time"),
        F.col("_envelope.op").alias("op"),
        F.col("_typed_o_orderkey").alias("o_orderkey"),
        *(F.col(f"_typed_{name}").alias(name) for name in _ORDER_COLUMNS[1:]),
        *(F.col(f"_order.{name}").alias(name) for name in kept.order),
        F.col("_typed_lineitems").alias("lineitems"),
        "_source_file",
        "_ingested_at",
    )
    # A delete carries only its key; whatever else it holds is not state.
    deletes_blanked = {name: upsert_only(F.col(name)) for name in [*_ORDER_COLUMNS[1:], *kept.order, "lineitems"]}
    events = events.select(
        *(
            deletes_blanked.get(field.name, F.col(field.name)).cast(field.dataType).alias(field.name)
            for field in events_schema.fields
        )
    )
    rejects = judged.where(F.col("reason").isNotNull()).select(
        F.make_valid_utf8("value").alias("value"), "_source_file", "_ingested_at", "reason"
    )
    return events, rejects


# A kept field becomes a column: a plain identifier, never an internal ``_`` name.
_COLUMN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")


def drifted_order_fields(orders_raw: DataFrame) -> DataFrame:
    """The fields of order event lines that the landing contract does not define.

    The rule is the contract's (:data:`~medallion_assets.contract.ORDER_EVENT_FIELDS`,
    also applied line by line by :func:`~medallion_assets.contract.unknown_order_fields`).

    Args:
        orders_raw: Column ``value`` (one NDJSON line); lines that are not JSON
            objects, and lines rejected as ``not valid UTF-8``, carry no fields.

    Returns:
        One row per field: ``level`` (``event``, ``order`` or ``lineitem``),
        ``field``, and ``rows`` (the lines that carry it).
    """
    empty = F.array().cast("array<string>")

    def unknown(keys: Column, known: Sequence[str], level: str) -> Column:
        keys = F.coalesce(keys, empty)
        return F.transform(
            F.filter(keys, lambda key: ~key.isin(*known)),
            lambda key: F.struct(F.lit(level).alias("level"), key.alias("field")),
        )

    envelope = F.from_json("value", "map<string,string>")
    order = F.from_json(envelope["order"], "map<string,string>")
    items = F.from_json(order["lineitems"], "array<map<string,string>>")
    item_keys = F.flatten(F.transform(F.coalesce(items, F.array().cast("array<map<string,string>>")),
                                      lambda item: F.coalesce(F.map_keys(item), empty)))
    per_line = F.array_distinct(
        F.concat(
            unknown(F.map_keys(envelope), ORDER_EVENT_FIELDS["event"], "event"),
            unknown(F.map_keys(order), ORDER_EVENT_FIELDS["order"], "order"),
            unknown(item_keys, ORDER_EVENT_FIELDS["lineitem"], "lineitem"),
        )
    )
    return (
        orders_raw.where(~_not_valid_utf8(F.col("value")))
        .select(F.explode(per_line).alias("_field"))
        .groupBy(F.col("_field.level").alias("level"), F.col("_field.field").alias("field"))
        .agg(F.count(F.lit(1)).alias("rows"))
    )


def keep_order_fields(drifted: Iterable[tuple[str, str]]) -> tuple[KeptOrderFields, list[str]]:
    """Which drifted ``(level, field)`` pairs the ``evolve`` policy turns into columns.

    ``order`` and ``lineitem`` fields are kept when the name is a plain
    identifier that differs (ignoring case, as Spark and Delta compare column
    names) from every contract column and every other kept field. Envelope
    (``event``) fields describe the delivery, not the order, and are never kept.

    Returns:
        ``(kept, skipped)``; ``skipped`` names each field left out as ``level.field``.
    """
    taken = {
        "order": {name.lower() for name in [*_ORDER_COLUMNS, "lineitems"]},
        "lineitem": {name.lower() for name in LINEITEM_SCHEMA.fieldNames()},
    }
    kept: dict[str, list[str]] = {"order": [], "lineitem": []}
    skipped = []
    for level, field in sorted(set(drifted)):
        if level in kept and _COLUMN_NAME.match(field) and field.lower() not in taken[level]:
            kept[level].append(field)
            taken[level].add(field.lower())
        else:
            skipped.append(f"{level}.{field}")
    return KeptOrderFields(order=tuple(kept["order"]), lineitem=tuple(kept["lineitem"])), skipped


def deduplicate_events(events: DataFrame) -> DataFrame:
    """One row per ``event_id`` (delivery is at least once).

    Copies of an event are identical, so which copy survives does not matter.
    """
    return events.dropDuplicates(["event_id"])


def latest_order_changes(events: DataFrame) -> DataFrame:
    """The winning event of each order among ``events``.

    Meant for an incremental MERGE into silver: match on ``o_orderkey``,
    replace when the incoming ``(event_time, event_id)`` is greater, delete
    when the winner's ``op`` is ``delete``. Copies of one event collapse here
    too, since they carry the same ``(event_time, event_id)``.

    Args:
        events: Typed events from :func:`parse_order_events`.

    Returns:
        One row per ``o_orderkey`` with the columns of ``events`` except the
        ingestion columns.
    """
    payload = [c for c in events.columns if c not in ("o_orderkey", "_source_file", "_ingested_at")]
    winners = events.groupBy("o_orderkey").agg(
        F.max_by(F.struct(*payload), F.struct("event_time", "event_id")).alias("_winner")
    )
    ordered = [c for c in events.columns if c not in ("_source_file", "_ingested_at")]
    return winners.select(*(c if c == "o_orderkey" else F.col(f"_winner.{c}").alias(c) for c in ordered))


def order_rows(order_changes: DataFrame, kept: KeptOrderFields = KeptOrderFields()) -> DataFrame:
    """The ``orders`` rows of upsert events: the TPC-H columns, then the kept extra fields."""
    schema = _with_text_fields(ORDERS_SCHEMA, kept.order)
    return order_changes.where(F.col("op") == F.lit("upsert")).select(
        *(F.col(field.name).cast(field.dataType).alias(field.name) for field in schema.fields)
    )


def lineitem_rows(order_changes: DataFrame, kept: KeptOrderFields = KeptOrderFields()) -> DataFrame:
    """The ``lineitem`` rows of upsert events, one per line item, kept extra fields last."""
    schema = _with_text_fields(LINEITEM_SCHEMA, kept.lineitem)
    exploded = order_changes.where(F.col("op") == F.lit("upsert")).select(
        F.col("o_orderkey").alias("l_orderkey"), F.explode("lineitems").alias("_item")
    )
    return exploded.select(
        *(
            (F.col("l_orderkey") if field.name == "l_orderkey" else F.col(f"_item.{field.name}"))
            .cast(field.dataType)
            .alias(field.name)
            for field in schema.fields
        )
    )


def latest_order_state(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """The ``orders`` and ``lineitem`` silver tables from all events at once.

    Args:
        events: Typed events from :func:`parse_order_events`.

    Returns:
        ``(orders, lineitem)`` with :data:`ORDERS_SCHEMA` and
        :data:`LINEITEM_SCHEMA`; deleted orders are absent.
    """
    winners = latest_order_changes(events)
    return order_rows(winners), lineitem_rows(winners)


def parse_customer_changes(customers_cdc: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Split ``bronze.customers_cdc`` into typed changes and rejects.

    Args:
        customers_cdc: The CSV columns as strings, ``_corrupt_record``,
            ``_source_file``, ``_ingested_at``.

    Returns:
        ``(changes, rejects)``. Changes: ``op``, the customer columns typed
        (null for ``D`` except the key), ``updated_at`` timestamp,
        ``_source_file``, ``_ingested_at``. Rejects: ``value`` (the raw line
        when Spark kept it, else the fields re-joined as CSV),
        ``_source_file``, ``_ingested_at``, ``reason``.
    """
    op = F.col("op")
    op_reason = F.when(op.isNull() | (op == ""), F.lit("missing op")).when(
        ~op.isin("I", "U", "D"), F.concat(F.lit("op is not I, U or D: '"), op, F.lit("'"))
    )
    checked = {field.name: _validated(F.col(field.name), field.name, field.dataType) for field in CUSTOMER_SCHEMA.fields}
    updated_at_reason, updated_at = _validated(F.col("updated_at"), "updated_at", TimestampType())
    is_change = op.isin("I", "U")
    # Every field of the line, the ones past the contract's too (kept whole in
    # _corrupt_record), joined by an ASCII separator so no two fields' bytes
    # can join into a valid character.
    raw_fields = ["op", *_CUSTOMER_COLUMNS, "updated_at"]
    line_text = F.concat_ws(",", *raw_fields, "_corrupt_record")
    field_reason = F.coalesce(
        op_reason,
        checked["c_custkey"][0],
        updated_at_reason,
        *(F.when(is_change, checked[name][0]) for name in _CUSTOMER_COLUMNS[1:]),
    )
    # Spark keeps a line whose field count is off in _corrupt_record. With too
    # few fields some contract field is missing; with more, the contract's
    # fields come first and the extra ones are columns the contract does not
    # know (schema drift), which silver ignores as it does unknown JSON fields.
    reason = (
        F.when(_not_valid_utf8(line_text), F.lit(NOT_VALID_UTF8))
        .when(F.col("_corrupt_record").isNotNull() & field_reason.isNotNull(), F.lit("malformed CSV line"))
        .otherwise(field_reason)
    )
    judged = customers_cdc.select(
        "*",
        reason.alias("reason"),
        updated_at.alias("_typed_updated_at"),
        *(checked[name][1].alias(f"_typed_{name}") for name in _CUSTOMER_COLUMNS),
    )
    changes = judged.where(F.col("reason").isNull()).select(
        "op",
        F.col("_typed_c_custkey").alias("c_custkey"),
        *(F.when(is_change, F.col(f"_typed_{name}")).alias(name) for name in _CUSTOMER_COLUMNS[1:]),
        F.col("_typed_updated_at").alias("updated_at"),
        "_source_file",
        "_ingested_at",
    )
    rejects = judged.where(F.col("reason").isNotNull()).select(
        F.make_valid_utf8(F.coalesce(F.col("_corrupt_record"), F.to_csv(F.struct(*raw_fields)))).alias("value"),
        "_source_file",
        "_ingested_at",
        "reason",
    )
    return changes, rejects


def latest_customer_changes(changes: DataFrame) -> DataFrame:
    """The winning change of each customer: greatest ``updated_at``.

    Ties on ``updated_at`` go to the greater ``_source_file`` (later file).
    For an incremental MERGE: match on ``c_custkey``, replace when the
    incoming ``updated_at`` is greater, delete when ``op`` is ``D``.

    Returns:
        One row per ``c_custkey``: ``op``, ``updated_at`` and the customer
        columns.
    """
    payload = ["op", "updated_at", *_CUSTOMER_COLUMNS[1:]]
    winners = changes.groupBy("c_custkey").agg(
        F.max_by(F.struct(*payload), F.struct("updated_at", "_source_file")).alias("_winner")
    )
    return winners.select(
        "c_custkey",
        F.col("_winner.op").alias("op"),
        F.col("_winner.updated_at").alias("updated_at"),
        *(F.col(f"_winner.{name}").alias(name) for name in _CUSTOMER_COLUMNS[1:]),
    )


def customer_rows(customer_changes: DataFrame) -> DataFrame:
    """The ``customer`` rows (unmasked) of the changes that are not deletes."""
    return customer_changes.where(F.col("op") != F.lit("D")).select(
        *(F.col(field.name).cast(field.dataType).alias(field.name) for field in CUSTOMER_SCHEMA.fields)
    )


def latest_customer_state(changes: DataFrame) -> DataFrame:
    """The unmasked ``customer`` table from all changes at once."""
    return customer_rows(latest_customer_changes(changes))


def mask_customer_pii(customers: DataFrame) -> DataFrame:
    """Mask the personal columns, deterministically so joins still work.

    - ``c_phone``: the country code (first three characters, ``NN-``) stays,
      every later digit becomes ``*``: ``25-989-741-2988`` -> ``25-***-***-****``.
    - ``c_address``: the hex SHA-256 of its UTF-8 bytes.

    Args:
        customers: Any DataFrame with ``c_phone`` and ``c_address``.

    Returns:
        The same columns in the same order, those two masked.
    """
    phone = F.col("c_phone")
    masked = {
        "c_phone": F.concat(
            phone.substr(F.lit(1), F.lit(3)),
            F.regexp_replace(phone.substr(F.lit(4), F.greatest(F.length(phone), F.lit(1))), r"[0-9]", "*"),
        ),
        "c_address": F.sha2(F.col("c_address"), 256),
    }
    return customers.select(
        *(masked[name].alias(name) if name in masked else F.col(name) for name in customers.columns)
    )


def customer_history_rows(changes: DataFrame) -> DataFrame:
    """Type-2 history of customers: one row per distinct change.

    Each change is valid from its ``updated_at`` until the next change of the
    same customer; the last one is current. A delete is kept as a row with
    ``is_deleted`` so the history shows when the customer went away.

    Args:
        changes: Typed changes from :func:`parse_customer_changes`.

    Returns:
        ``c_custkey``, the other customer columns, ``valid_from``,
        ``valid_to`` (null while current), ``is_current``, ``is_deleted``.
    """
    distinct = changes.dropDuplicates(["c_custkey", "updated_at", "op", *_CUSTOMER_COLUMNS[1:]])
    by_customer = Window.partitionBy("c_custkey").orderBy("updated_at", "_source_file", "op")
    valid_to = F.lead("updated_at").over(by_customer)
    return distinct.select(
        *(F.col(field.name).cast(field.dataType).alias(field.name) for field in CUSTOMER_SCHEMA.fields),
        F.col("updated_at").alias("valid_from"),
        valid_to.alias("valid_to"),
        valid_to.isNull().alias("is_current"),
        (F.col("op") == F.lit("D")).alias("is_deleted"),
    )


def conform_reference(snapshot: DataFrame, table_name: str) -> DataFrame:
    """A reference snapshot with exactly the contract's columns and types.

    Args:
        snapshot: The newest snapshot file of the table, as read.
        table_name: One of ``nation``, ``region``, ``part``, ``supplier``,
            ``partsupp``.

    Returns:
        The snapshot's columns cast to :data:`REFERENCE_SCHEMAS`'s types.

    Raises:
        KeyError: For a table that is not a reference table.
    """
    schema = REFERENCE_SCHEMAS[table_name]
    return snapshot.select(*(F.col(field.name).cast(field.dataType).alias(field.name) for field in schema.fields))
