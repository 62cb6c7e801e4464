"""TPC-H's silver transforms: order events with their line items, and the customers' named helpers.

Built from the building blocks of :mod:`medallion_assets.transforms.silver`,
whose rules (encoding first, values read by their text, the first failing
check's reason, unknown fields ignored) apply here too; what is TPC-H's own is
the shape of an order event, an envelope with an ``order`` object holding a
``lineitems`` array, each level validated with its own reason:

- e.g. ``missing o_orderkey``, ``o_totalprice is not a decimal: 'abc'``,
  ``order is not a JSON object``, ``lineitem 2: l_quantity is not a decimal: 'x'``;
- fields the contract does not define are ignored unless silver's ``evolve``
  policy keeps order fields (:func:`keep_order_fields`);
- the state of an order is its event with the greatest ``(event_time,
  event_id)``; a delete removes the order and its line items.

``medallion_assets_tests/support/contract_reference`` implements the same rules
independently. Customers go through the generic change-feed steps; the
named helpers at the end apply them to the ``customers_cdc`` declaration.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from medallion_assets.feeds import LandingFiles
from medallion_assets.pipelines.tpch.contract import ORDER_EVENT_FIELDS, REFERENCE_TABLES, TPCH_SCHEMAS
from medallion_assets.pipelines.tpch.feeds import CUSTOMERS_CDC, REFERENCE_FEEDS
from medallion_assets.transforms.bronze import bronze_schema, csv_options, csv_read_schema, csv_records
from medallion_assets.transforms.silver import (
    JSON_OPTIONS,
    NOT_VALID_UTF8,
    adopted_in_one_run,
    conform_snapshot,
    history_rows,
    invalid_reason,
    is_present_and_valid,
    kafka_lines,
    latest_changes,
    mask_pii,
    not_a_json_object_reason,
    not_json_object,
    not_valid_utf8,
    parse_changes,
    rejected_changes,
    text_schema,
    typed_value,
    validated,
)


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
    return StructType([*fields[:lineitems_at], *extra, items, *fields[lineitems_at + 1 :]])


_ORDER_COLUMNS = ORDERS_SCHEMA.fieldNames()

#: The top-level fields of an order event line.
ORDER_ENVELOPE_FIELDS = ORDER_EVENT_FIELDS["event"]


# Every leaf is read as a string: Spark then keeps a number's literal text,
# and nested values (``order``, ``lineitems``) their raw JSON, which lets each
# level be validated with its own reason.
_ENVELOPE_TEXT_SCHEMA = text_schema([*ORDER_ENVELOPE_FIELDS, "_corrupt_record"])


# from_json fills the corrupt-record field for text that is not a JSON object,
# so well-formed lines are parsed once only.
def order_lines(orders_raw: DataFrame, orders_kafka: DataFrame | None = None) -> DataFrame:
    """Order event lines from both bronze sources, in ``bronze.orders_raw``'s shape.

    A Kafka message's origin goes where a landed line's file goes, as
    ``kafka://<topic>/<partition>/<offset>``, so a rejected message is
    quarantined with its partition and offset and everything after this
    treats both sources alike.

    Args:
        orders_raw: ``value``, ``_source_file``, ``_ingested_at`` (landed files).
        orders_kafka: ``value``, ``topic``, ``partition``, ``offset``, ``_ingested_at`` (Kafka);
            ``None`` where the deployment has no Kafka feed.

    Returns:
        ``value``, ``_source_file``, ``_ingested_at``: the rows of both.
    """
    landed = orders_raw.select("value", "_source_file", "_ingested_at")
    return landed if orders_kafka is None else landed.unionByName(kafka_lines(orders_kafka))


def parse_order_events(orders_raw: DataFrame, kept: KeptOrderFields = KeptOrderFields()) -> tuple[DataFrame, DataFrame]:
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
        Both read every line; to parse once, cache :func:`judge_order_lines`
        and take :func:`order_events` and
        :func:`~medallion_assets.transforms.silver.rejected_changes` of it.
    """
    judged = judge_order_lines(orders_raw, kept)
    return order_events(judged, kept), rejected_changes(judged)


def judge_order_lines(orders_raw: DataFrame, kept: KeptOrderFields = KeptOrderFields()) -> DataFrame:
    """Every order event line parsed once: its reject reason, or its typed event.

    Args:
        orders_raw: as :func:`parse_order_events` takes it.
        kept: as :func:`parse_order_events` takes it.

    Returns:
        One row per line: ``_reject_reason`` (null for a good line),
        ``_rejected_value`` (the line made valid UTF-8, for rejects only; as
        :func:`~medallion_assets.transforms.silver.judge_changes` names them), the event's typed columns
        (``_typed_*``, ``_event_time``, ``_event_id``, ``_op``, kept fields
        as ``_kept_*``), ``_source_file`` and ``_ingested_at``. What
        :func:`order_events` and
        :func:`~medallion_assets.transforms.silver.rejected_changes` select.
    """
    envelope = F.from_json("value", _ENVELOPE_TEXT_SCHEMA, JSON_OPTIONS)
    order = F.from_json(F.col("_envelope.order"), text_schema([*_ORDER_COLUMNS, *kept.order, "lineitems"]))
    item_text = text_schema([*EVENT_LINEITEM_SCHEMA.fieldNames(), *kept.lineitem])
    lineitems = F.from_json(F.col("_order.lineitems"), ArrayType(item_text, True))

    def typed_item(item: Column) -> Column:
        return F.struct(
            *(typed_value(item[f.name], f.dataType).alias(f.name) for f in EVENT_LINEITEM_SCHEMA.fields),
            *(item[name].alias(name) for name in kept.lineitem),
        )

    # Each line item field's pattern and cast run once, in their own projection: the
    # reasons below read the typed items (a lambda would compute them again per use).
    parsed = (
        orders_raw.select("value", "_source_file", "_ingested_at", envelope.alias("_envelope"))
        .select("*", order.alias("_order"))
        .select("*", lineitems.alias("_lineitems"))
        .select("*", F.transform("_lineitems", typed_item).alias("_typed_items"))
    )

    event_id_reason, _ = validated(F.col("_envelope.event_id"), "event_id", StringType())
    event_time_reason, event_time = validated(F.col("_envelope.event_time"), "event_time", TimestampType())
    op = F.col("_envelope.op")
    op_reason = F.when(op.isNull() | (op == ""), F.lit("missing op")).when(
        ~op.isin("upsert", "delete"), F.concat(F.lit("op is not upsert or delete: '"), op, F.lit("'"))
    )
    order_text = F.col("_envelope.order")
    order_reason = F.when(order_text.isNull(), F.lit("missing order")).when(
        not_json_object(order_text), F.lit("order is not a JSON object")
    )

    order_reasons, typed_order = [], []
    for field in ORDERS_SCHEMA.fields:
        reason, typed = validated(F.col(f"_order.{field.name}"), field.name, field.dataType)
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
        text, typed = item["_lineitems"], item["_typed_items"]
        return F.coalesce(
            *(
                invalid_reason(text[f.name], typed[f.name], f.name, f.dataType, prefix)
                for f in EVENT_LINEITEM_SCHEMA.fields
            )
        )

    def item_is_valid(typed: Column) -> Column:
        valid = F.lit(True)
        for f in EVENT_LINEITEM_SCHEMA.fields:
            valid = valid & is_present_and_valid(typed[f.name], f.dataType)
        return valid

    # The reasons are built only for a line with a bad item: per item and field, in a lambda
    # Spark evaluates without code generation, they cost more than the check that finds one.
    first_item_reason = F.when(
        F.exists("_typed_items", lambda typed: ~item_is_valid(typed)),
        F.try_element_at(
            F.filter(
                F.transform(F.arrays_zip("_lineitems", "_typed_items"), item_reason), lambda reason: reason.isNotNull()
            ),
            F.lit(1),
        ),
    )
    is_upsert = op == F.lit("upsert")
    reason = F.coalesce(
        F.when(not_valid_utf8(F.col("value")), F.lit(NOT_VALID_UTF8)),
        not_a_json_object_reason(F.col("value"), F.col("_envelope")),
        event_id_reason,
        event_time_reason,
        op_reason,
        order_reason,
        orderkey_reason,
        *(F.when(is_upsert, upsert_reason) for upsert_reason in upsert_reasons),
        F.when(is_upsert, items_reason),
        F.when(is_upsert, first_item_reason),
    )
    return parsed.select("*", reason.alias("_reject_reason"), event_time.alias("_typed_event_time")).select(
        "_reject_reason",
        # The raw text of a rejected line only: a cache of this frame then holds about
        # what the events hold, not every line twice.
        F.when(F.col("_reject_reason").isNotNull(), F.make_valid_utf8("value")).alias("_rejected_value"),
        F.col("_envelope.event_id").alias("_event_id"),
        F.col("_typed_event_time").alias("_event_time"),
        F.col("_envelope.op").alias("_op"),
        *(typed.alias(f"_typed_{name}") for typed, name in zip(typed_order, _ORDER_COLUMNS, strict=False)),
        *(F.col(f"_order.{name}").alias(f"_kept_{name}") for name in kept.order),
        F.col("_typed_items").alias("_typed_lineitems"),
        "_source_file",
        "_ingested_at",
    )


def order_events(judged: DataFrame, kept: KeptOrderFields = KeptOrderFields()) -> DataFrame:
    """The typed events of the good lines of :func:`judge_order_lines` (:func:`order_events_schema`)."""
    events_schema = order_events_schema(kept)

    def upsert_only(column: Column) -> Column:
        return F.when(F.col("op") == F.lit("upsert"), column)

    events = judged.where(F.col("_reject_reason").isNull()).select(
        F.col("_event_id").alias("event_id"),
        F.col("_event_time").alias("event_time"),
        F.col("_op").alias("op"),
        F.col("_typed_o_orderkey").alias("o_orderkey"),
        *(F.col(f"_typed_{name}").alias(name) for name in _ORDER_COLUMNS[1:]),
        *(F.col(f"_kept_{name}").alias(name) for name in kept.order),
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
    return events


# A kept field becomes a column: a plain identifier, never an internal ``_`` name.
_COLUMN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,127}$")


def undeclared_order_fields(value: Column) -> Column:
    """The fields of one order event line that the landing contract does not define.

    The rule is the contract's (:data:`~medallion_assets.pipelines.tpch.contract.ORDER_EVENT_FIELDS`,
    also applied line by line by :func:`~medallion_assets.pipelines.tpch.contract.unknown_order_fields`).

    Args:
        value: one NDJSON line; a line that is not a JSON object, or is
            rejected as ``not valid UTF-8``, carries no fields.

    Returns:
        ``array<struct<level, field>>``, ``level`` being ``event``, ``order`` or
        ``lineitem``, each pair once; null for a line rejected as not valid UTF-8.
    """
    empty = F.array().cast("array<string>")

    def unknown(keys: Column, known: Sequence[str], level: str) -> Column:
        keys = F.coalesce(keys, empty)
        return F.transform(
            F.filter(keys, lambda key: ~key.isin(*known)),
            lambda key: F.struct(F.lit(level).alias("level"), key.alias("field")),
        )

    envelope = F.from_json(value, "map<string,string>")
    order = F.from_json(envelope["order"], "map<string,string>")
    items = F.from_json(order["lineitems"], "array<map<string,string>>")
    item_keys = F.flatten(
        F.transform(
            F.coalesce(items, F.array().cast("array<map<string,string>>")),
            lambda item: F.coalesce(F.map_keys(item), empty),
        )
    )
    per_line = F.array_distinct(
        F.concat(
            unknown(F.map_keys(envelope), ORDER_EVENT_FIELDS["event"], "event"),
            unknown(F.map_keys(order), ORDER_EVENT_FIELDS["order"], "order"),
            unknown(item_keys, ORDER_EVENT_FIELDS["lineitem"], "lineitem"),
        )
    )
    return F.when(~not_valid_utf8(value), per_line)


def drifted_order_fields(orders_raw: DataFrame) -> DataFrame:
    """The fields of order event lines that the landing contract does not define, with their line counts.

    Args:
        orders_raw: Column ``value`` (one NDJSON line), as :func:`undeclared_order_fields` reads it.

    Returns:
        One row per field: ``level`` (``event``, ``order`` or ``lineitem``),
        ``field``, and ``rows`` (the lines that carry it).
    """
    return (
        orders_raw.select(F.explode(undeclared_order_fields(F.col("value"))).alias("_field"))
        .groupBy(F.col("_field.level").alias("level"), F.col("_field.field").alias("field"))
        .agg(F.count(F.lit(1)).alias("rows"))
    )


def drifted_order_fields_seen(value: Column) -> Column:
    """An aggregate (one that :class:`~pyspark.sql.Observation` can report): every drifted field of the lines, once.

    Lines without drift add nothing; the set holds each distinct combination
    of a line's fields, so its size follows the drift, not the rows.

    Returns:
        ``array<struct<level, field>>``, as :func:`undeclared_order_fields`.
    """
    fields = undeclared_order_fields(value)
    return F.array_distinct(F.flatten(F.collect_set(F.when(F.size(fields) > 0, fields))))


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


# ---- customers: the generic change-feed steps on the customers_cdc declaration ----------------


def parse_customer_changes(customers_cdc: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Split ``bronze.customers_cdc`` into typed changes and rejects.

    As :func:`~medallion_assets.transforms.silver.parse_changes` does.

    Returns:
        ``(changes, rejects)``. Changes: ``op``, the customer columns typed
        (null for ``D`` except the key), ``updated_at``, ``_source_file``,
        ``_ingested_at``. Rejects: ``value``, ``_source_file``, ``_ingested_at``, ``reason``.
    """
    return parse_changes(customers_cdc, CUSTOMERS_CDC)


def latest_customer_changes(changes: DataFrame) -> DataFrame:
    """The winning change of each customer: greatest ``updated_at``, ties to the greater ``_source_file``."""
    return latest_changes(changes, CUSTOMERS_CDC).drop("_source_file", "_sequence", "_deleted")


def customer_rows(customer_changes: DataFrame) -> DataFrame:
    """The ``customer`` rows (unmasked) of the changes that are not deletes."""
    return customer_changes.where(F.col("op") != F.lit("D")).select(
        *(F.col(field.name).cast(field.dataType).alias(field.name) for field in CUSTOMER_SCHEMA.fields)
    )


def latest_customer_state(changes: DataFrame) -> DataFrame:
    """The unmasked ``customer`` table from all changes at once."""
    return customer_rows(latest_customer_changes(changes))


def mask_customer_pii(customers: DataFrame) -> DataFrame:
    """``c_phone`` and ``c_address`` masked as the declaration says.

    By :func:`~medallion_assets.transforms.silver.mask_pii`.
    """
    return mask_pii(customers, CUSTOMERS_CDC)


def customer_history_rows(changes: DataFrame) -> DataFrame:
    """Type-2 history of customers, PII masked, as one run of all ``changes`` leaves it
    (:func:`~medallion_assets.transforms.silver.history_rows`)."""
    return history_rows(changes, CUSTOMERS_CDC, adopted_in_one_run(changes, CUSTOMERS_CDC))


def conform_reference(snapshot: DataFrame, table_name: str) -> DataFrame:
    """A reference snapshot with exactly the contract's columns and types.

    Raises:
        KeyError: For a table that is not a reference table.
    """
    feeds = {feed.name: feed for feed in REFERENCE_FEEDS}
    return conform_snapshot(snapshot, feeds[table_name])


# ---- customers_cdc's bronze shape, by name (its declaration's CSV read schema and options) ----

#: How bronze reads the customer change CSV files.
CUSTOMERS_CSV_READ_SCHEMA = csv_read_schema(CUSTOMERS_CDC)
assert isinstance(CUSTOMERS_CDC.source, LandingFiles), "customers_cdc is declared with landed CSV files"
#: The CSV reader options of those files.
CUSTOMERS_CSV_OPTIONS = csv_options(CUSTOMERS_CDC.source)
#: ``bronze.customers_cdc``'s schema.
CUSTOMERS_CDC_SCHEMA = bronze_schema(CUSTOMERS_CDC)


def customers_cdc(csv_rows: DataFrame) -> DataFrame:
    """``bronze.customers_cdc`` from a CSV source.

    Read with :data:`CUSTOMERS_CSV_READ_SCHEMA` and :data:`CUSTOMERS_CSV_OPTIONS`.
    """
    return csv_records(csv_rows, CUSTOMERS_CSV_READ_SCHEMA, CUSTOMERS_CSV_OPTIONS)
