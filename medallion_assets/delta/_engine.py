"""SQL predicates on Arrow rows, evaluated by Apache DataFusion.

delta-rs parses and evaluates the SQL of a table's CHECK constraints (when it
adds one, and in its own writes), of ``delete``, ``update`` and ``merge`` and
of file pruning with DataFusion: the generic dialect, identifiers matched as
written. The ``delta`` writer runs on Spark's Python workers, which cannot ask
Spark to evaluate SQL, so it hands the same SQL to the same engine (the
``datafusion`` package): CHECK constraints and ``replaceWhere`` on the rows a
task writes, and ``replaceWhere`` on the rows of the files an overwrite may
replace. Nothing here parses or evaluates SQL itself.

Like delta-spark, a row satisfies a predicate only when it is TRUE: FALSE and
NULL both fail a CHECK constraint, and neither is replaced by ``replaceWhere``.
"""

from __future__ import annotations

import os
from types import ModuleType

import pyarrow as pa

from medallion_assets.delta.errors import DeltaError

# The output column of a predicate's verdict; never a column of the input.
_VERDICT = "__delta_predicate_holds"


class PredicateError(DeltaError, ValueError):
    """DataFusion cannot evaluate a predicate on the given columns (its reason is in the message)."""


def load_datafusion() -> ModuleType:
    """The ``datafusion`` package, its allocator first told to return what a query frees.

    The ``datafusion`` wheel links mimalloc, which keeps the pages a query
    freed in the heap of the thread that freed them, for that thread's next
    allocation. Between two queries of a driver (the table checks, between
    Spark steps) those threads idle, so the process grew query after query
    with the largest peaks. ``MIMALLOC_PURGE_DELAY=0`` makes mimalloc give
    freed pages back to the system at once, which keeps the driver from
    growing between steps for a little time per query
    (docs/decisions/0005-driver-memory-bounds.md). mimalloc reads it once, when
    the library loads, so it is set before the first import, and only when
    unset: a value the user exported is kept.
    """
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
    # deferred: mimalloc reads MIMALLOC_PURGE_DELAY when datafusion loads, so it is set just above
    import datafusion

    return datafusion


def _context():
    datafusion = load_datafusion()
    config = (
        datafusion.SessionConfig()
        # delta-rs matches identifiers as written (no lowercasing of unquoted names).
        .set("datafusion.sql_parser.enable_ident_normalization", "false")
        # One partition: the verdicts come back in the rows' order.
        .with_target_partitions(1)
    )
    return datafusion.SessionContext(config)


def _as_table(data: pa.Table | pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data


def holds(predicate: str, data: pa.Table | pa.RecordBatch) -> pa.BooleanArray:
    """Where ``predicate`` is TRUE for each row of ``data`` (FALSE and NULL give False).

    Raises:
        PredicateError: DataFusion cannot parse or evaluate the predicate on these columns.
    """
    table = _as_table(data)
    if table.num_rows == 0:
        check_predicate(predicate, table.schema)
        return pa.array([], pa.bool_())
    try:
        frame = _context().from_arrow(table, name="rows").select_exprs(f"({predicate}) IS TRUE AS {_VERDICT}")
        verdict = frame.to_arrow_table().column(_VERDICT).combine_chunks()
    except Exception as exc:  # DataFusion raises plain Exceptions
        raise PredicateError(f'cannot evaluate "{predicate}": {_reason(exc)}') from exc
    if len(verdict) != table.num_rows:  # pragma: no cover - a projection keeps every row
        raise PredicateError(f'evaluating "{predicate}" returned {len(verdict)} verdicts for {table.num_rows} rows')
    return verdict


def check_predicate(predicate: str, schema: pa.Schema) -> None:
    """Plan ``predicate`` over columns of ``schema``: that it parses, names known columns and is boolean.

    Raises:
        PredicateError: with DataFusion's reason.
    """
    try:
        frame = (
            _context()
            .from_arrow(schema.empty_table(), name="rows")
            .select_exprs(f"({predicate}) IS TRUE AS {_VERDICT}")
        )
        frame.to_arrow_table()
    except Exception as exc:
        raise PredicateError(f'cannot evaluate "{predicate}": {_reason(exc)}') from exc


def _reason(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(lines) if lines else type(exc).__name__
