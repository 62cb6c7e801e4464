"""Schemas between Spark, Arrow and the Delta log.

Delta stores its schema as the JSON form of Spark's ``StructType``, so Spark and
Delta schemas convert through that JSON exactly, nested types included. Arrow
schemas are derived from the Spark one with UTC timestamps and no large types,
because that is what a Python data source must yield to Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import pyarrow as pa
from deltalake import Schema as DeltaSchema
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from medallion_assets.delta.errors import (
    HOW_TO_REWRITE_WHOLE,
    HOW_TO_USE_DELTA_SPARK,
    SchemaMismatchError,
    UnsupportedTypeError,
)

# Spark types with no Delta counterpart (Delta's variant needs a table feature
# delta-rs does not write yet).
_UNSTORABLE = (
    T.NullType,
    T.CalendarIntervalType,
    T.DayTimeIntervalType,
    T.YearMonthIntervalType,
    T.VariantType,
)
_TYPE_FIXES = {
    "NullType": "cast the column to a concrete type, e.g. F.lit(None).cast('string')",
    "CalendarIntervalType": "store the interval as a number of seconds or as a string",
    "DayTimeIntervalType": "store the interval as a number of seconds or as a string",
    "YearMonthIntervalType": "store the interval as a number of months",
    "VariantType": "store the value as a JSON string (F.to_json)",
}


def _walk(dt: T.DataType, path: str) -> Iterable[tuple[str, T.DataType]]:
    yield path, dt
    if isinstance(dt, T.StructType):
        for f in dt.fields:
            yield from _walk(f.dataType, f"{path}.{f.name}" if path else f.name)
    elif isinstance(dt, T.ArrayType):
        yield from _walk(dt.elementType, f"{path}.element")
    elif isinstance(dt, T.MapType):
        yield from _walk(dt.keyType, f"{path}.key")
        yield from _walk(dt.valueType, f"{path}.value")


def check_storable(schema: T.StructType, *, table: str | None = None) -> None:
    """Raise :class:`UnsupportedTypeError` for a column Delta cannot store."""
    for path, dt in _walk(schema, ""):
        if isinstance(dt, _UNSTORABLE):
            kind = type(dt).__name__
            raise UnsupportedTypeError(
                f"column '{path}' has type {dt.simpleString()}, which a Delta table cannot store; "
                f"{_TYPE_FIXES.get(kind, 'cast it to a supported type')}",
                table=table,
            )


def _strip_char_varchar(schema: T.StructType) -> T.StructType:
    # Spark keeps CHAR/VARCHAR as strings with a metadata hint; Delta only knows string.
    return T.StructType.fromJson(json.loads(schema.json()))


def spark_to_delta_schema(schema: T.StructType, *, table: str | None = None) -> DeltaSchema:
    """The Delta schema of a Spark schema; raises for types Delta cannot store."""
    check_storable(schema, table=table)
    return DeltaSchema.from_json(_strip_char_varchar(schema).json())


def delta_to_spark_schema(schema: DeltaSchema) -> T.StructType:
    """The Spark schema of a Delta schema, field metadata included."""
    return T.StructType.fromJson(json.loads(schema.to_json()))


def spark_to_arrow_schema(schema: T.StructType, *, table: str | None = None) -> pa.Schema:
    """The Arrow schema Spark expects from a Python reader for ``schema``.

    Timestamps are ``timestamp[us, tz=UTC]`` whatever the session time zone,
    strings and binaries are not large, nullability is kept.
    """
    check_storable(schema, table=table)
    return to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)


def conform_table(data: pa.Table | pa.RecordBatch, target: pa.Schema, *, table: str | None = None):
    """Cast Arrow data to exactly ``target``: names, order, types and nullability.

    Columns are matched by name; a column of ``target`` missing from ``data``
    is filled with nulls (schema evolution added it after the file was written).
    """
    columns = []
    names = data.schema.names
    for field in target:
        if field.name in names:
            column = data.column(field.name)
            if not column.type.equals(field.type):
                try:
                    column = column.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise SchemaMismatchError(
                        f"column '{field.name}' of type {column.type} cannot be read as {field.type}: {exc}",
                        table=table,
                    ) from exc
        else:
            column = pa.nulls(data.num_rows, type=field.type)
        columns.append(column)
    if isinstance(data, pa.RecordBatch):
        return pa.RecordBatch.from_arrays(columns, schema=target)
    return pa.Table.from_arrays(columns, schema=target)


def _field_map(schema: T.StructType) -> dict[str, T.StructField]:
    return {f.name.lower(): f for f in schema.fields}


def _same_type(a: T.DataType, b: T.DataType) -> bool:
    # Nullability inside nested types is not part of what a write must match.
    return _drop_nullability(a) == _drop_nullability(b)


def _drop_nullability(dt: T.DataType) -> T.DataType:
    if isinstance(dt, T.StructType):
        return T.StructType([T.StructField(f.name, _drop_nullability(f.dataType), True) for f in dt.fields])
    if isinstance(dt, T.ArrayType):
        return T.ArrayType(_drop_nullability(dt.elementType), True)
    if isinstance(dt, T.MapType):
        return T.MapType(_drop_nullability(dt.keyType), _drop_nullability(dt.valueType), True)
    if isinstance(dt, (T.CharType, T.VarcharType)):
        return T.StringType()
    return dt


def grown_type(stored: T.DataType, data: T.DataType) -> T.DataType | None:
    """``stored`` with the struct fields, at any depth, that ``data`` adds; ``None`` when another type differs."""
    if isinstance(stored, T.StructType) and isinstance(data, T.StructType):
        fields = list(stored.fields)
        position = {f.name.lower(): i for i, f in enumerate(fields)}
        for field in data.fields:
            at = position.get(field.name.lower())
            if at is None:
                fields.append(T.StructField(field.name, field.dataType, True, field.metadata))
                continue
            grown = grown_type(fields[at].dataType, field.dataType)
            if grown is None:
                return None
            fields[at] = T.StructField(fields[at].name, grown, fields[at].nullable, fields[at].metadata)
        return T.StructType(fields)
    if isinstance(stored, T.ArrayType) and isinstance(data, T.ArrayType):
        element = grown_type(stored.elementType, data.elementType)
        return None if element is None else T.ArrayType(element, stored.containsNull)
    if isinstance(stored, T.MapType) and isinstance(data, T.MapType) and _same_type(stored.keyType, data.keyType):
        value = grown_type(stored.valueType, data.valueType)
        return None if value is None else T.MapType(stored.keyType, value, stored.valueContainsNull)
    return stored if _same_type(stored, data) else None


def _maps_grown(stored: T.DataType, data: T.DataType, path: str) -> list[str]:
    """The maps (by path) whose values ``data`` gives struct fields that ``stored``'s lack, at any depth."""
    if isinstance(stored, T.StructType) and isinstance(data, T.StructType):
        known = {f.name.lower(): f.dataType for f in stored.fields}
        return [
            grown
            for f in data.fields
            if f.name.lower() in known
            for grown in _maps_grown(known[f.name.lower()], f.dataType, f"{path}.{f.name}")
        ]
    if isinstance(stored, T.ArrayType) and isinstance(data, T.ArrayType):
        return _maps_grown(stored.elementType, data.elementType, f"{path}[]")
    if isinstance(stored, T.MapType) and isinstance(data, T.MapType):
        grown = grown_type(stored.valueType, data.valueType)
        return [path] if grown is not None and not _same_type(grown, stored.valueType) else []
    return []


def refuse_growth_inside_maps(stored: T.StructType, data: T.StructType, *, table: str) -> None:
    """Refuse, before anything commits, a schema evolution that adds fields to the structs a map holds.

    delta-rs (deltalake 1.6.6) adds such a field, but then cannot MERGE into or
    DELETE from the table while a file written before remains: its scan cannot
    cast the stored map values to the grown type. The table would be stuck for
    every delta-rs writer, so the growth is not written; delta-spark's own
    writes add it and merge afterwards.

    Raises:
        SchemaMismatchError: naming each such column, both types, and the fixes.
    """
    known = _field_map(stored)
    problems = [
        f"column '{f.name}' gains struct fields inside the values of map {where!r} "
        f"({f.dataType.simpleString()} in the data, {known[f.name.lower()].dataType.simpleString()} in the table)"
        for f in data.fields
        if f.name.lower() in known
        for where in _maps_grown(known[f.name.lower()].dataType, f.dataType, f.name)
    ]
    if problems:
        raise SchemaMismatchError(
            "; ".join(problems) + ". delta-rs could add the fields but could not merge into or delete from the "
            "table afterwards, while files written before remain, so nothing was written. To fix: write the table "
            f"with delta-spark {HOW_TO_USE_DELTA_SPARK}, carry the new fields in a column of their own, or rewrite "
            f"the table whole with the new schema {HOW_TO_REWRITE_WHOLE}",
            table=table,
        )


def resolve_write_schema(
    table_schema: T.StructType,
    data_schema: T.StructType,
    *,
    merge_schema: bool,
    table: str,
) -> T.StructType:
    """The table schema after a write of ``data_schema`` (Delta's enforcement rules).

    Columns are matched by name, case-insensitively. A data column the table
    lacks is an error unless ``merge_schema`` adds it; a table column the data
    lacks is written as null (it must be nullable); a type change is an error
    (type widening needs the typeWidening table feature, which is not written here).
    With ``merge_schema``, a struct column also gains the fields, at any depth,
    that the data's struct adds (inside a map's values too: a write that keeps
    files written before refuses that with :func:`refuse_growth_inside_maps`).

    Raises:
        SchemaMismatchError: naming every offending column and the fix.
    """
    check_storable(data_schema, table=table)
    table_fields = _field_map(table_schema)
    data_fields = _field_map(data_schema)
    problems: list[str] = []
    new_fields = list(table_schema.fields)
    for key, data_field in data_fields.items():
        table_field = table_fields.get(key)
        if table_field is None:
            if merge_schema:
                new_fields.append(T.StructField(data_field.name, data_field.dataType, True, data_field.metadata))
            else:
                problems.append(
                    f"column '{data_field.name}' ({data_field.dataType.simpleString()}) is not in the table"
                )
            continue
        if _same_type(table_field.dataType, data_field.dataType):
            continue
        grown = grown_type(table_field.dataType, data_field.dataType) if merge_schema else None
        if grown is not None:
            new_fields[new_fields.index(table_field)] = T.StructField(
                table_field.name, grown, table_field.nullable, table_field.metadata
            )
            continue
        problems.append(
            f"column '{data_field.name}' is {data_field.dataType.simpleString()} in the data "
            f"but {table_field.dataType.simpleString()} in the table"
        )
    for key, table_field in table_fields.items():
        if key not in data_fields and not table_field.nullable:
            problems.append(f"column '{table_field.name}' is NOT NULL in the table but missing from the data")
    if problems:
        fix = (
            "use option('mergeSchema', 'true') to add new columns, "
            "option('overwriteSchema', 'true') with mode('overwrite') to replace the schema, "
            "or cast the data to the table's schema"
        )
        raise SchemaMismatchError(
            "the data's schema does not fit the table's: " + "; ".join(problems) + f". To fix: {fix}",
            table=table,
        )
    return T.StructType(new_fields)
