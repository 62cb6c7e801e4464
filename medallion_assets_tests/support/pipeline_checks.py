"""Checks of a TPC-H pipeline's lake after its runs, shared by the tests that run the whole pipeline.

Silver equals the landing contract's state computed independently (``contract_reference``),
gold's TPC-H tables equal DuckDB's TPC-H queries over the same silver tables, and no asset
check failed with severity ERROR.
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

from dagster import AssetCheckSeverity, materialize

from medallion_assets_tests.support import contract_reference
from medallion_assets_tests.support.readers import delta_extension_path, read_with_deltalake, rows

#: The simulator's seed of the pipeline tests' deliveries.
SEED = 11

#: gold table -> TPC-H query number.
TPCH_GOLD = {"pricing_summary": 1, "shipping_priority": 3, "local_supplier_volume": 5, "forecasting_revenue_change": 6}
#: DuckDB's TPC-H table names -> silver tables.
TPCH_TABLES = {
    "lineitem": "lineitem",
    "orders": "orders",
    "customer": "customers",
    "nation": "nation",
    "region": "region",
    "supplier": "supplier",
    "part": "part",
    "partsupp": "partsupp",
}
SILVER_KEYS = {
    "orders": ["o_orderkey"],
    "lineitem": ["l_orderkey", "l_linenumber"],
    "customers": ["c_custkey"],
    "nation": ["n_nationkey"],
    "region": ["r_regionkey"],
    "part": ["p_partkey"],
    "supplier": ["s_suppkey"],
    "partsupp": ["ps_partkey", "ps_suppkey"],
}


@lru_cache(maxsize=1)
def _tpch_extension_path() -> str:
    import duckdb_extension_tpch

    root = Path(next(iter(duckdb_extension_tpch.__path__)))
    return str(sorted(root.rglob("*.duckdb_extension"))[0])


def _table(lake: Path | str, layer: str, table: str) -> str:
    """A table's location in a lake: a folder, or a URI (``s3://bucket/prefix``)."""
    return f"{str(lake).rstrip('/')}/{layer}/{table}"


def duckdb_tpch_answers(lake: Path | str, *, storage_options: dict[str, str] | None = None) -> dict[int, list[dict]]:
    """TPC-H queries 1, 3, 5, 6 as DuckDB's tpch extension writes them, over the silver tables.

    A local lake is read by DuckDB's delta extension; a lake in a bucket (``storage_options`` given) through
    deltalake's Arrow datasets of its tables (``to_pyarrow_dataset``), since DuckDB reaches S3 only through its
    httpfs extension, which no package the tests install carries.
    """
    import duckdb
    from deltalake import DeltaTable

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(f"LOAD '{delta_extension_path()}'")
        con.execute(f"LOAD '{_tpch_extension_path()}'")
        for name, silver in TPCH_TABLES.items():
            location = _table(lake, "silver", silver)
            if storage_options is None:
                con.execute(f"CREATE VIEW {name} AS SELECT * FROM delta_scan('{location}')")
            else:
                con.register(name, DeltaTable(location, storage_options=storage_options).to_pyarrow_dataset())
        answers = {}
        for number in TPCH_GOLD.values():
            [query] = con.execute("SELECT query FROM tpch_queries() WHERE query_nr = ?", [number]).fetchone()
            answers[number] = con.execute(query).fetch_arrow_table().to_pylist()
        return answers
    finally:
        con.close()


def _same_value(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        # Q1's averages: DuckDB answers a double, Spark's decimal avg keeps 6 decimals (rounded).
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=5e-7)
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return a is not None and b is not None and Decimal(a) == Decimal(b)
    return a == b


def assert_same_rows(gold: list[dict], duck: list[dict], what: str) -> None:
    assert gold and duck, f"{what}: empty answer"
    assert set(gold[0]) == set(duck[0]), f"{what}: columns {sorted(gold[0])} != {sorted(duck[0])}"
    columns = list(duck[0])
    order = lambda r: tuple(str(r[c]) for c in columns)  # noqa: E731
    gold, duck = sorted(gold, key=order), sorted(duck, key=order)
    assert len(gold) == len(duck), f"{what}: {len(gold)} rows != {len(duck)}"
    for g, d in zip(gold, duck, strict=False):
        assert all(_same_value(g[c], d[c]) for c in columns), f"{what}: {g} != {d}"


def landed_lines(files) -> dict[str, int]:
    counts = {}
    for path in files:
        if path.suffix == ".json":
            counts[path.name] = sum(1 for _ in path.open(encoding="utf-8"))
    return counts


def materialize_everything(defs, instance):
    assets = [a for a in defs.assets if not any(k.path[0] == "landing" for k in getattr(a, "keys", []))]
    checks = list(defs.asset_checks)
    result = materialize(
        [*assets, *checks],
        resources=defs.resources,
        instance=instance,
    )
    assert result.success
    return result


def assert_no_check_errs(result) -> int:
    """No check failed with severity ERROR; WARN failures (rows of the noisy feed dropped or rejected) are allowed."""
    evaluations = result.get_asset_check_evaluations()
    failed = [
        (e.asset_key.to_user_string(), e.check_name, dict(e.metadata))
        for e in evaluations
        if not e.passed and e.severity == AssetCheckSeverity.ERROR
    ]
    assert not failed, failed
    return len(evaluations)


def assert_silver_matches_contract(
    lake: Path | str, *, landing: Path | None = None, storage_options: dict[str, str] | None = None
) -> None:
    """Silver equals the contract's state of ``landing`` (default: the lake's own, for a local lake)."""
    expected = contract_reference.expected_silver_state(landing or Path(lake) / "landing")
    expected["customers"] = contract_reference.masked_customers(expected["customers"])
    for table, keys in SILVER_KEYS.items():
        want = expected[table]
        got = read_with_deltalake(_table(lake, "silver", table), storage_options=storage_options)
        got = got.select(want.column_names)
        assert got.num_rows == want.num_rows, table
        assert rows(got, sort_by=keys) == rows(want, sort_by=keys), table


def assert_history_is_closed(lake: Path) -> None:
    """One open (current) history row per customer, across runs; the live ones are silver's customers."""
    history = read_with_deltalake(lake / "silver" / "customers_history").to_pylist()
    current = [r for r in history if r["is_current"]]
    assert all(r["valid_to"] is None for r in current)
    assert all(r["valid_to"] is not None and r["valid_to"] >= r["valid_from"] for r in history if not r["is_current"])
    assert len(current) == len({r["c_custkey"] for r in current}) == len({r["c_custkey"] for r in history})
    live = {r["c_custkey"] for r in current if not r["is_deleted"]}
    assert live == set(read_with_deltalake(lake / "silver" / "customers").column("c_custkey").to_pylist())


def assert_gold_matches_duckdb(lake: Path | str, *, storage_options: dict[str, str] | None = None) -> None:
    """Gold's TPC-H tables, read with deltalake, equal DuckDB's TPC-H answers over silver."""
    answers = duckdb_tpch_answers(lake, storage_options=storage_options)
    for table, number in TPCH_GOLD.items():
        gold = read_with_deltalake(_table(lake, "gold", table), storage_options=storage_options).to_pylist()
        assert_same_rows(gold, answers[number], f"gold/{table} vs TPC-H Q{number}")
