"""Turning delta-spark style conditions and expressions into SQL text for delta-rs.

delta-spark accepts a SQL string or a :class:`pyspark.sql.Column` wherever a
condition or an assignment goes. delta-rs takes SQL text, which it parses as
DataFusion SQL. A SQL string is passed through as written; a Column is turned
into SQL by walking its expression tree (Spark 4's ``ColumnNode``) and writing
DataFusion-compatible SQL for the common shapes: column references, literals,
comparison, boolean and arithmetic operators, ``isNull``/``isin``/``like``,
``CASE WHEN`` (``F.when``), casts, ``F.expr(...)`` text and ordinary function
calls. Anything else raises :class:`DeltaOptionError` asking for a SQL string.
"""

from __future__ import annotations

import datetime as _dt
import decimal
from typing import Any

from pyspark.sql import Column

from medallion_assets.delta.errors import DeltaOptionError

__all__ = ["to_sql", "quote_identifier", "pruning_literal"]

_BINARY = {
    "=": "=",
    "==": "=",
    "!=": "<>",
    "<>": "<>",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
    "<=>": "IS NOT DISTINCT FROM",
    "and": "AND",
    "or": "OR",
    "+": "+",
    "-": "-",
    "*": "*",
    "/": "/",
    "%": "%",
    "like": "LIKE",
    "ilike": "ILIKE",
}
_POSTFIX = {"isnull": "IS NULL", "isnotnull": "IS NOT NULL"}
_PREFIX = {"!": "NOT", "not": "NOT", "negative": "-"}


def quote_identifier(name: str) -> str:
    """Quote one name part for DataFusion when it is not a plain identifier."""
    if name.replace("_", "a").isalnum() and not name[0].isdigit() and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'


def pruning_literal(value: Any) -> str | None:
    """A Python value as a SQL literal for delta-rs's file pruning; None when it has none.

    delta-rs prunes only comparisons of like types, so timestamps become Delta's
    microsecond timestamps (UTC when the value has a zone, as Spark hands over
    values of ``timestamp`` columns; without one for ``timestamp_ntz``).
    """
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and value not in (float("inf"), float("-inf")) else None
    if isinstance(value, decimal.Decimal):
        return format(value, "f") if value.is_finite() else None
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            return f"arrow_cast('{value.isoformat()}', 'Timestamp(Microsecond, None)')"
        utc = value.astimezone(_dt.UTC).replace(tzinfo=None)
        return f"arrow_cast('{utc.isoformat()}Z', 'Timestamp(Microsecond, Some(\"UTC\"))')"
    if isinstance(value, _dt.date):
        return f"DATE '{value.isoformat()}'"
    return None


def to_sql(expr: Any, *, what: str = "expression") -> str:
    """Return SQL text for ``expr``, a SQL string or a PySpark Column.

    Args:
        expr: the condition or expression.
        what: how to call it in an error message (``"merge condition"``...).

    Returns:
        SQL text that delta-rs (DataFusion) parses.

    Raises:
        DeltaOptionError: ``expr`` is neither a string nor a Column, or the Column
            uses a shape that cannot be written as SQL here.

    Example:
        >>> from pyspark.sql import functions as F
        >>> to_sql(F.col("t.id") == F.col("s.id"))  # doctest: +SKIP
        '(t.id = s.id)'
    """
    if isinstance(expr, str):
        if not expr.strip():
            raise DeltaOptionError(f"The {what} is an empty string.")
        return expr
    if not isinstance(expr, Column):
        raise DeltaOptionError(f"The {what} must be a SQL string or a pyspark Column, got {type(expr).__name__}.")
    jc = getattr(expr, "_jc", None)
    if jc is None:
        # Spark Connect Column: its proto tree is not walked here.
        raise DeltaOptionError(f"The {what} is a Spark Connect Column; pass it as a SQL string instead.")
    try:
        node = jc.node()
    except Exception as exc:  # pragma: no cover - older Spark
        raise DeltaOptionError(f"Cannot read the {what} Column; pass a SQL string.") from exc
    return _node_sql(node, what)


def _seq(seq) -> list:
    return [seq.apply(i) for i in range(seq.size())]


def _node_sql(node, what: str) -> str:
    kind = node.getClass().getSimpleName()
    if kind == "SqlExpression":
        return "(" + node.expression() + ")"
    if kind == "UnresolvedAttribute":
        return ".".join(quote_identifier(p) for p in _seq(node.nameParts()))
    if kind == "Literal":
        return _literal_sql(node.value(), node)
    if kind == "Alias":
        return _node_sql(node.child(), what)
    if kind == "Cast":
        return f"CAST({_node_sql(node.child(), what)} AS {_type_sql(node.dataType())})"
    if kind == "CaseWhenOtherwise":
        parts = ["CASE"]
        for branch in _seq(node.branches()):
            parts.append(f"WHEN {_node_sql(branch._1(), what)} THEN {_node_sql(branch._2(), what)}")
        otherwise = node.otherwise()
        if otherwise.isDefined():
            parts.append(f"ELSE {_node_sql(otherwise.get(), what)}")
        parts.append("END")
        return "(" + " ".join(parts) + ")"
    if kind == "UnresolvedFunction":
        name = node.functionName()
        args = [_node_sql(a, what) for a in _seq(node.arguments())]
        lname = name.lower()
        if lname in _BINARY and len(args) == 2:
            return f"({args[0]} {_BINARY[lname]} {args[1]})"
        if lname in _POSTFIX and len(args) == 1:
            return f"({args[0]} {_POSTFIX[lname]})"
        if lname in _PREFIX and len(args) == 1:
            return f"({_PREFIX[lname]} {args[0]})"
        if lname == "in" and args:
            return f"({args[0]} IN ({', '.join(args[1:])}))"
        if lname == "between" and len(args) == 3:
            return f"({args[0]} BETWEEN {args[1]} AND {args[2]})"
        distinct = "DISTINCT " if node.isDistinct() else ""
        return f"{name}({distinct}{', '.join(args)})"
    raise DeltaOptionError(
        f"The {what} uses a Column shape ({kind}) that cannot be sent to delta-rs; "
        "pass the condition as a SQL string instead."
    )


def _type_sql(data_type) -> str:
    name = data_type.typeName()
    simple = {
        "long": "BIGINT",
        "integer": "INT",
        "short": "SMALLINT",
        "byte": "TINYINT",
        "double": "DOUBLE",
        "float": "FLOAT",
        "string": "VARCHAR",
        "boolean": "BOOLEAN",
        "date": "DATE",
        "timestamp": "TIMESTAMP",
        "timestamp_ntz": "TIMESTAMP",
        "binary": "BYTEA",
    }
    if name in simple:
        return simple[name]
    if name.startswith("decimal"):
        return f"DECIMAL({data_type.precision()}, {data_type.scale()})"
    raise DeltaOptionError(f"Casting to {name} in a Column is not supported; pass SQL text.")


def _literal_sql(value, node) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return f"CAST('{value}' AS DOUBLE)"
        return repr(value)
    if isinstance(value, decimal.Decimal):
        digits, exponent = value.as_tuple().digits, value.as_tuple().exponent
        if not isinstance(exponent, int):  # NaN or infinity: no DECIMAL holds it
            raise DeltaOptionError(f"the decimal {value} has no SQL literal")
        return f"CAST('{value}' AS DECIMAL({len(digits) or 1}, {max(0, -exponent)}))"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, _dt.datetime):
        return f"TIMESTAMP '{value.isoformat()}'"
    if isinstance(value, _dt.date):
        return f"DATE '{value.isoformat()}'"
    # A JVM object (java.time.LocalDate, Instant, BigDecimal wrappers, UTF8String...).
    type_name = node.dataType().typeName() if node.dataType().isDefined() else ""
    text = str(value.toString())
    if type_name == "date":
        return f"DATE '{text}'"
    if type_name in ("timestamp", "timestamp_ntz"):
        return f"TIMESTAMP '{text}'"
    if type_name.startswith("decimal"):
        return text
    return "'" + text.replace("'", "''") + "'"
