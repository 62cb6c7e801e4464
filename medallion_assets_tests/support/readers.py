"""Read a Delta table back without Spark, to check what the package wrote.

Two independent readers: delta-rs (``deltalake``) and DuckDB's ``delta``
extension, loaded from the ``duckdb-extension-delta`` PyPI package (nothing is
downloaded). A table both read correctly is real Delta, not merely something our
own reader understands. :func:`seed_map_of_structs` writes, with deltalake, the
table the schema-evolution tests of maps start from.

Example:
    >>> from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb
    >>> read_with_deltalake("/tmp/t").sort_by("id").to_pylist()  # doctest: +SKIP
    >>> read_with_duckdb("/tmp/t").num_rows  # doctest: +SKIP
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
from pyspark.sql import types as T

__all__ = [
    "SAMPLE_SCHEMA",
    "delta_extension_path",
    "read_with_deltalake",
    "read_with_duckdb",
    "rows",
    "seed_map_of_structs",
]

#: The columns the package's write tests use: keys, strings, decimals, dates, timestamps.
SAMPLE_SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType()),
        T.StructField("region", T.StringType()),
        T.StructField("amount", T.DecimalType(15, 2)),
        T.StructField("day", T.DateType()),
        T.StructField("at", T.TimestampType()),
        T.StructField("note", T.StringType()),
    ]
)


def seed_map_of_structs(path: str, column: str) -> None:
    """Write, with deltalake, a one-row table: ``id`` 1 and ``column`` mapping ``"k"`` to ``{a: 1}``.

    ``column`` is ``map<string, struct<a: long>>``: the schema-evolution tests grow its structs.
    """
    import deltalake

    by_key = pa.map_(pa.string(), pa.struct([("a", pa.int64())]))
    deltalake.write_deltalake(
        path, pa.table({"id": pa.array([1], pa.int64()), column: pa.array([[("k", {"a": 1})]], by_key)})
    )


def _normalize(table: pa.Table) -> pa.Table:
    """Turn view and large string/binary types into the plain ones, for comparisons."""
    fields = []
    for field in table.schema:
        t = field.type
        if pa.types.is_string_view(t) or pa.types.is_large_string(t):
            t = pa.string()
        elif pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
            t = pa.binary()
        fields.append(pa.field(field.name, t, field.nullable, field.metadata))
    schema = pa.schema(fields)
    return table if schema == table.schema else table.cast(schema)


def read_with_deltalake(
    path: str | os.PathLike[str], version: int | None = None, *, storage_options: dict[str, str] | None = None
) -> pa.Table:
    """Read the table at ``path`` (optionally at ``version``) with delta-rs.

    Args:
        path: the table's folder or URI.
        version: the version to read; the latest when None.
        storage_options: deltalake's, for a table in a bucket.

    Returns:
        The rows as a ``pyarrow.Table`` (string views normalised to ``string``).
    """
    from deltalake import DeltaTable

    dt = DeltaTable(str(path), version=version, storage_options=storage_options)
    return _normalize(pa.table(dt.to_pyarrow_table()))


@lru_cache(maxsize=1)
def delta_extension_path() -> str:
    """The ``delta.duckdb_extension`` file shipped inside ``duckdb_extension_delta``."""
    import duckdb_extension_delta

    root = Path(next(iter(duckdb_extension_delta.__path__)))
    found = sorted(root.rglob("*.duckdb_extension"))
    if not found:
        raise FileNotFoundError(f"no .duckdb_extension file under {root}")
    return str(found[0])


def read_with_duckdb(path: str | os.PathLike[str]) -> pa.Table:
    """Read the latest version of the table at ``path`` with DuckDB's delta extension.

    Args:
        path: the table's folder.

    Returns:
        The rows as a ``pyarrow.Table`` (string views normalised to ``string``).
    """
    import duckdb

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.execute(f"LOAD '{delta_extension_path()}'")
        literal = str(path).replace("'", "''")
        result = con.execute(f"SELECT * FROM delta_scan('{literal}')").fetch_arrow_table()
    finally:
        con.close()
    return _normalize(pa.table(result))


def rows(table: pa.Table, *, sort_by: str | list[str] | None = None) -> list[dict]:
    """The rows of ``table`` as dicts, sorted by ``sort_by`` (nulls first) for comparisons."""
    data = table.to_pylist()
    if sort_by is None:
        return data
    keys = [sort_by] if isinstance(sort_by, str) else list(sort_by)
    return sorted(data, key=lambda r: tuple((r[k] is not None, r[k]) for k in keys))
