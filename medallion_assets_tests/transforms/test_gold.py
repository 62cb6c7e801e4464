"""Gold: the TPC-H queries against DuckDB's ``tpch`` extension, and the
business tables against the same aggregations written in DuckDB SQL, on the
TPC-H data the simulator generates (scale factor 0.01)."""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path

import pytest
from pyspark.testing import assertDataFrameEqual

from medallion_assets.pipelines.tpch import gold_transforms as gold
from medallion_assets.pipelines.tpch import simulator
from medallion_assets.pipelines.tpch import transforms as silver
from medallion_assets.pipelines.tpch import transforms as tpch
from medallion_assets.transforms import bronze

duckdb = pytest.importorskip("duckdb")
SCALE_FACTOR = 0.01


def _tpch_extension_file() -> Path:
    import duckdb_extension_tpch

    return next(Path(duckdb_extension_tpch.__file__).parent.rglob("*.duckdb_extension"))


@pytest.fixture(scope="module")
def tpch_arrow():
    return simulator.tpch_tables(scale_factor=SCALE_FACTOR)


@pytest.fixture(scope="module")
def duck(tpch_arrow):
    connection = duckdb.connect()
    # Loaded from the PyPI package's file: nothing is downloaded.
    connection.execute(f"LOAD '{_tpch_extension_file()}'")
    for name, table in tpch_arrow.items():
        connection.register(name, table)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def tables(spark, tpch_arrow):
    frames = {name: spark.createDataFrame(table).cache() for name, table in tpch_arrow.items()}
    yield frames
    for frame in frames.values():
        frame.unpersist()


def _tpch_query(duck, number: int) -> tuple[list[str], list[tuple]]:
    query = duck.execute("SELECT query FROM tpch_queries() WHERE query_nr = ?", [number]).fetchone()[0]
    result = duck.execute(query)
    return [column[0] for column in result.description], result.fetchall()


def _assert_rows_equal(actual: list[tuple], expected: list[tuple], approximate: frozenset[int] = frozenset()):
    """Exact comparison, except columns that DuckDB answers as doubles."""
    assert len(actual) == len(expected)
    for actual_row, expected_row in zip(actual, expected, strict=False):
        assert len(actual_row) == len(expected_row)
        for index, (got, want) in enumerate(zip(actual_row, expected_row, strict=False)):
            if index in approximate and got is not None and want is not None:
                assert math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-6), (actual_row, expected_row)
            else:
                assert got == want, (index, actual_row, expected_row)


def _rows(frame) -> list[tuple]:
    return [tuple(row) for row in frame.collect()]


def test_q1_pricing_summary_equals_duckdb(duck, tables):
    columns, expected = _tpch_query(duck, 1)
    result = gold.pricing_summary(tables["lineitem"])

    assert result.columns == columns
    # DuckDB averages decimals as doubles; Spark keeps decimal(19,6).
    _assert_rows_equal(_rows(result), expected, approximate=frozenset({6, 7, 8}))
    assert isinstance(result.collect()[0].sum_charge, Decimal)


def test_q1_pricing_summary_equals_spark_sql_of_the_same_query_to_the_last_digit(duck, tables):
    # The transform sums per discount and tax before its products; Spark SQL runs TPC-H's text (DuckDB's)
    # over the line items as written: its decimal averages and column types must come out the same.
    query = duck.execute("SELECT query FROM tpch_queries() WHERE query_nr = 1").fetchone()[0]
    lineitem = tables["lineitem"]
    lineitem.createOrReplaceTempView("lineitem")
    try:
        as_written = lineitem.sparkSession.sql(query.rstrip().rstrip(";"))
        result = gold.pricing_summary(lineitem)
        assert result.schema == as_written.schema
        assertDataFrameEqual(result, as_written, checkRowOrder=True)
    finally:
        lineitem.sparkSession.catalog.dropTempView("lineitem")


def test_q3_shipping_priority_equals_duckdb(duck, tables):
    columns, expected = _tpch_query(duck, 3)
    result = gold.shipping_priority(tables["customer"], tables["orders"], tables["lineitem"])

    assert result.columns == columns
    assert len(expected) == 10
    _assert_rows_equal(_rows(result), expected)


def test_q5_local_supplier_volume_equals_duckdb(duck, tables):
    columns, expected = _tpch_query(duck, 5)
    result = gold.local_supplier_volume(
        tables["customer"], tables["orders"], tables["lineitem"], tables["supplier"], tables["nation"], tables["region"]
    )

    assert result.columns == columns
    assert expected
    _assert_rows_equal(_rows(result), expected)


def test_q6_forecasting_revenue_change_equals_duckdb(duck, tables):
    columns, expected = _tpch_query(duck, 6)
    result = gold.forecasting_revenue_change(tables["lineitem"])

    assert result.columns == columns
    _assert_rows_equal(_rows(result), expected)


def test_daily_revenue_equals_duckdb(duck, tables):
    expected = duck.execute(
        """
        SELECT o_orderdate, c_mktsegment,
               sum(l_extendedprice * (1 - l_discount)) AS revenue,
               count(DISTINCT o_orderkey) AS order_count
        FROM orders
        JOIN lineitem ON l_orderkey = o_orderkey
        JOIN customer ON c_custkey = o_custkey
        GROUP BY o_orderdate, c_mktsegment
        ORDER BY o_orderdate, c_mktsegment
        """
    ).fetchall()
    result = gold.daily_revenue(tables["orders"], tables["lineitem"], tables["customer"])

    assert result.columns == ["o_orderdate", "c_mktsegment", "revenue", "order_count"]
    _assert_rows_equal(_rows(result), expected)


def test_monthly_revenue_counts_completed_orders_only(duck, tables):
    expected = duck.execute(
        """
        SELECT CAST(date_trunc('month', o_orderdate) AS DATE) AS order_month,
               sum(l_extendedprice * (1 - l_discount)) AS revenue,
               count(DISTINCT o_orderkey) AS order_count
        FROM orders JOIN lineitem ON l_orderkey = o_orderkey
        WHERE o_orderstatus = 'F'
        GROUP BY 1 ORDER BY 1
        """
    ).fetchall()
    result = gold.monthly_revenue(tables["orders"], tables["lineitem"])

    assert result.columns == ["order_month", "revenue", "order_count"]
    _assert_rows_equal(_rows(result), expected)


def test_customer_lifetime_value_equals_duckdb(duck, tables):
    expected = duck.execute(
        """
        SELECT c_custkey, c_name, c_mktsegment,
               count(o_orderkey) AS order_count,
               coalesce(sum(o_totalprice), 0) AS total_spend,
               min(o_orderdate), max(o_orderdate),
               avg(o_totalprice)
        FROM customer LEFT JOIN orders ON o_custkey = c_custkey
        GROUP BY c_custkey, c_name, c_mktsegment
        ORDER BY c_custkey
        """
    ).fetchall()
    result = gold.customer_lifetime_value(tables["customer"], tables["orders"])

    assert result.columns == [
        "c_custkey",
        "c_name",
        "c_mktsegment",
        "order_count",
        "total_spend",
        "first_order_date",
        "last_order_date",
        "avg_order_value",
    ]
    rows = _rows(result)
    assert any(row[3] == 0 for row in rows), "TPC-H has customers without orders"
    _assert_rows_equal(rows, expected, approximate=frozenset({7}))


def _published_answer(duck, number: int) -> tuple[list[str], list[list[str]]]:
    """The TPC-H reference answer that ships with the extension, as text."""
    answer = duck.execute(
        "SELECT answer FROM tpch_answers() WHERE query_nr = ? AND scale_factor = ?", [number, SCALE_FACTOR]
    ).fetchone()[0]
    header, *lines = answer.strip().split("\n")
    return header.split("|"), [line.split("|") for line in lines]


def _assert_matches_published(duck, number: int, result, approximate: frozenset[int] = frozenset()):
    columns, answer = _published_answer(duck, number)
    assert result.columns == columns
    rows = _rows(result)
    assert len(rows) == len(answer)
    for row, expected in zip(rows, answer, strict=False):
        for index, (got, text) in enumerate(zip(row, expected, strict=False)):
            if index in approximate:
                assert math.isclose(float(got), float(text), rel_tol=1e-9, abs_tol=1e-6), (row, expected)
            elif isinstance(got, Decimal):
                assert got == Decimal(text), (row, expected)
            else:
                assert str(got) == text, (row, expected)


def _tpch_answers(duck, customer, orders, lineitem, supplier, nation, region):
    _assert_matches_published(duck, 1, gold.pricing_summary(lineitem), approximate=frozenset({6, 7, 8}))
    _assert_matches_published(duck, 3, gold.shipping_priority(customer, orders, lineitem))
    _assert_matches_published(duck, 5, gold.local_supplier_volume(customer, orders, lineitem, supplier, nation, region))
    _assert_matches_published(duck, 6, gold.forecasting_revenue_change(lineitem))


def test_gold_on_tpch_equals_the_published_answers(duck, tables):
    _tpch_answers(
        duck,
        tables["customer"],
        tables["orders"],
        tables["lineitem"],
        tables["supplier"],
        tables["nation"],
        tables["region"],
    )


@pytest.mark.slow
def test_gold_on_silver_of_a_noisy_delivery_equals_the_published_answers(spark, duck, tmp_path):
    landing = tmp_path / "landing"
    simulator.land_all(landing, scale_factor=SCALE_FACTOR, batches=2, seed=7)

    from medallion_assets.expectations import meets_dropping_expectations
    from medallion_assets.pipelines.tpch.feeds import CUSTOMERS_EXPECTATIONS
    from medallion_assets.pipelines.tpch.silver import LINEITEM_EXPECTATIONS, ORDERS_EXPECTATIONS

    events, _ = silver.parse_order_events(bronze.landed_lines(spark.read.text(str(landing / "orders"))))
    winners = silver.latest_order_changes(events).cache()
    # What silver keeps: the rows that meet the drop expectations, which the noisy delivery trips.
    orders = silver.order_rows(winners).where(meets_dropping_expectations(ORDERS_EXPECTATIONS)).cache()
    lineitem = silver.lineitem_rows(winners).where(meets_dropping_expectations(LINEITEM_EXPECTATIONS)).cache()
    reader = spark.read.schema(tpch.CUSTOMERS_CSV_READ_SCHEMA).options(**tpch.CUSTOMERS_CSV_OPTIONS)
    changes, _ = silver.parse_customer_changes(tpch.customers_cdc(reader.csv(str(landing / "customers"))))
    customer = silver.mask_customer_pii(
        silver.latest_customer_state(changes).where(meets_dropping_expectations(CUSTOMERS_EXPECTATIONS))
    ).cache()
    assert silver.order_rows(winners).count() > 15_000, "the noisy delivery has orders the expectations drop"
    reference = {}
    for table in ("supplier", "nation", "region"):
        newest = bronze.latest_snapshot([str(p) for p in (landing / "reference" / table).iterdir()])
        reference[table] = silver.conform_reference(spark.read.parquet(newest), table)

    assert orders.count() == 15_000
    _tpch_answers(duck, customer, orders, lineitem, reference["supplier"], reference["nation"], reference["region"])
    for frame in (winners, orders, lineitem, customer):
        frame.unpersist()
