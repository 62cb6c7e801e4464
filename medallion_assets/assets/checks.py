"""Table-level asset checks: key uniqueness, referential integrity, freshness.

Row expectations live next to their asset (see ``expectations.py``); these
checks look at a whole stored table, after it is written. Each reports the
rows that pass and fail, so a failing check says how bad things are.

The key and reference checks read their tables as a
:class:`~medallion_assets.io_manager.TableRead`. A table delta-rs reads is
counted by DataFusion on delta-rs' table, which reads the key columns within
a memory bound (its aggregation spills to disk past it) and runs no Spark
job; a table delta-rs cannot read, or a count past that bound, is
counted by Spark. The counts are the same either way.
"""
# No ``from __future__ import annotations``: Dagster reads the annotations at runtime.

import uuid
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeAlias, TypeVar

import pyarrow as pa
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckKey,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetExecutionContext,
    AssetIn,
    AssetKey,
    AssetsDefinition,
    MetadataValue,
    SensorDefinition,
    SupersessionWarning,
    asset_check,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
)
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from medallion_assets.delta import load_datafusion
from medallion_assets.feeds import ApplyChanges, Feed
from medallion_assets.io_manager import TableRead, check_once_per_version
from medallion_assets.settings import is_s3_uri

#: Check metadata: what computed the counts, DataFusion (delta-rs read the tables) or Spark.
COMPUTED_WITH = "computed_with"


#: The memory DataFusion may take for one check's count, in the driver's process. Its aggregations spill
#: to disk past it, so the key and reference checks stay within it at any size; a join's build side
#: cannot spill, so a reconciliation that needs more is handed to Spark, whose heap is bounded too. Why
#: this size and not more: docs/decisions/0005-driver-memory-bounds.md.
DATAFUSION_MEMORY_BYTES = 128 * 1024 * 1024

#: What a check counts: a Spark DataFrame, or rows DataFusion reads (an Arrow table, a table delta-rs opened).
CheckedRows: TypeAlias = DataFrame | pa.Table | DeltaTable


_Counts = TypeVar("_Counts")


class DataFusionOutOfMemory(RuntimeError):
    """DataFusion needed more than :data:`DATAFUSION_MEMORY_BYTES` for a query."""


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'


def one_row(sql: str, tables: Mapping[str, CheckedRows]) -> dict[str, Any]:
    """The one row of ``sql``, whose ``{name}`` placeholders stand for ``tables``.

    Spark SQL runs it when every table is a Spark DataFrame (each a temporary
    view for the query); DataFusion when they are Arrow tables or tables
    delta-rs opened, reading what the query needs of them within
    :data:`DATAFUSION_MEMORY_BYTES`. A query meant for both is written in the
    SQL both read.

    Raises:
        DataFusionOutOfMemory: DataFusion needed more memory than its bound.
    """
    frames = [table for table in tables.values() if isinstance(table, DataFrame)]
    if frames:
        if len(frames) != len(tables):
            raise TypeError("one_row: the tables are all Spark DataFrames or none is")
        return _one_row_in_spark(sql, {name: frame for name, frame in tables.items() if isinstance(frame, DataFrame)})

    datafusion = load_datafusion()
    context = datafusion.SessionContext(
        datafusion.SessionConfig()
        .set("datafusion.sql_parser.enable_ident_normalization", "false")
        # One partition. Under a memory bound, DataFusion's repartitioning between two or more partitions
        # can deadlock once it spills (apache/datafusion#24883, delta-io/delta-rs#4614): the query neither
        # returns nor fails, and the check's step never ends. One partition also needs less memory
        # (docs/decisions/0002-checks-counted-by-datafusion.md).
        .with_target_partitions(1),
        datafusion.RuntimeEnvBuilder().with_disk_manager_os().with_fair_spill_pool(DATAFUSION_MEMORY_BYTES),
    )
    for name, rows in tables.items():
        if isinstance(rows, pa.Table):
            context.from_arrow(rows, name=name)
        elif isinstance(rows, DeltaTable) and is_s3_uri(rows.table_uri):
            # In a bucket, the table's Arrow dataset: delta-rs' table provider has DataFusion's session
            # read the files, and that session has no store for the bucket; the dataset reads with the
            # table's own storage options.
            context.register_dataset(name, rows.to_pyarrow_dataset())
        else:
            # delta-rs' own DataFusion table: it prunes columns and files itself.
            context.register_table(name, rows)
    try:
        [row] = context.sql(sql.format(**{name: name for name in tables})).to_pylist()
    except Exception as error:  # DataFusion raises plain Exceptions
        if "Resources exhausted" in str(error):
            raise DataFusionOutOfMemory(str(error)) from error
        raise
    return row


def _one_row_in_spark(sql: str, frames: Mapping[str, DataFrame]) -> dict[str, Any]:
    # Views of this query alone: the session outlives the step, and other steps name theirs.
    views = {name: f"_medallion_{name}_{uuid.uuid4().hex}" for name in frames}
    for name, frame in frames.items():
        frame.createOrReplaceTempView(views[name])
    spark = next(iter(frames.values())).sparkSession
    try:
        row = spark.sql(sql.format(**views)).first()
        assert row is not None, "an aggregate's query returns one row"
        return row.asDict()
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)


def _counts(row: Mapping[str, Any]) -> dict[str, int]:
    return {name: int(value or 0) for name, value in row.items()}


def count_duplicate_keys(rows: CheckedRows, keys: Sequence[str]) -> tuple[int, int, int]:
    """``(rows, rows whose key occurs more than once, duplicated keys)``; a null key counts as failing.

    ``rows``: a Spark DataFrame, or an Arrow table or delta-rs table holding
    at least ``keys`` (counted by DataFusion).

    Raises:
        DataFusionOutOfMemory: DataFusion's count needed more memory than its bound.
    """
    if not isinstance(rows, DataFrame):
        key_list = ", ".join(_quoted(k) for k in keys)
        bad = " OR ".join(["count(*) > 1", *(f"{_quoted(k)} IS NULL" for k in keys)])
        totals = _counts(
            one_row(
                f"SELECT sum(n) AS rows, sum(CASE WHEN bad THEN n ELSE 0 END) AS failing, "
                f"sum(CASE WHEN bad THEN 1 ELSE 0 END) AS bad_keys "
                f"FROM (SELECT count(*) AS n, {bad} AS bad FROM {{checked}} GROUP BY {key_list})",
                {"checked": rows},
            )
        )
        return totals["rows"], totals["failing"], totals["bad_keys"]
    per_key = rows.groupBy(*keys).agg(F.count(F.lit(1)).alias("_n"))
    null_key = F.lit(False)
    for k in keys:
        null_key = null_key | F.col(k).isNull()
    failing = (F.col("_n") > 1) | null_key
    row = per_key.agg(
        F.coalesce(F.sum("_n"), F.lit(0)).alias("rows"),
        F.coalesce(F.sum(F.when(failing, F.col("_n")).otherwise(0)), F.lit(0)).alias("failing"),
        F.coalesce(F.sum(F.when(failing, 1).otherwise(0)), F.lit(0)).alias("bad_keys"),
    ).first()
    assert row is not None, "an aggregate without grouping returns one row"
    return int(row["rows"]), int(row["failing"]), int(row["bad_keys"])


def count_orphans(
    child: CheckedRows, foreign_keys: Sequence[str], parent: CheckedRows, parent_keys: Sequence[str]
) -> tuple[int, int]:
    """``(child rows, child rows with no parent)``; a null foreign key counts as an orphan.

    Both tables Spark DataFrames, or both read by DataFusion (Arrow tables or
    delta-rs tables) holding at least the key columns. Spark makes one pass
    over the child: each row meets at most one of the distinct parent keys,
    so a left join keeps the child's rows, and those it found no parent for
    are counted in the same aggregate. DataFusion groups the keys of both
    tables together instead, and counts the child rows of the keys no parent
    row has: an aggregation spills past its memory bound, where a join's
    parent side must fit in it.

    Raises:
        DataFusionOutOfMemory: DataFusion's count needed more memory than its bound.
    """
    if not isinstance(child, DataFrame) and not isinstance(parent, DataFrame):
        keys = [f"_k{i}" for i in range(len(foreign_keys))]
        child_keys = ", ".join(f"{_quoted(fk)} AS {k}" for fk, k in zip(foreign_keys, keys, strict=False))
        parent_keys_as = ", ".join(f"{_quoted(pk)} AS {k}" for pk, k in zip(parent_keys, keys, strict=False))
        # A null key equals nothing, so its rows find no parent, even where a parent's key is null too.
        unmatched = " OR ".join(["_parents = 0"] + [f"{k} IS NULL" for k in keys])
        totals = _counts(
            one_row(
                f"SELECT sum(_children) AS rows, sum(CASE WHEN {unmatched} THEN _children ELSE 0 END) AS orphans "
                f"FROM (SELECT sum(_child) AS _children, sum(_parent) AS _parents, {', '.join(keys)} FROM ("
                f"SELECT {child_keys}, 1 AS _child, 0 AS _parent FROM {{child}} UNION ALL "
                f"SELECT {parent_keys_as}, 0 AS _child, 1 AS _parent FROM {{parent}}"
                f") AS u GROUP BY {', '.join(keys)}) AS g",
                {"child": child, "parent": parent},
            )
        )
        return totals["rows"], totals["orphans"]
    if not isinstance(child, DataFrame) or not isinstance(parent, DataFrame):
        raise TypeError("count_orphans: the tables are both Spark DataFrames or neither is")
    parents = (
        parent.select(*[F.col(p).alias(f"_fk{i}") for i, p in enumerate(parent_keys)])
        .distinct()
        .withColumn("_has_parent", F.lit(True))
    )
    condition = None
    for i, fk in enumerate(foreign_keys):
        term = F.col(fk) == F.col(f"_fk{i}")
        condition = term if condition is None else condition & term
    row = (
        child.select(*foreign_keys)
        .join(parents, condition, "left")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count(F.when(F.col("_has_parent").isNull(), 1)).alias("orphans"),
        )
        .first()
    )
    assert row is not None, "an aggregate without grouping returns one row"
    return int(row["rows"]), int(row["orphans"])


def counted(
    context: AssetExecutionContext | AssetCheckExecutionContext,
    delta_tables: Callable[[], list[DeltaTable | None]],
    frames: Callable[[], list[DataFrame]],
    count: Callable[..., _Counts],
) -> tuple[_Counts, str]:
    """``count`` over the tables as DataFusion reads them, else as Spark DataFrames; and which counted.

    DataFusion counts when delta-rs reads every table: no Spark job, and its
    memory is bounded. A table delta-rs cannot read, or a count past
    DataFusion's memory bound, is counted by Spark.

    Args:
        context: the step's context (a fallback to Spark is logged on it).
        delta_tables: the tables as :meth:`TableRead.delta_table` hands them (None where delta-rs cannot read one;
            a caller that needs Spark to count for another reason hands a None too).
        frames: the same tables as Spark DataFrames, asked for only when Spark counts.
        count: takes the tables, in the same order, either way.

    Returns:
        ``count``'s result, and ``"DataFusion"`` or ``"Spark"`` (for the check's ``computed_with``).
    """
    tables = delta_tables()
    if all(table is not None for table in tables):
        try:
            return count(*tables), "DataFusion"
        except DataFusionOutOfMemory as error:
            context.log.warning(
                f"counted by Spark: DataFusion needed more than {DATAFUSION_MEMORY_BYTES // 2**20} MiB ({error})"
            )
    return count(*frames()), "Spark"


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
            (rows, failing, bad_keys), computed_with = counted(
                context,
                lambda: [stored.delta_table()],
                lambda: [stored.frame],
                lambda table: count_duplicate_keys(table, keys),
            )
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
                    COMPUTED_WITH: computed_with,
                },
            )

        return check_once_per_version(context, AssetCheckKey(key, name), evaluate)

    return _unique


def reference_check(
    child: str, foreign_keys: Sequence[str], parent: str, parent_keys: Sequence[str]
) -> AssetChecksDefinition:
    """Every ``silver.<child>`` row points at an existing ``silver.<parent>`` row."""

    key = AssetKey(["silver", child])
    name = f"{child}_references_{parent}"

    @asset_check(
        asset=key,
        name=name,
        description=f"Every {child}.({', '.join(foreign_keys)}) exists in {parent}.({', '.join(parent_keys)}).",
        additional_ins={"parent_table": AssetIn(key=AssetKey(["silver", parent]))},
    )
    def _references(
        context: AssetCheckExecutionContext, child_table: TableRead, parent_table: TableRead
    ) -> AssetCheckResult:
        def evaluate() -> AssetCheckResult:
            (rows, orphans), computed_with = counted(
                context,
                lambda: [child_table.delta_table(), parent_table.delta_table()],
                lambda: [child_table.frame, parent_table.frame],
                lambda child_rows, parent_rows: count_orphans(child_rows, foreign_keys, parent_rows, parent_keys),
            )
            return AssetCheckResult(
                asset_key=key,
                check_name=name,
                passed=orphans == 0,
                severity=AssetCheckSeverity.ERROR,
                metadata={
                    "references": f"{child}.{','.join(foreign_keys)} -> {parent}.{','.join(parent_keys)}",
                    "passing_rows": rows - orphans,
                    "failing_rows": orphans,
                    COMPUTED_WITH: computed_with,
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
        return list(
            build_last_update_freshness_checks(
                assets=list(assets),
                lower_bound_delta=timedelta(hours=max_lag_hours),
                severity=AssetCheckSeverity.WARN,
            )
        )


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
