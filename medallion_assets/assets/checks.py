"""Table-level asset checks: key uniqueness, referential integrity, freshness.

Row expectations live next to their asset (see ``expectations.py``); these
checks look at a whole stored table, after it is written. Each reports the
rows that pass and fail, so a failing check says how bad things are.
"""
# No ``from __future__ import annotations``: Dagster reads the annotations at runtime.

from collections.abc import Sequence
from datetime import timedelta

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    AssetIn,
    AssetKey,
    MetadataValue,
    asset_check,
    build_last_update_freshness_checks,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

#: Key columns of every silver table.
SILVER_KEYS: dict[str, tuple[str, ...]] = {
    "orders": ("o_orderkey",),
    "lineitem": ("l_orderkey", "l_linenumber"),
    "customers": ("c_custkey",),
    "nation": ("n_nationkey",),
    "region": ("r_regionkey",),
    "part": ("p_partkey",),
    "supplier": ("s_suppkey",),
    "partsupp": ("ps_partkey", "ps_suppkey"),
}

#: (child table, its foreign key columns, parent table, the parent's key columns).
SILVER_REFERENCES: tuple[tuple[str, tuple[str, ...], str, tuple[str, ...]], ...] = (
    ("lineitem", ("l_orderkey",), "orders", ("o_orderkey",)),
    ("orders", ("o_custkey",), "customers", ("c_custkey",)),
    ("customers", ("c_nationkey",), "nation", ("n_nationkey",)),
)


def count_duplicate_keys(frame: DataFrame, keys: Sequence[str]) -> tuple[int, int, int]:
    """``(rows, rows whose key occurs more than once, duplicated keys)``; a null key counts as failing."""
    per_key = frame.groupBy(*keys).agg(F.count(F.lit(1)).alias("_n"))
    null_key = F.lit(False)
    for k in keys:
        null_key = null_key | F.col(k).isNull()
    bad = (F.col("_n") > 1) | null_key
    totals = per_key.agg(
        F.coalesce(F.sum("_n"), F.lit(0)).alias("rows"),
        F.coalesce(F.sum(F.when(bad, F.col("_n")).otherwise(0)), F.lit(0)).alias("failing"),
        F.coalesce(F.sum(F.when(bad, 1).otherwise(0)), F.lit(0)).alias("bad_keys"),
    ).first()
    return int(totals["rows"]), int(totals["failing"]), int(totals["bad_keys"])


def count_orphans(child: DataFrame, foreign_keys: Sequence[str], parent: DataFrame, parent_keys: Sequence[str]) -> tuple[int, int]:
    """``(child rows, child rows with no parent)``; a null foreign key counts as an orphan."""
    parents = parent.select(*[F.col(p).alias(f"_fk{i}") for i, p in enumerate(parent_keys)]).distinct()
    condition = None
    for i, fk in enumerate(foreign_keys):
        term = F.col(fk) == F.col(f"_fk{i}")
        condition = term if condition is None else condition & term
    orphans = child.select(*foreign_keys).join(parents, condition, "left_anti")
    return child.count(), orphans.count()


def unique_key_check(table: str, keys: Sequence[str]) -> AssetChecksDefinition:
    """A blocking check that ``keys`` identify one row of ``silver.<table>``."""
    key = AssetKey(["silver", table])

    @asset_check(
        asset=key,
        name=f"{table}_key_unique",
        description=f"({', '.join(keys)}) is present and unique in silver.{table}.",
        blocking=True,
    )
    def _unique(stored: DataFrame) -> AssetCheckResult:
        rows, failing, bad_keys = count_duplicate_keys(stored, keys)
        return AssetCheckResult(
            passed=failing == 0,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "key": MetadataValue.json(list(keys)),
                "passing_rows": rows - failing,
                "failing_rows": failing,
                "duplicated_or_null_keys": bad_keys,
            },
        )

    return _unique


def reference_check(child: str, foreign_keys: Sequence[str], parent: str, parent_keys: Sequence[str]) -> AssetChecksDefinition:
    """Every ``silver.<child>`` row points at an existing ``silver.<parent>`` row."""

    @asset_check(
        asset=AssetKey(["silver", child]),
        name=f"{child}_references_{parent}",
        description=f"Every {child}.({', '.join(foreign_keys)}) exists in {parent}.({', '.join(parent_keys)}).",
        additional_ins={"parent_table": AssetIn(key=AssetKey(["silver", parent]))},
    )
    def _references(child_table: DataFrame, parent_table: DataFrame) -> AssetCheckResult:
        rows, orphans = count_orphans(child_table, foreign_keys, parent_table, parent_keys)
        return AssetCheckResult(
            passed=orphans == 0,
            severity=AssetCheckSeverity.ERROR,
            metadata={
                "references": f"{child}.{','.join(foreign_keys)} -> {parent}.{','.join(parent_keys)}",
                "passing_rows": rows - orphans,
                "failing_rows": orphans,
            },
        )

    return _references


#: Silver runs hourly (ingest) and the refresh job daily: allow a day and a bit.
SILVER_MAX_LAG_HOURS = 26.0

uniqueness_checks = [unique_key_check(table, keys) for table, keys in SILVER_KEYS.items()]
integrity_checks = [reference_check(*reference) for reference in SILVER_REFERENCES]
# Dagster's own freshness check (one check named "freshness_check" per table):
# passes when the latest materialization is at most the lag old, and records
# until when it stays fresh, which the freshness sensor uses to evaluate it
# again once it could be overdue, without waiting for the table's next run.
silver_freshness_checks = build_last_update_freshness_checks(
    assets=[AssetKey(["silver", table]) for table in ("orders", "lineitem", "customers")],
    lower_bound_delta=timedelta(hours=SILVER_MAX_LAG_HOURS),
    severity=AssetCheckSeverity.WARN,
)

silver_checks = [*uniqueness_checks, *integrity_checks, *silver_freshness_checks]
