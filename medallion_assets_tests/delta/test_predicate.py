"""The predicate subset used by replaceWhere, CHECK constraints and file skipping."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from medallion_assets.delta._predicate import (
    Verdict,
    file_verdict,
    matching_mask,
    parse_predicate,
    resolve_columns,
)
from medallion_assets.delta.errors import DeltaOptionError

SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("day", T.DateType()),
        T.StructField("amount", T.DecimalType(15, 2)),
        T.StructField("region", T.StringType()),
    ]
)
DATA = pa.table(
    {
        "id": pa.array([1, 2, 3, None], pa.int64()),
        "day": pa.array([dt.date(2024, 1, d) for d in (1, 5, 9, 12)], pa.date32()),
        "amount": pa.array([Decimal("0.50"), Decimal("10.00"), None, Decimal("3.25")], pa.decimal128(15, 2)),
        "region": ["EU", "US", "EU", None],
    }
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("id = 2", [False, True, False, False]),
        ("id <> 2", [True, False, True, False]),  # NULL is not a match
        ("id IN (1, 3)", [True, False, True, False]),
        ("id NOT IN (1, 3)", [False, True, False, False]),
        ("day >= DATE '2024-01-05' AND day < '2024-01-10'", [False, True, True, False]),
        ("day BETWEEN '2024-01-01' AND '2024-01-05'", [True, True, False, False]),
        ("day >= '2024-01-05 00:00:00' AND day < TIMESTAMP '2024-01-10 00:00:00'", [False, True, True, False]),
        ("amount > 1.5 OR region IS NULL", [False, True, False, True]),
        ("NOT (region = 'EU')", [False, True, False, False]),
        ("amount > '0'::decimal(15, 2)", [True, True, False, True]),
        ("`region` = 'EU' and id < 3", [True, False, False, False]),
    ],
)
def test_predicates_evaluate_on_arrow_as_sql_does(text, expected):
    expr = resolve_columns(parse_predicate(text), SCHEMA, table="t", what="test")
    assert matching_mask(expr, DATA).to_pylist() == expected


@pytest.mark.parametrize("text", ["id = ", "id === 3", "id LIKE 'x%'", ""])
def test_unsupported_predicates_say_what_is_supported(text):
    with pytest.raises(DeltaOptionError, match="Supported:"):
        parse_predicate(text)


def test_unknown_columns_are_named():
    with pytest.raises(DeltaOptionError, match="'nope'"):
        resolve_columns(parse_predicate("nope = 1"), SCHEMA, table="t", what="replaceWhere")


def verdict(text, *, partition=None, lo=None, hi=None, nulls=None, rows=10):
    expr = resolve_columns(parse_predicate(text), SCHEMA, table="t", what="test")
    return file_verdict(expr, SCHEMA, partition or {}, rows, lo or {}, hi or {}, nulls or {})


def test_file_verdicts_from_statistics():
    stats = dict(lo={"id": 10}, hi={"id": 20}, nulls={"id": 0})
    assert verdict("id > 25", **stats) == Verdict.NONE
    assert verdict("id >= 10", **stats) == Verdict.ALL
    assert verdict("id > 15", **stats) == Verdict.SOME
    assert verdict("id = 30 OR id = 5", **stats) == Verdict.NONE
    assert verdict("id BETWEEN 0 AND 100", **stats) == Verdict.ALL
    # With nulls in the file, "all rows match" can no longer be claimed.
    assert verdict("id >= 10", lo={"id": 10}, hi={"id": 20}, nulls={"id": 2}) == Verdict.SOME
    # Missing statistics are never a reason to skip.
    assert verdict("id > 25") == Verdict.SOME


def test_file_verdicts_from_partition_values():
    assert verdict("region = 'EU'", partition={"region": "EU"}) == Verdict.ALL
    assert verdict("region = 'EU'", partition={"region": "US"}) == Verdict.NONE
    assert verdict("region IS NULL", partition={"region": None}) == Verdict.ALL
    assert verdict("day < '2024-02-01'", partition={"day": "2024-01-31"}) == Verdict.ALL
    assert verdict("day >= '2024-02-01 00:00:00'", partition={"day": "2024-01-31"}) == Verdict.NONE
    assert verdict("NOT region = 'EU'", partition={"region": "US"}) == Verdict.ALL
