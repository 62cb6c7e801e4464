"""Table-level asset checks: key uniqueness, referential integrity, freshness.

Row expectations live next to their asset (see ``expectations.py``); these
checks look at a whole stored table, after it is written. Each reports the
rows that pass and fail, so a failing check says how bad things are.

The key and reference checks read their tables as a
:class:`~medallion_assets.io_manager.TableRead`: a table of at most the IO
manager's ``arrow_read_max_rows`` rows is counted in Arrow, read by delta-rs,
and a larger one by Spark; the counts are the same either way.
"""
# No ``from __future__ import annotations``: Dagster reads the annotations at runtime.

import warnings
from collections.abc import Iterable, Sequence
from datetime import timedelta

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    AssetIn,
    AssetKey,
    MetadataValue,
    AssetsDefinition,
    SensorDefinition,
    SupersessionWarning,
    asset_check,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
)
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from medallion_assets.feeds import ApplyChanges, Feed
from medallion_assets.io_manager import TableRead, check_once_per_version

#: Check metadata: what computed the counts, Arrow (delta-rs read the table) or Spark.
COMPUTED_WITH = "computed_with"


def count_duplicate_keys(rows: DataFrame | pa.Table, keys: Sequence[str]) -> tuple[int, int, int]:
    """``(rows, rows whose key occurs more than once, duplicated keys)``; a null key counts as failing.

    ``rows``: a Spark DataFrame, or an Arrow table holding at least ``keys``.
    """
    if isinstance(rows, pa.Table):
        return _duplicate_keys_in_arrow(rows, keys)
    per_key = rows.groupBy(*keys).agg(F.count(F.lit(1)).alias("_n"))
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


def _duplicate_keys_in_arrow(table: pa.Table, keys: Sequence[str]) -> tuple[int, int, int]:
    if table.num_rows == 0:
        return 0, 0, 0
    per_key = table.select(list(keys)).group_by(list(keys)).aggregate([([], "count_all")])
    counts = per_key.column("count_all")
    bad = pc.greater(counts, 1)
    for k in keys:
        bad = pc.or_(bad, pc.is_null(per_key.column(k)))
    failing = pc.sum(pc.if_else(bad, counts, 0)).as_py()
    return table.num_rows, int(failing), int(pc.sum(pc.cast(bad, pa.int64())).as_py())


def count_orphans(
    child: DataFrame | pa.Table, foreign_keys: Sequence[str], parent: DataFrame | pa.Table, parent_keys: Sequence[str]
) -> tuple[int, int]:
    """``(child rows, child rows with no parent)``; a null foreign key counts as an orphan.

    Both tables Spark DataFrames, or both Arrow tables holding at least the key
    columns. One pass over the child: each row meets at most one of the
    distinct parent keys, so a left join keeps the child's rows, and those it
    found no parent for are counted in the same aggregate.
    """
    if isinstance(child, pa.Table) and isinstance(parent, pa.Table):
        # A left anti join keeps each child row without a parent once, and a null key matches nothing.
        parents = parent.select(list(parent_keys))
        children = child.select(list(foreign_keys))
        for fk, pk in zip(foreign_keys, parent_keys):
            wanted = parents.schema.field(pk).type
            if children.schema.field(fk).type != wanted:
                children = children.set_column(children.schema.get_field_index(fk), fk,
                                               pc.cast(children.column(fk), wanted))
        orphans = children.join(parents, keys=list(foreign_keys), right_keys=list(parent_keys), join_type="left anti")
        return child.num_rows, orphans.num_rows
    parents = (
        parent.select(*[F.col(p).alias(f"_fk{i}") for i, p in enumerate(parent_keys)])
        .distinct()
        .withColumn("_has_parent", F.lit(True))
    )
    condition = None
    for i, fk in enumerate(foreign_keys):
        term = F.col(fk) == F.col(f"_fk{i}")
        condition = term if condition is None else condition & term
    totals = (
        child.select(*foreign_keys)
        .join(parents, condition, "left")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(F.col("_has_parent").isNull(), 1)).alias("orphans"),
        )
        .first()
    )
    return int(totals["rows"]), int(totals["orphans"])


def unique_key_check(table: str, keys: Sequence[str]) -> AssetChecksDefinition:
    """A blocking check that ``keys`` identify one row of ``silver.<table>``."""
    key = AssetKey(["silver", table])
    name = f"{table}_key_unique"

    @asset_check(
        asset=key,
        name=name,
        description=f"({', '.join(keys)}) is present and unique in silver.{table}.",
        blocking=True,
    )
    def _unique(context: AssetCheckExecutionContext, stored: TableRead) -> AssetCheckResult:
        def evaluate() -> AssetCheckResult:
            key_rows = stored.arrow(keys)
            rows, failing, bad_keys = count_duplicate_keys(stored.frame if key_rows is None else key_rows, keys)
            return AssetCheckResult(
                asset_key=key,
                check_name=name,
                passed=failing == 0,
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "key": MetadataValue.json(list(keys)),
                    "passing_rows": rows - failing,
                    "failing_rows": failing,
                    "duplicated_or_null_keys": bad_keys,
                    COMPUTED_WITH: "Spark" if key_rows is None else "Arrow",
                },
            )

        return check_once_per_version(context, AssetCheckKey(key, name), evaluate)

    return _unique


def reference_check(child: str, foreign_keys: Sequence[str], parent: str, parent_keys: Sequence[str]) -> AssetChecksDefinition:
    """Every ``silver.<child>`` row points at an existing ``silver.<parent>`` row."""

    key = AssetKey(["silver", child])
    name = f"{child}_references_{parent}"

    @asset_check(
        asset=key,
        name=name,
        description=f"Every {child}.({', '.join(foreign_keys)}) exists in {parent}.({', '.join(parent_keys)}).",
        additional_ins={"parent_table": AssetIn(key=AssetKey(["silver", parent]))},
    )
    def _references(context: AssetCheckExecutionContext, child_table: TableRead,
                    parent_table: TableRead) -> AssetCheckResult:
        def evaluate() -> AssetCheckResult:
            in_arrow = child_table.small and parent_table.small
            if in_arrow:
                rows, orphans = count_orphans(child_table.arrow(foreign_keys), foreign_keys,
                                              parent_table.arrow(parent_keys), parent_keys)
            else:
                rows, orphans = count_orphans(child_table.frame, foreign_keys, parent_table.frame, parent_keys)
            return AssetCheckResult(
                asset_key=key,
                check_name=name,
                passed=orphans == 0,
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "references": f"{child}.{','.join(foreign_keys)} -> {parent}.{','.join(parent_keys)}",
                    "passing_rows": rows - orphans,
                    "failing_rows": orphans,
                    COMPUTED_WITH: "Arrow" if in_arrow else "Spark",
                },
            )

        return check_once_per_version(context, AssetCheckKey(key, name), evaluate)

    return _references


#: Silver runs hourly (ingest) and the refresh job daily: allow a day and a bit.
SILVER_MAX_LAG_HOURS = 26.0

#: The name Dagster gives a last-update freshness check.
FRESHNESS_CHECK = "freshness_check"


def last_update_freshness_checks(
    assets: Iterable[AssetKey | AssetsDefinition], *, max_lag_hours: float
) -> list[AssetChecksDefinition]:
    """Dagster's own freshness check (one ``freshness_check`` per asset), WARN past ``max_lag_hours``.

    It passes when the latest materialization is at most the lag old, and
    records until when it stays fresh, which the freshness sensor
    (:func:`freshness_sensor`) uses to evaluate it again once it could be
    overdue, without waiting for the asset's next run.

    Dagster 1.13 marks these builders superseded by ``FreshnessPolicy``. A
    policy feeds the asset's health in the UI but is not an asset check, and
    this project's checks are what CI (``medallion-assets check``) and the
    blocking rules gate on, so freshness stays a check; the supersession
    warning is silenced here, once, instead of greeting every ``dg dev``.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)
        return list(build_last_update_freshness_checks(
            assets=list(assets),
            lower_bound_delta=timedelta(hours=max_lag_hours),
            severity=AssetCheckSeverity.WARN,
        ))


def freshness_sensor(checks: Iterable[AssetChecksDefinition]) -> SensorDefinition:
    """The sensor that evaluates the freshness checks among ``checks`` once one could be overdue."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)  # see last_update_freshness_checks
        return build_sensor_for_freshness_checks(freshness_checks=freshness_checks_among(checks))


def silver_freshness_checks(tables: Iterable[str]) -> list[AssetChecksDefinition]:
    """The freshness checks of ``silver.<table>`` for each table, WARN past :data:`SILVER_MAX_LAG_HOURS`."""
    return last_update_freshness_checks(
        [AssetKey(["silver", table]) for table in tables], max_lag_hours=SILVER_MAX_LAG_HOURS
    )


def feed_checks(feeds: Iterable[Feed]) -> list[AssetChecksDefinition]:
    """The table checks of the feeds' silver tables: keys present and unique, and freshness for change feeds."""
    checks = []
    for feed in feeds:
        # ApplyChanges always has keys; a Replace snapshot may declare none.
        if feed.silver is not None and feed.silver.keys:
            checks.append(unique_key_check(feed.silver.table, feed.silver.keys))
    changed = [feed.silver.table for feed in feeds if isinstance(feed.silver, ApplyChanges)]
    return [*checks, *(silver_freshness_checks(changed) if changed else [])]


def freshness_checks_among(checks: Iterable[AssetChecksDefinition]) -> list[AssetChecksDefinition]:
    """The freshness checks among ``checks`` (what the freshness sensor evaluates)."""
    return [c for c in checks if any(spec.name == FRESHNESS_CHECK for spec in c.check_specs)]
