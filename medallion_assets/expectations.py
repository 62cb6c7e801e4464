"""Expectations, declared next to the asset they guard, reported as Dagster asset checks.

The three actions are Delta Live Tables': ``warn`` (keep the rows, report),
``drop`` (keep them out of the table, into ``quarantine.<table>`` with the
reason) and ``fail`` (a blocking check: the table is not written, its bad rows
go to quarantine, and downstream assets do not run).

A row meets an expectation when its condition is true; false *and* null count
as failing, so a missing value never slips through a ``drop``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, MetadataValue
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

Action = Literal["warn", "drop", "fail"]

#: Columns of every quarantine table: one schema whatever the source table.
QUARANTINE_COLUMNS = ("table_name", "reason", "record", "_source_file", "_quarantined_at")


@dataclass(frozen=True)
class Expectation:
    """A condition every row of a table should meet, and what to do when one does not.

    Attributes:
        name: the check's name (a Python identifier; shown in Dagster).
        condition: a Spark SQL boolean expression over the table's columns.
        action: ``warn``, ``drop`` or ``fail``.
        description: why the rule exists, shown with the check.
    """

    name: str
    condition: str
    action: Action
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"expectation name must be an identifier, got {self.name!r}")
        if self.action not in ("warn", "drop", "fail"):
            raise ValueError(f"expectation action must be warn, drop or fail, got {self.action!r}")

    @property
    def met(self) -> Column:
        """True for rows that meet the expectation (null counts as not met)."""
        return F.coalesce(F.expr(self.condition), F.lit(False))


def expect(name: str, condition: str, description: str = "") -> Expectation:
    """Warn: rows that fail stay in the table; the check reports them (severity WARN)."""
    return Expectation(name, condition, "warn", description)


def expect_or_drop(name: str, condition: str, description: str = "") -> Expectation:
    """Drop: rows that fail go to quarantine with the reason; the check reports them (WARN)."""
    return Expectation(name, condition, "drop", description)


def expect_or_fail(name: str, condition: str, description: str = "") -> Expectation:
    """Fail: any failing row blocks the table and everything downstream of it."""
    return Expectation(name, condition, "fail", description)


def check_specs(asset_key: AssetKey | Sequence[str], expectations: Sequence[Expectation]) -> list[AssetCheckSpec]:
    """The asset check of each expectation; ``fail`` ones are blocking."""
    key = AssetKey(list(asset_key)) if not isinstance(asset_key, AssetKey) else asset_key
    return [
        AssetCheckSpec(
            name=e.name,
            asset=key,
            description=f"[{e.action}] {e.condition}" + (f": {e.description}" if e.description else ""),
            blocking=e.action == "fail",
        )
        for e in expectations
    ]


@dataclass(frozen=True)
class ExpectationOutcome:
    """What applying a table's expectations gave.

    Attributes:
        kept: rows to write to the table (``drop`` failures removed).
        quarantined: rows set aside, in the quarantine schema, with their reasons.
        check_results: one asset check result per expectation.
        blocked: whether a ``fail`` expectation failed (the table must not be written).
    """

    kept: DataFrame
    quarantined: DataFrame
    check_results: list[AssetCheckResult]
    blocked: bool


def quarantine_rows(frame: DataFrame, table_name: str, reason: Column | str) -> DataFrame:
    """Rows in the quarantine schema: the table, the reason, the row as JSON, its source file."""
    source = F.col("_source_file") if "_source_file" in frame.columns else F.lit(None).cast("string")
    payload = [c for c in frame.columns if not c.startswith("_reason")]
    return frame.select(
        F.lit(table_name).alias("table_name"),
        (F.lit(reason) if isinstance(reason, str) else reason).cast("string").alias("reason"),
        F.to_json(F.struct(*[F.col(f"`{c}`") for c in payload])).alias("record"),
        source.cast("string").alias("_source_file"),
        F.current_timestamp().alias("_quarantined_at"),
    )


def rejects_to_quarantine(rejects: DataFrame, table_name: str) -> DataFrame:
    """Records a parser rejected (``value``, ``_source_file``, ``_ingested_at``, ``reason``) in the quarantine schema."""
    return quarantine_rows(rejects.withColumnRenamed("reason", "_reason_text"), table_name, F.col("_reason_text"))


def apply_expectations(
    frame: DataFrame,
    expectations: Sequence[Expectation],
    *,
    asset_key: AssetKey | Sequence[str],
    table_name: str,
) -> ExpectationOutcome:
    """Evaluate ``expectations`` on ``frame`` in one pass and split the rows.

    Args:
        frame: the rows the asset is about to write.
        expectations: the asset's expectations.
        asset_key: the guarded asset (the check results name it).
        table_name: written into quarantine rows.

    Returns:
        Kept rows, quarantined rows with reasons, check results, and whether it is blocked.
    """
    key = AssetKey(list(asset_key)) if not isinstance(asset_key, AssetKey) else asset_key
    if not expectations:
        empty = quarantine_rows(frame, table_name, "").limit(0)
        return ExpectationOutcome(frame, empty, [], False)
    flagged = frame.select(
        "*", *[(~e.met).alias(f"_reason_{i}") for i, e in enumerate(expectations)]
    ).cache()
    counts = flagged.agg(
        F.count(F.lit(1)).alias("rows"),
        *[F.sum(F.col(f"_reason_{i}").cast("long")).alias(f"failed_{i}") for i in range(len(expectations))],
    ).first()
    total = int(counts["rows"])
    results: list[AssetCheckResult] = []
    blocked = False
    for i, e in enumerate(expectations):
        failing = int(counts[f"failed_{i}"] or 0)
        passed = failing == 0
        blocked = blocked or (e.action == "fail" and not passed)
        results.append(
            AssetCheckResult(
                asset_key=key,
                check_name=e.name,
                # Warn and drop report their failures but pass: the rows were handled as declared.
                passed=passed or e.action != "fail",
                severity=AssetCheckSeverity.ERROR if e.action == "fail" else AssetCheckSeverity.WARN,
                metadata={
                    "action": e.action,
                    "condition": MetadataValue.text(e.condition),
                    "passing_rows": total - failing,
                    "failing_rows": failing,
                },
            )
        )
    quarantine_indexes = [i for i, e in enumerate(expectations) if e.action in ("drop", "fail")]
    if quarantine_indexes:
        any_failed = F.lit(False)
        for i in quarantine_indexes:
            any_failed = any_failed | F.col(f"_reason_{i}")
        reason = F.concat_ws(
            "; ",
            *[
                F.when(F.col(f"_reason_{i}"), F.lit(f"{expectations[i].name}: {expectations[i].condition}"))
                for i in quarantine_indexes
            ],
        )
        bad = flagged.where(any_failed).withColumn("_reason", reason)
        quarantined = quarantine_rows(bad.drop(*[f"_reason_{i}" for i in range(len(expectations))]), table_name, F.col("_reason"))
        kept = flagged.where(~any_failed)
    else:
        quarantined = quarantine_rows(frame, table_name, "").limit(0)
        kept = flagged
    kept = kept.drop(*[f"_reason_{i}" for i in range(len(expectations))])
    return ExpectationOutcome(kept, quarantined, results, blocked)
