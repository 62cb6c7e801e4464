"""Row predicates for ``replaceWhere``, CHECK constraints and file skipping.

Spark's Python writers run outside the JVM, so they cannot ask Spark to
evaluate SQL. This module parses the predicate subset those features need
(comparisons, ``AND``/``OR``/``NOT``, ``IN``, ``BETWEEN``, ``IS [NOT] NULL``,
literals including ``DATE '...'`` and ``TIMESTAMP '...'``) and evaluates it two
ways: on Arrow data, and on a file's partition values and min/max statistics,
where the answer is that all, none or some of its rows may match.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Union

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from pyspark.sql import types as T

from medallion_assets.delta.errors import DeltaOptionError

# ---------------------------------------------------------------- the tree


@dataclass(frozen=True)
class Col:
    name: str


@dataclass(frozen=True)
class Lit:
    value: Any


@dataclass(frozen=True)
class Cmp:
    op: str  # one of = != < <= > >= <=>
    left: Any
    right: Any


@dataclass(frozen=True)
class And:
    left: Any
    right: Any


@dataclass(frozen=True)
class Or:
    left: Any
    right: Any


@dataclass(frozen=True)
class Not:
    child: Any


@dataclass(frozen=True)
class IsNull:
    child: Any
    negated: bool = False


@dataclass(frozen=True)
class In:
    child: Any
    values: tuple
    negated: bool = False


Expr = Union[Col, Lit, Cmp, And, Or, Not, IsNull, In]

# ---------------------------------------------------------------- parsing

_TOKEN = re.compile(
    r"\s*(?:"
    r"(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[LlDd]?|\.\d+)"
    r"|(?P<str>'(?:[^']|'')*')"
    r"|(?P<bq>`(?:[^`]|``)+`)"
    r"|(?P<op>::|<=>|<=|>=|<>|!=|==|=|<|>|\(|\)|,|-)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r")"
)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.rstrip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if not m or m.end() == pos:
                raise self.error(f"unexpected text at '{text[pos:pos + 20]}'")
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i = 0

    def error(self, why: str) -> DeltaOptionError:
        return DeltaOptionError(
            f"cannot parse predicate \"{self.text}\": {why}. Supported: comparisons (= != <> < <= > >=), "
            "AND, OR, NOT, IN (...), BETWEEN ... AND ..., IS [NOT] NULL, and literals such as 42, 'text', "
            "DATE '2024-01-31', TIMESTAMP '2024-01-31 12:00:00'"
        )

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        j = self.i + offset
        return self.tokens[j] if j < len(self.tokens) else None

    def word(self, *words: str) -> bool:
        tok = self.peek()
        if tok and tok[0] == "word" and tok[1].upper() in words:
            self.i += 1
            return True
        return False

    def op(self, *ops: str) -> str | None:
        tok = self.peek()
        if tok and tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def parse(self) -> Expr:
        if not self.tokens:
            raise self.error("it is empty")
        expr = self.parse_or()
        if self.peek() is not None:
            raise self.error(f"unexpected '{self.peek()[1]}'")
        return expr

    def parse_or(self) -> Expr:
        left = self.parse_and()
        while self.word("OR"):
            left = Or(left, self.parse_and())
        return left

    def parse_and(self) -> Expr:
        left = self.parse_not()
        while self.word("AND"):
            left = And(left, self.parse_not())
        return left

    def parse_not(self) -> Expr:
        if self.word("NOT"):
            return Not(self.parse_not())
        return self.parse_predicate()

    def parse_predicate(self) -> Expr:
        left = self.parse_operand()
        if self.word("IS"):
            negated = self.word("NOT")
            if not self.word("NULL"):
                raise self.error("expected NULL after IS")
            return IsNull(left, negated)
        negated = self.word("NOT")
        if self.word("IN"):
            if not self.op("("):
                raise self.error("expected ( after IN")
            values = [self.parse_literal()]
            while self.op(","):
                values.append(self.parse_literal())
            if not self.op(")"):
                raise self.error("expected ) to close IN")
            return In(left, tuple(v.value for v in values), negated)
        if self.word("BETWEEN"):
            low = self.parse_operand()
            if not self.word("AND"):
                raise self.error("expected AND in BETWEEN")
            high = self.parse_operand()
            expr = And(Cmp(">=", left, low), Cmp("<=", left, high))
            return Not(expr) if negated else expr
        if negated:
            raise self.error("expected IN or BETWEEN after NOT")
        op = self.op("=", "==", "!=", "<>", "<", "<=", ">", ">=", "<=>")
        if op is None:
            if isinstance(left, Expr.__args__) and not isinstance(left, (Col, Lit)):
                return left
            if isinstance(left, Col):
                return Cmp("=", left, Lit(True))  # a bare boolean column
            raise self.error("expected a comparison")
        op = {"==": "=", "<>": "!="}.get(op, op)
        return Cmp(op, left, self.parse_operand())

    def parse_operand(self) -> Expr:
        operand = self._parse_operand()
        while self.op("::"):
            self.skip_type()  # DataFusion writes casts of literals; comparisons coerce them anyway
        return operand

    def skip_type(self) -> None:
        tok = self.peek()
        if tok is None or tok[0] != "word":
            raise self.error("expected a type after ::")
        self.i += 1
        if self.op("("):
            while self.peek() is not None and not self.op(")"):
                self.i += 1

    def _parse_operand(self) -> Expr:
        if self.op("("):
            inner = self.parse_or()
            if not self.op(")"):
                raise self.error("expected )")
            return inner
        tok = self.peek()
        if tok is None:
            raise self.error("it ends too early")
        if tok[0] == "bq":
            self.i += 1
            return Col(tok[1][1:-1].replace("``", "`"))
        if tok[0] == "word" and tok[1].upper() not in ("DATE", "TIMESTAMP", "TRUE", "FALSE", "NULL"):
            self.i += 1
            return Col(tok[1])
        return self.parse_literal()

    def parse_literal(self) -> Lit:
        tok = self.peek()
        if tok is None:
            raise self.error("expected a value")
        kind, text = tok
        self.i += 1
        if kind == "op" and text == "-":
            lit = self.parse_literal()
            if not isinstance(lit.value, (int, float, Decimal)):
                raise self.error("'-' must precede a number")
            return Lit(-lit.value)
        if kind == "num":
            return Lit(_number(text))
        if kind == "str":
            return Lit(text[1:-1].replace("''", "'"))
        if kind == "word":
            upper = text.upper()
            if upper == "TRUE":
                return Lit(True)
            if upper == "FALSE":
                return Lit(False)
            if upper == "NULL":
                return Lit(None)
            if upper in ("DATE", "TIMESTAMP") and self.peek() and self.peek()[0] == "str":
                raw = self.parse_literal().value
                try:
                    if upper == "DATE":
                        return Lit(dt.date.fromisoformat(raw))
                    return Lit(_timestamp(raw))
                except ValueError as exc:
                    raise self.error(f"{upper} '{raw}' is not valid") from exc
        raise self.error(f"expected a value, found '{text}'")


def _number(text: str) -> int | float | Decimal:
    if text[-1] in "Ll":
        return int(text[:-1])
    if text[-1] in "Dd":
        return float(text[:-1])
    if re.fullmatch(r"\d+", text):
        return int(text)
    if "e" in text.lower():
        return float(text)
    return Decimal(text)


def _date(raw: str) -> dt.date:
    """A date from text, as Spark casts a string to a date ('1995-01-01 00:00:00' included)."""
    text = raw.strip()
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).date()


def _timestamp(raw: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(raw.strip().replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value


def parse_predicate(text: str) -> Expr:
    """Parse a SQL predicate; raises :class:`DeltaOptionError` saying what is supported."""
    return _Parser(text).parse()


def columns_of(expr: Expr) -> set[str]:
    """The column names a predicate refers to."""
    if isinstance(expr, Col):
        return {expr.name}
    if isinstance(expr, Lit):
        return set()
    if isinstance(expr, (And, Or, Cmp)):
        return columns_of(expr.left) | columns_of(expr.right)
    if isinstance(expr, (Not, IsNull, In)):
        return columns_of(expr.child)
    return set()


def resolve_columns(expr: Expr, schema: T.StructType, *, table: str, what: str) -> Expr:
    """Map column names to the schema's spelling; raise for unknown columns."""
    names = {f.name.lower(): f.name for f in schema.fields}

    def fix(e):
        if isinstance(e, Col):
            name = e.name.split(".")[-1] if e.name.lower() not in names else e.name
            if name.lower() not in names:
                raise DeltaOptionError(
                    f"{what} refers to column '{e.name}', which the table does not have "
                    f"(columns: {', '.join(f.name for f in schema.fields)})",
                    table=table,
                )
            return Col(names[name.lower()])
        if isinstance(e, (And, Or)):
            return type(e)(fix(e.left), fix(e.right))
        if isinstance(e, Cmp):
            return Cmp(e.op, fix(e.left), fix(e.right))
        if isinstance(e, Not):
            return Not(fix(e.child))
        if isinstance(e, IsNull):
            return IsNull(fix(e.child), e.negated)
        if isinstance(e, In):
            return In(fix(e.child), e.values, e.negated)
        return e

    return fix(expr)


# ---------------------------------------------------------------- on Arrow data

_ARROW_OPS = {
    "=": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}


def _scalar(value: Any, type_: pa.DataType | None) -> pa.Scalar:
    if value is None:
        return pa.scalar(None, type=type_ or pa.null())
    if type_ is None:
        return pa.scalar(value)
    try:
        if pa.types.is_date(type_) and isinstance(value, str):
            value = _date(value)
        elif pa.types.is_date(type_) and isinstance(value, dt.datetime):
            value = value.date()
        elif pa.types.is_timestamp(type_) and isinstance(value, str):
            value = _timestamp(value)
        elif pa.types.is_timestamp(type_) and isinstance(value, dt.date) and not isinstance(value, dt.datetime):
            value = dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
        if pa.types.is_timestamp(type_) and type_.tz is None and isinstance(value, dt.datetime) and value.tzinfo:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        if pa.types.is_decimal(type_) and not isinstance(value, Decimal):
            value = Decimal(str(value))
        if pa.types.is_integer(type_) and isinstance(value, (Decimal, float)):
            # 3.5 compared with an integer column: compare as a decimal/double instead.
            return pa.scalar(value)
        return pa.scalar(value, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError, InvalidOperation):
        return pa.scalar(value)


def to_arrow_expression(expr: Expr, schema: pa.Schema) -> pc.Expression:
    """The predicate as a ``pyarrow.compute`` expression over ``schema``'s columns."""

    def type_of(e) -> pa.DataType | None:
        return schema.field(e.name).type if isinstance(e, Col) else None

    def operand(e, other_type):
        if isinstance(e, Col):
            return pc.field(e.name)
        if isinstance(e, Lit):
            return _scalar(e.value, other_type)
        return build(e)

    def build(e) -> pc.Expression:
        if isinstance(e, And):
            return build(e.left) & build(e.right)
        if isinstance(e, Or):
            return build(e.left) | build(e.right)
        if isinstance(e, Not):
            return ~build(e.child)
        if isinstance(e, IsNull):
            test = pc.field(e.child.name).is_null() if isinstance(e.child, Col) else build(e.child).is_null()
            return ~test if e.negated else test
        if isinstance(e, In):
            t = type_of(e.child)
            values = pa.array([_scalar(v, t).as_py() for v in e.values], type=t) if t else pa.array(e.values)
            column = pc.field(e.child.name)
            # SQL: NULL IN (...) is NULL, not false, so NOT IN must not match it either.
            test = pc.if_else(column.is_null(), pa.scalar(None, pa.bool_()), column.isin(values))
            return ~test if e.negated else test
        if isinstance(e, Cmp):
            lt, rt = type_of(e.left), type_of(e.right)
            left, right = operand(e.left, rt), operand(e.right, lt)
            if e.op == "<=>":
                both_null = _as_expr(left).is_null() & _as_expr(right).is_null()
                equal = pc.if_else(_as_expr(left).is_null() | _as_expr(right).is_null(), False, _ARROW_OPS["="](left, right))
                return both_null | equal
            return _ARROW_OPS[e.op](left, right)
        if isinstance(e, Col):
            return pc.field(e.name)
        if isinstance(e, Lit):
            return pc.scalar(e.value)
        raise TypeError(e)

    return build(expr)


def _as_expr(value) -> pc.Expression:
    return value if isinstance(value, pc.Expression) else pc.scalar(value)


def matching_mask(expr: Expr, data: pa.Table) -> pa.ChunkedArray:
    """Which rows the predicate holds for (NULL counts as not holding)."""
    mask = pads.dataset(data).to_table(columns={"m": to_arrow_expression(expr, data.schema)}).column("m")
    return pc.fill_null(mask, False)


# ---------------------------------------------------------------- on file statistics


class Verdict(enum.Enum):
    """How many rows of a file a predicate can hold for."""

    NONE = "none"
    SOME = "some"
    ALL = "all"


_CONVERSE = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "=": "=", "!=": "!=", "<=>": "<=>"}


def _comparable(value: Any, sample: Any) -> Any:
    """Coerce a literal to compare with a statistic's Python value."""
    if value is None or sample is None:
        return value
    try:
        if isinstance(sample, dt.datetime):
            if isinstance(value, str):
                value = _timestamp(value)
            elif isinstance(value, dt.date) and not isinstance(value, dt.datetime):
                value = dt.datetime(value.year, value.month, value.day, tzinfo=dt.timezone.utc)
            if sample.tzinfo is None and value.tzinfo is not None:
                value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
            elif sample.tzinfo is not None and value.tzinfo is None:
                value = value.replace(tzinfo=dt.timezone.utc)
            return value
        if isinstance(sample, dt.date):
            if isinstance(value, dt.datetime):
                return value.date()
            return _date(value) if isinstance(value, str) else value
        if isinstance(sample, (int, float, Decimal)) and not isinstance(sample, bool):
            if isinstance(value, str):
                return Decimal(value)
            if isinstance(sample, Decimal) and isinstance(value, float):
                return Decimal(str(value))
            if isinstance(sample, float) and isinstance(value, Decimal):
                return float(value)
            return value
        if isinstance(sample, str):
            return str(value)
    except (ValueError, InvalidOperation):
        return None
    return value


def _partition_value(raw: str | None, field: T.StructField) -> Any:
    """A partition value string from the log, as the Python value of its column type."""
    if raw is None:
        return None
    t = field.dataType
    try:
        if isinstance(t, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            return int(raw)
        if isinstance(t, (T.FloatType, T.DoubleType)):
            return float(raw)
        if isinstance(t, T.DecimalType):
            return Decimal(raw)
        if isinstance(t, T.BooleanType):
            return raw.lower() == "true"
        if isinstance(t, T.DateType):
            return dt.date.fromisoformat(raw)
        if isinstance(t, T.TimestampType):
            return _timestamp(raw)
        if isinstance(t, T.TimestampNTZType):
            return dt.datetime.fromisoformat(raw)
    except ValueError:
        return raw
    return raw


def _compare(op: str, a: Any, b: Any) -> bool | None:
    if a is None or b is None:
        return None
    try:
        return {
            "=": a == b,
            "!=": a != b,
            "<": a < b,
            "<=": a <= b,
            ">": a > b,
            ">=": a >= b,
        }[op]
    except TypeError:
        return None


def file_verdict(
    expr: Expr,
    schema: T.StructType,
    partition_values: dict[str, str | None],
    num_records: int | None,
    min_values: dict[str, Any],
    max_values: dict[str, Any],
    null_counts: dict[str, int],
) -> Verdict:
    """Whether all, none or some rows of a file satisfy ``expr``.

    ``SOME`` is the safe answer whenever statistics are missing. The verdict
    treats SQL NULL as "does not hold", as a filter does.
    """
    fields = {f.name: f for f in schema.fields}
    known_partitions = {
        name: _partition_value(raw, fields[name]) for name, raw in partition_values.items() if name in fields
    }

    def column_facts(name: str):
        """(lo, hi, has_nulls, all_nulls) of a column in this file, or None if unknown."""
        if name in known_partitions:
            v = known_partitions[name]
            return (v, v, v is None, v is None)
        lo, hi = min_values.get(name), max_values.get(name)
        nulls = null_counts.get(name)
        if nulls is not None and num_records is not None and nulls == num_records:
            return (None, None, True, True)
        if lo is None or hi is None or nulls is None:
            return None
        return (lo, hi, nulls > 0, False)

    def cmp_col_lit(op: str, name: str, value: Any) -> Verdict:
        facts = column_facts(name)
        if facts is None:
            return Verdict.SOME
        lo, hi, has_nulls, all_nulls = facts
        if op == "<=>":
            if value is None:
                return Verdict.ALL if all_nulls else (Verdict.SOME if has_nulls else Verdict.NONE)
            op = "="
        if value is None or all_nulls:
            return Verdict.NONE
        value = _comparable(value, lo)
        if value is None:
            return Verdict.SOME
        if op == "=":
            if _compare("<", value, lo) or _compare(">", value, hi):
                return Verdict.NONE
            if lo == hi == value and not has_nulls:
                return Verdict.ALL
            return Verdict.SOME
        if op == "!=":
            if lo == hi == value:
                return Verdict.NONE
            if (_compare("<", value, lo) or _compare(">", value, hi)) and not has_nulls:
                return Verdict.ALL
            return Verdict.SOME
        always = {"<": _compare("<", hi, value), "<=": _compare("<=", hi, value),
                  ">": _compare(">", lo, value), ">=": _compare(">=", lo, value)}[op]
        never = {"<": _compare(">=", lo, value), "<=": _compare(">", lo, value),
                 ">": _compare("<=", hi, value), ">=": _compare("<", hi, value)}[op]
        if never:
            return Verdict.NONE
        if always and not has_nulls:
            return Verdict.ALL
        return Verdict.SOME

    def visit(e) -> Verdict:
        if isinstance(e, And):
            a, b = visit(e.left), visit(e.right)
            if Verdict.NONE in (a, b):
                return Verdict.NONE
            return Verdict.ALL if a == b == Verdict.ALL else Verdict.SOME
        if isinstance(e, Or):
            a, b = visit(e.left), visit(e.right)
            if Verdict.ALL in (a, b):
                return Verdict.ALL
            return Verdict.NONE if a == b == Verdict.NONE else Verdict.SOME
        if isinstance(e, Not):
            inner = visit(e.child)
            # NOT of "holds for no row" is only "all" when no row is NULL for it.
            if inner == Verdict.ALL:
                return Verdict.NONE
            if inner == Verdict.NONE and not _may_be_null(e.child):
                return Verdict.ALL
            return Verdict.SOME
        if isinstance(e, IsNull) and isinstance(e.child, Col):
            facts = column_facts(e.child.name)
            if facts is None:
                return Verdict.SOME
            _, _, has_nulls, all_nulls = facts
            if e.negated:
                return Verdict.NONE if all_nulls else (Verdict.SOME if has_nulls else Verdict.ALL)
            return Verdict.ALL if all_nulls else (Verdict.SOME if has_nulls else Verdict.NONE)
        if isinstance(e, In) and isinstance(e.child, Col):
            verdicts = [cmp_col_lit("=", e.child.name, v) for v in e.values if v is not None]
            if not verdicts:
                return Verdict.NONE
            if any(v == Verdict.ALL for v in verdicts):
                result = Verdict.ALL
            elif all(v == Verdict.NONE for v in verdicts):
                result = Verdict.NONE
            else:
                result = Verdict.SOME
            if e.negated:
                if result == Verdict.ALL:
                    return Verdict.NONE
                facts = column_facts(e.child.name)
                if result == Verdict.NONE and facts is not None and not facts[2]:
                    return Verdict.ALL
                return Verdict.SOME
            return result
        if isinstance(e, Cmp):
            if isinstance(e.left, Col) and isinstance(e.right, Lit):
                return cmp_col_lit(e.op, e.left.name, e.right.value)
            if isinstance(e.left, Lit) and isinstance(e.right, Col):
                return cmp_col_lit(_CONVERSE[e.op], e.right.name, e.left.value)
            if isinstance(e.left, Lit) and isinstance(e.right, Lit):
                held = _compare(e.op, e.left.value, e.right.value)
                return Verdict.ALL if held else Verdict.NONE
        return Verdict.SOME

    def _may_be_null(e) -> bool:
        for name in columns_of(e):
            facts = column_facts(name)
            if facts is None or facts[2]:
                return True
        return False

    return visit(expr)


# ---------------------------------------------------------------- from Spark's pushed filters


def from_spark_filter(f) -> Expr | None:
    """The tree of one of Spark's pushed-down data source filters, or None if unknown."""
    from pyspark.sql import datasource as ds

    def col(attr) -> Col | None:
        return Col(attr[0]) if len(attr) == 1 else None

    c = col(f.attribute) if hasattr(f, "attribute") else None
    if isinstance(f, ds.EqualTo) and c:
        return Cmp("=", c, Lit(f.value))
    if isinstance(f, ds.EqualNullSafe) and c:
        return Cmp("<=>", c, Lit(f.value))
    if isinstance(f, ds.GreaterThan) and c:
        return Cmp(">", c, Lit(f.value))
    if isinstance(f, ds.GreaterThanOrEqual) and c:
        return Cmp(">=", c, Lit(f.value))
    if isinstance(f, ds.LessThan) and c:
        return Cmp("<", c, Lit(f.value))
    if isinstance(f, ds.LessThanOrEqual) and c:
        return Cmp("<=", c, Lit(f.value))
    if isinstance(f, ds.In) and c:
        return In(c, tuple(f.value))
    if isinstance(f, ds.IsNull) and c:
        return IsNull(c)
    if isinstance(f, ds.IsNotNull) and c:
        return IsNull(c, negated=True)
    if isinstance(f, ds.Not):
        inner = from_spark_filter(f.child)
        return Not(inner) if inner is not None else None
    return None
