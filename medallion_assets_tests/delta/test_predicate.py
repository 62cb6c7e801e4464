"""SQL predicates of replaceWhere, CHECK constraints and file skipping: DataFusion and delta-rs judge them."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import deltalake
import pyarrow as pa
import pytest
from pyspark.sql import datasource as ds

from medallion_assets.delta._engine import PredicateError, check_predicate, holds
from medallion_assets.delta._options import ReadOptions
from medallion_assets.delta._snapshot import resolve_snapshot
from medallion_assets.delta.datasource import DeltaBatchReader, pushed_filter_sql

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
        # What a hand-written subset could not evaluate: arithmetic, functions, LIKE, CASE.
        ("amount * 2 > 1", [False, True, False, True]),
        ("length(region) = 2 AND region LIKE 'E%'", [True, False, True, False]),
        ("CASE WHEN region = 'EU' THEN amount < 1 ELSE id > 1 END", [True, True, False, False]),
    ],
)
def test_predicates_evaluate_on_arrow_as_sql_does(text, expected):
    assert holds(text, DATA).to_pylist() == expected
    assert holds(text, DATA.to_batches()[0]).to_pylist() == expected


@pytest.mark.parametrize("text", ["id = ", "id === 3", "", "amount + 1"])
def test_predicates_the_engine_cannot_evaluate_are_refused_with_its_reason(text):
    with pytest.raises(PredicateError, match="cannot evaluate") as err:
        check_predicate(text, DATA.schema)
    assert "DataFusion" in str(err.value)
    with pytest.raises(PredicateError):
        holds(text, DATA)


def test_unknown_columns_are_named():
    with pytest.raises(PredicateError, match="nope"):
        check_predicate("nope = 1", DATA.schema)


def test_verdicts_keep_the_row_order_across_batches():
    data = pa.concat_tables(
        [pa.table({"id": pa.array(range(i * 1000, (i + 1) * 1000), pa.int64())}) for i in range(30)]
    )
    assert holds("id % 7 = 3", data).to_pylist() == [i % 7 == 3 for i in range(30_000)]
    assert holds("id > 0", data.schema.empty_table()).to_pylist() == []


def _live_ids(path, *filters) -> list[tuple[int, int]]:
    reader = DeltaBatchReader(resolve_snapshot(path), ReadOptions())
    assert list(reader.pushFilters(list(filters))) == list(filters), "Spark still filters the rows"
    return sorted((f.min_values["id"], f.max_values["id"]) for f in reader.live_files())


def test_pushed_filters_skip_files_by_statistics_through_delta_rs(tmp_path):
    path = str(tmp_path / "t")
    for ids in (range(10, 21), range(30, 41)):  # two files: ids 10..20 and 30..40
        deltalake.write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64())}), mode="append")
    both, low, high = [(10, 20), (30, 40)], [(10, 20)], [(30, 40)]
    assert _live_ids(path, ds.GreaterThan(("id",), 25)) == high
    assert _live_ids(path, ds.GreaterThanOrEqual(("id",), 10)) == both
    assert _live_ids(path, ds.LessThan(("id",), 15)) == low
    assert _live_ids(path, ds.In(("id",), (5, 35))) == high
    assert _live_ids(path, ds.EqualTo(("id",), 50)) == []
    assert _live_ids(path, ds.GreaterThan(("id",), 15), ds.LessThan(("id",), 35)) == both
    assert _live_ids(path, ds.GreaterThan(("id",), 25), ds.LessThan(("id",), 15)) == []
    # Filters delta-rs cannot prune with never skip a file.
    assert _live_ids(path, ds.StringStartsWith(("id",), "1")) == both


def test_pushed_filters_on_partition_values_and_timestamps(tmp_path):
    path = str(tmp_path / "t")
    at = [dt.datetime(2024, 1, 1, h, tzinfo=dt.UTC) for h in (1, 2, 3)]
    data = pa.table(
        {
            "id": pa.array([1, 2, 3], pa.int64()),
            "region": ["EU", "US", None],
            "at": pa.array(at, pa.timestamp("us", tz="UTC")),
        }
    )
    deltalake.write_deltalake(path, data, partition_by=["region"])
    assert _live_ids(path, ds.EqualTo(("region",), "EU")) == [(1, 1)]
    assert _live_ids(path, ds.IsNull(("region",))) == [(3, 3)]
    assert _live_ids(path, ds.Not(ds.EqualTo(("region",), "EU"))) == [(2, 2)]
    assert _live_ids(path, ds.EqualNullSafe(("region",), None)) == [(3, 3)]
    half_past_two = at[1] + dt.timedelta(minutes=30)
    assert _live_ids(path, ds.GreaterThan(("at",), half_past_two)) == [(3, 3)]
    assert _live_ids(path, ds.LessThanOrEqual(("at",), half_past_two)) == [(1, 1), (2, 2)]


def test_pushed_filters_become_sql_delta_rs_prunes_with():
    assert pushed_filter_sql(ds.EqualTo(("o_orderdate",), dt.date(1995, 3, 15))) == "o_orderdate = DATE '1995-03-15'"
    assert pushed_filter_sql(ds.In(("region",), ("EU", "it's"))) == "region IN ('EU', 'it''s')"
    assert pushed_filter_sql(ds.Not(ds.IsNull(("weird name",)))) == 'NOT ("weird name" IS NULL)'
    assert pushed_filter_sql(ds.GreaterThan(("a", "b"), 1)) is None  # nested field
    assert pushed_filter_sql(ds.GreaterThan(("x",), float("nan"))) is None
