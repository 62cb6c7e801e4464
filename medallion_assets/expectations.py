"""Expectations, declared next to the asset they guard, reported as Dagster asset checks.

The three actions are Delta Live Tables': ``warn`` (keep the rows, report),
``drop`` (keep them out of the table, into ``quarantine.<table>`` with the
reason) and ``fail`` (a blocking check: the table is not written, its bad rows
go to quarantine, and downstream assets do not run). A ``warn`` or ``drop``
expectation that some row failed is a failed check of severity WARN (amber,
with its count): the rows were handled as declared, but they are not good
data. A failed ``fail`` expectation is a failed ERROR check.

A row meets an expectation when its condition is true; false *and* null count
as failing, so a missing value never slips through a ``drop``.

Besides the expectations, every step with a quarantine reports what it set
aside in the run, parse rejects included: :class:`RejectedRows`, as the
``<table>_rejected_rows`` check (:func:`rejected_rows_result`) and as numeric
output metadata (``medallion/rejected_rows``, ``medallion/input_rows``) that
Dagster plots over the runs. The check is an ERROR when a landed file of the
run was rejected whole (every line of it: garbage, a header that is not the
declaration's) or more than ``max_rejected_share`` of the input was rejected
(:data:`DEFAULT_MAX_REJECTED_SHARE` unless the feed says otherwise), else a
WARN. The check is blocking: failed at ERROR, it fails its step once the
step's tables are written, so the run is red (a failure, on its page and in
the Runs list) and nothing downstream (gold) is computed from a broken
delivery in that run; a WARN blocks nothing. The silver and quarantine writes
stand (silver keeps the rejected rows out) and record what they consumed, so
a retry of the step reads nothing new, quarantines nothing twice and passes,
and gold then runs on silver without the rejected rows. The step also tags its
run (:func:`tag_failed_checks`), naming the failed checks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from dagster import AssetCheckResult, AssetCheckSeverity, AssetCheckSpec, AssetKey, MetadataValue
from pyspark.sql import Column, DataFrame, Observation, Window
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
    """Warn: rows that fail stay in the table; the check fails with severity WARN and their count."""
    return Expectation(name, condition, "warn", description)


def expect_or_drop(name: str, condition: str, description: str = "") -> Expectation:
    """Drop: rows that fail go to quarantine with the reason; the check fails with severity WARN and their count."""
    return Expectation(name, condition, "drop", description)


def expect_or_fail(name: str, condition: str, description: str = "") -> Expectation:
    """Fail: any failing row blocks the table and everything downstream of it."""
    return Expectation(name, condition, "fail", description)


def meets_dropping_expectations(expectations: Sequence[Expectation]) -> Column:
    """True for rows that meet every ``drop`` and ``fail`` expectation: the rows :func:`apply_expectations` keeps."""
    met = F.lit(True)
    for e in expectations:
        if e.action in ("drop", "fail"):
            met = met & e.met
    return met


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
        evaluated: the rows with their expectation flags, cached for the counts and
            the writes of ``kept`` and ``quarantined`` (``None`` without expectations).
    """

    kept: DataFrame
    quarantined: DataFrame
    check_results: list[AssetCheckResult]
    blocked: bool
    evaluated: DataFrame | None = None

    def release(self) -> None:
        """Free the cached rows once the step has written them.

        The session outlives the step: left cached, the rows hold executor
        memory that later steps' joins and aggregations then evict to disk.
        """
        if self.evaluated is not None:
            self.evaluated.unpersist()


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
    """Records a parser rejected in the quarantine schema.

    The records have ``value``, ``_source_file``, ``_ingested_at`` and ``reason``.
    """
    return quarantine_rows(rejects.withColumnRenamed("reason", "_reason_text"), table_name, F.col("_reason_text"))


def apply_expectations(
    frame: DataFrame,
    expectations: Sequence[Expectation],
    *,
    asset_key: AssetKey | Sequence[str],
    table_name: str,
    no_rows: bool = False,
) -> ExpectationOutcome:
    """Evaluate ``expectations`` on ``frame`` in one pass and split the rows.

    Args:
        frame: the rows the asset is about to write.
        expectations: the asset's expectations.
        asset_key: the guarded asset (the check results name it).
        table_name: written into quarantine rows.
        no_rows: the caller knows ``frame`` is empty (its input had no row):
            every count is 0 without running a query.

    Returns:
        Kept rows, quarantined rows with reasons, check results, and whether it is blocked.
    """
    key = AssetKey(list(asset_key)) if not isinstance(asset_key, AssetKey) else asset_key
    if not expectations:
        empty = quarantine_rows(frame, table_name, "").limit(0)
        return ExpectationOutcome(frame, empty, [], False)
    flagged = cache_rows(
        frame.select("*", *[(~e.met).alias(f"_reason_{i}") for i, e in enumerate(expectations)]), no_rows=no_rows
    )
    # An action of its own, before any write, because a failed 'fail' expectation must stop
    # the write, which an observation of the write could only report afterwards. It is the
    # first action on the cached rows: it computes them once, and the writes read the cache.
    counts = (
        {"rows": 0}
        if no_rows
        else flagged.agg(
            F.count(F.lit(1)).alias("rows"),
            *[F.sum(F.col(f"_reason_{i}").cast("long")).alias(f"failed_{i}") for i in range(len(expectations))],
        )
        .first()
        .asDict()  # type: ignore[union-attr]  # an aggregate without grouping returns one row
    )
    total = int(counts["rows"])
    results: list[AssetCheckResult] = []
    blocked = False
    for i, e in enumerate(expectations):
        failing = int(counts.get(f"failed_{i}") or 0)
        passed = failing == 0
        blocked = blocked or (e.action == "fail" and not passed)
        results.append(
            AssetCheckResult(
                asset_key=key,
                check_name=e.name,
                # Warn and drop fail amber: the rows were handled as declared, but a green
                # check would hide that some rows were bad. Only fail is an ERROR (and blocks).
                passed=passed,
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
        quarantined = quarantine_rows(
            bad.drop(*[f"_reason_{i}" for i in range(len(expectations))]), table_name, F.col("_reason")
        )
        kept = flagged.where(~any_failed)
    else:
        quarantined = quarantine_rows(frame, table_name, "").limit(0)
        kept = flagged
    kept = kept.drop(*[f"_reason_{i}" for i in range(len(expectations))])
    return ExpectationOutcome(kept, quarantined, results, blocked, evaluated=flagged)


# ---- what a step quarantined ---------------------------------------------------------

#: Reasons listed in the rejected-rows check's metadata: the most frequent ones.
TOP_REASONS = 10

#: How a Kafka message's origin begins where a landed line has its file's URI
#: (``kafka://<topic>/<partition>/<offset>``): a message is not a landed file,
#: so the per-file accounting of the rejected-rows check leaves it out.
MESSAGE_ORIGIN_PREFIX = "kafka://"

#: Files listed in the rejected-rows check's metadata: those rejected whole first, then the most rejected.
TOP_FILES = 10

#: The share of a run's input rows past which the rejected-rows check is an ERROR, unless a
#: feed's ``ApplyChanges(max_rejected_share=...)`` says otherwise: more than one row in twenty
#: is not the noise of a healthy delivery (a few bad lines in a thousand) but a producer's
#: change or a broken export, which someone should look at before the next delivery.
DEFAULT_MAX_REJECTED_SHARE = 0.05

#: The run tag set when a step's data check failed with severity ERROR (value ``failed``),
#: and the one naming those checks (``<asset>:<check>``, comma-separated).
DATA_CHECKS_TAG = "medallion/data_checks"
FAILED_CHECKS_TAG = "medallion/failed_checks"

#: Output metadata keys of the counts (numbers, so Dagster plots them over the runs).
INPUT_ROWS_METADATA = "medallion/input_rows"
REJECTED_ROWS_METADATA = "medallion/rejected_rows"
REJECTED_SHARE_METADATA = "medallion/rejected_share"


def rejected_rows_check_name(table: str) -> str:
    """The name of the check on ``silver.<table>`` that reports what its step quarantined."""
    return f"{table}_rejected_rows"


def rejected_rows_check_spec(
    asset_key: AssetKey | Sequence[str], *, table: str, max_rejected_share: float | None
) -> AssetCheckSpec:
    """The rejected-rows check of the step that quarantines into ``quarantine.<table>``, on the table it guards."""
    key = AssetKey(list(asset_key)) if not isinstance(asset_key, AssetKey) else asset_key
    limit = (
        f"ERROR when every line of a landed file was rejected or above {max_rejected_share:.2%} of the input "
        "rows (max_rejected_share)"
        if max_rejected_share is not None
        else "never ERROR (max_rejected_share is None)"
    )
    return AssetCheckSpec(
        name=rejected_rows_check_name(table),
        asset=key,
        description=(
            f"Rows the run set aside in quarantine.{table} (lines that did not parse, rows that failed a drop "
            f"or fail expectation), with the input rows, the most frequent reasons and the files: WARN when any, "
            f"{limit}; an ERROR fails the run and stops what is downstream."
        ),
        # Blocking: a broken delivery (an ERROR) fails the step after its writes, so the run is
        # red and gold is not computed from it; a WARN (a healthy delivery's noise) blocks nothing.
        blocking=True,
    )


def reason_kind(reason: Column) -> Column:
    """A reason without the value it quotes at its end, so one kind counts every bad value.

    ``amount is not a decimal: 'ten'`` and ``...: 'abc'`` are both ``amount is not a decimal``;
    a reason that quotes nothing is its own kind.
    """
    return F.regexp_replace(reason, r": '.*'$", "")


def has_no_rows(frame: DataFrame) -> bool:
    """Whether a step's input is empty, asked once so that a run with nothing new runs no query.

    The IO manager hands a ``changes`` input that gained no commit as an empty
    relation, which Spark answers on the driver without a job; otherwise this
    reads the first row of the input's first file.
    """
    return frame.isEmpty()


def cache_rows(frame: DataFrame, *, no_rows: bool) -> DataFrame:
    """``frame`` cached for a step's several reads of it, or as it is when the step's input had no rows.

    No query reads an empty input's frames (their counts are answered on the
    driver), and uncaching a frame makes Spark re-plan every cached frame built
    on it that was never computed, a cost a run with nothing new would pay in
    every step (docs/decisions/0008-skip-unchanged-inputs.md).
    """
    return frame if no_rows else frame.cache()


def step_output(frame: DataFrame, *, no_rows: bool) -> DataFrame:
    """What a step hands the IO manager: ``frame``, or an empty relation when its input had no rows.

    A step's outputs sit on observed inputs and cached frames, which Spark's
    optimizer cannot see through, so their emptiness takes a job of its own,
    one per output in a run with nothing new
    (docs/decisions/0008-skip-unchanged-inputs.md). A
    ``limit(0)`` is answered on the driver: every output of a step is computed
    from its input, so no rows in means none out.
    """
    return frame.limit(0) if no_rows else frame


class ObservedInput:
    """A step's input with metrics Spark reports as the step's own queries read it.

    The metrics (the row count, and any aggregate given) come with the first
    query that runs over :attr:`frame`, without an action of their own, so use
    the frame where such a query reads every row (under an aggregation or a
    cache, as a silver step's parse is), not under a ``limit``, and read the
    metrics after one ran.

    Example:
        >>> observed = ObservedInput(lines, longest=F.max(F.length("value")))  # doctest: +SKIP
        >>> parsed = parse(observed.frame).cache(); parsed.count()              # doctest: +SKIP
        >>> observed.rows(), observed.metric("longest")                          # doctest: +SKIP
    """

    def __init__(self, frame: DataFrame, **metrics: Column) -> None:
        self._source = frame
        self._observation = Observation()
        self.frame = frame.observe(
            self._observation,
            F.count(F.lit(1)).alias("rows"),
            *(column.alias(name) for name, column in metrics.items()),
        )

    def _reported(self) -> dict | None:
        try:
            reported = self._observation.get
        except Exception:  # noqa: BLE001 - classic PySpark cannot convert the empty row of a lost observation
            return None
        return reported if reported and reported.get("rows") is not None else None

    def metric(self, name: str):
        """The metric's value, or None when no query reported it.

        None happens when adaptive execution replaced a stage that produced no
        rows with an empty relation (observed metrics and all), or on Spark
        Connect, which hands an observation over only with a query's result:
        the caller then computes the value another way.
        """
        reported = self._reported()
        return reported.get(name) if reported is not None else None

    def rows(self) -> int:
        """The input's rows: observed, or counted when the observation was lost (a read of the Parquet footers)."""
        reported = self.metric("rows")
        return int(reported) if reported is not None else self._source.count()


@dataclass(frozen=True)
class RejectedFile:
    """What a step set aside from one landed file in one run.

    Attributes:
        file: the file's URI (``_source_file``).
        rejected_rows: the file's quarantined rows (parse rejects and rows failing an expectation).
        input_rows: the file's rows the step read (its lines; 0 when unknown).
        unparsed_rows: the file's lines that did not parse (a header that is not the declaration's included).
        reason: the file's most frequent reason kind (:func:`reason_kind`); for a file whose
            header is not the declaration's, the expected and found columns.
    """

    file: str
    rejected_rows: int
    input_rows: int
    unparsed_rows: int
    reason: str

    @property
    def whole(self) -> bool:
        """Whether every line of the file was rejected by the parse."""
        return self.input_rows > 0 and self.unparsed_rows >= self.input_rows

    @property
    def share(self) -> float:
        """Rejected rows per row the file brought (0 when unknown)."""
        return self.rejected_rows / self.input_rows if self.input_rows else 0.0


@dataclass(frozen=True)
class RejectedRows:
    """What a step set aside in one run.

    Attributes:
        input_rows: the rows the step read (its new bronze rows).
        rejected_rows: the rows it quarantined: parse rejects and rows failing a drop or fail expectation.
        by_reason: ``(reason kind, rows)`` of the most frequent reasons (:func:`reason_kind`), most first.
        by_file: the :data:`TOP_FILES` files with rejected rows, those rejected whole first, then most rejected.
        files_rejected_whole: how many files of the run had every line rejected (all of them, not only the top).
    """

    input_rows: int
    rejected_rows: int
    by_reason: tuple[tuple[str, int], ...] = ()
    by_file: tuple[RejectedFile, ...] = ()
    files_rejected_whole: int = 0

    @property
    def share(self) -> float:
        """Rejected rows per input row (0 when nothing was read)."""
        return self.rejected_rows / self.input_rows if self.input_rows else 0.0

    @property
    def metadata(self) -> dict[str, int | float]:
        """Numeric output metadata, there every run (0 too), so Dagster plots it."""
        return {
            INPUT_ROWS_METADATA: self.input_rows,
            REJECTED_ROWS_METADATA: self.rejected_rows,
            REJECTED_SHARE_METADATA: round(self.share, 6),
        }


def count_rejected(
    quarantined: DataFrame, *, input_rows: Callable[[], int], no_rows: bool = False, judged: DataFrame | None = None
) -> RejectedRows:
    """Count a step's quarantined rows by reason kind, and read its input rows.

    ``quarantined`` must be cached by the caller: the one query here computes
    it, and the IO manager then writes those cached rows, so the rejects are
    parsed once. A separate query, not an observation on the written frame:
    counts per reason need a group-by, which an observation (aggregates over
    all rows) cannot express, and the IO manager's first action on the frame
    it writes is an emptiness probe, which may read only some partitions.

    Args:
        quarantined: the rows the step appends to its quarantine (``reason`` column), cached.
        input_rows: the count of the step's input (:meth:`ObservedInput.rows`), whose
            observed frame is under ``quarantined``'s rejects: this query reads every
            input row, so the count is reported by the time it ends.

        no_rows: the caller knows the step's input had no row: nothing to count.
        judged: every input line with its ``_source_file`` and ``_reject_reason`` (null when
            it parsed), cached by the caller: with it, and when some row was rejected, one
            more query counts each file's lines against its rejects (:class:`RejectedFile`).

    Returns:
        The counts, the :data:`TOP_REASONS` most frequent reasons first, the files.
    """
    if no_rows:
        return RejectedRows(input_rows=0, rejected_rows=0)
    # A rollup: the count of each kind and, first, the total (no row at all when nothing was rejected).
    counted = (
        quarantined.select(reason_kind(F.col("reason")).alias("kind"))
        .rollup("kind")
        .agg(F.grouping("kind").alias("is_total"), F.count(F.lit(1)).alias("rows"))
        .orderBy(F.desc("is_total"), F.desc("rows"), "kind")
        .limit(TOP_REASONS + 1)
        .collect()
    )
    rejected = int(counted[0]["rows"]) if counted else 0
    by_file, whole = _rejected_files(quarantined, judged) if rejected and judged is not None else ((), 0)
    return RejectedRows(
        input_rows=input_rows(),
        rejected_rows=rejected,
        by_reason=tuple((row["kind"], int(row["rows"])) for row in counted[1:]),
        by_file=by_file,
        files_rejected_whole=whole,
    )


def _rejected_files(quarantined: DataFrame, judged: DataFrame) -> tuple[tuple[RejectedFile, ...], int]:
    """The :data:`TOP_FILES` files with rejects, whole ones first, and how many were rejected whole.

    Rows without a file, and Kafka messages (one line each, whose reject is
    not a broken delivery), are left out.
    """
    landed = F.col("_source_file").isNotNull() & ~F.col("_source_file").startswith(MESSAGE_ORIGIN_PREFIX)
    kinds = (
        quarantined.where(landed)
        .groupBy("_source_file", reason_kind(F.col("reason")).alias("kind"))
        .agg(F.count(F.lit(1)).alias("rows"))
        .groupBy("_source_file")
        .agg(F.sum("rows").alias("rejected"), F.max_by("kind", F.struct("rows", "kind")).alias("kind"))
    )
    lines = (
        judged.where(landed)
        .groupBy("_source_file")
        .agg(F.count(F.lit(1)).alias("lines"), F.count("_reject_reason").alias("unparsed"))
    )
    whole = (F.col("lines") > 0) & (F.col("unparsed") >= F.col("lines"))
    picked = (
        kinds.join(lines, "_source_file", how="left")
        .select("*", whole.alias("whole"), F.sum(whole.cast("int")).over(Window.partitionBy()).alias("whole_files"))
        .orderBy(F.desc("whole"), F.desc("rejected"), "_source_file")
        .limit(TOP_FILES)
        .collect()
    )
    files = tuple(
        RejectedFile(
            file=row["_source_file"],
            rejected_rows=int(row["rejected"]),
            input_rows=int(row["lines"] or 0),
            unparsed_rows=int(row["unparsed"] or 0),
            reason=row["kind"],
        )
        for row in picked
    )
    return files, int(picked[0]["whole_files"] or 0) if picked else 0


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def rejected_rows_result(
    rejected: RejectedRows, *, asset_key: AssetKey | Sequence[str], table: str, max_rejected_share: float | None
) -> AssetCheckResult:
    """The ``<table>_rejected_rows`` check: passed when nothing was rejected, else failed.

    Severity ERROR when every line of some landed file of the run was rejected
    or the rejected share of the input is above ``max_rejected_share`` (a
    declaration's setting, :data:`DEFAULT_MAX_REJECTED_SHARE` by default;
    1: the whole-file rule only; None: never ERROR), else WARN. The metadata
    names the files with rejects (:class:`RejectedFile`), with each file's
    main reason, which for a header that is not the declaration's gives the
    expected and found columns.
    """
    key = AssetKey(list(asset_key)) if not isinstance(asset_key, AssetKey) else asset_key
    too_many = max_rejected_share is not None and rejected.share > max_rejected_share
    whole_files = max_rejected_share is not None and rejected.files_rejected_whole > 0
    reasons = "\n".join(f"| {_markdown_cell(kind)} | {rows} |" for kind, rows in rejected.by_reason)
    metadata: dict = {
        "input_rows": rejected.input_rows,
        "rejected_rows": rejected.rejected_rows,
        "rejected_share": round(rejected.share, 6),
        "quarantine": MetadataValue.asset(AssetKey(["quarantine", table])),
        "rejected_by_reason": MetadataValue.json({kind: rows for kind, rows in rejected.by_reason}),
        "top_reasons": MetadataValue.md("| reason | rows |\n|---|---|\n" + reasons if reasons else "no row rejected"),
        # The same as plain text, shown in the check's row without opening the Markdown.
        "reasons": MetadataValue.text(
            "; ".join(f"{kind}: {rows}" for kind, rows in rejected.by_reason) or "no row rejected"
        ),
    }
    if max_rejected_share is not None:
        metadata["max_rejected_share"] = max_rejected_share
    if rejected.by_file:
        metadata["files_rejected_whole"] = rejected.files_rejected_whole
        metadata["rejected_files"] = MetadataValue.md(
            "| file | rejected rows | of the file's rows | share | every line rejected | main reason |\n"
            "|---|---|---|---|---|---|\n"
            + "\n".join(
                f"| {_markdown_cell(f.file)} | {f.rejected_rows} | {f.input_rows} | {f.share:.2%} | "
                f"{'yes' if f.whole else 'no'} | {_markdown_cell(f.reason)} |"
                for f in rejected.by_file
            )
        )
        metadata["rejected_by_file"] = MetadataValue.json(
            [
                {
                    "file": f.file,
                    "rejected_rows": f.rejected_rows,
                    "input_rows": f.input_rows,
                    "share": round(f.share, 6),
                    "rejected_whole": f.whole,
                    "reason": f.reason,
                }
                for f in rejected.by_file
            ]
        )
    whole = [f for f in rejected.by_file if f.whole]
    summary = (
        f"{rejected.rejected_rows} of {rejected.input_rows} input rows ({rejected.share:.2%}) "
        f"went to quarantine.{table}"
        + (f", above max_rejected_share {max_rejected_share:.2%}" if too_many else "")
        + (
            f"; every line rejected of {rejected.files_rejected_whole} file(s): "
            + "; ".join(f"{f.file} ({f.reason})" for f in whole[:3])
            if whole
            else ""
        )
    )
    return AssetCheckResult(
        asset_key=key,
        check_name=rejected_rows_check_name(table),
        passed=rejected.rejected_rows == 0,
        severity=AssetCheckSeverity.ERROR if too_many or whole_files else AssetCheckSeverity.WARN,
        description=summary,
        metadata=metadata,
    )


def tag_failed_checks(context, results: Sequence[AssetCheckResult]) -> None:
    """Tag the step's run when one of ``results`` failed with severity ERROR.

    :data:`DATA_CHECKS_TAG` ``failed`` and :data:`FAILED_CHECKS_TAG` naming the
    checks (with those an earlier step of the run named), shown on the run's
    page and in the Runs list: a failed run says why (its data, not a crash),
    and a run that a non-blocking ERROR check leaves a success is marked too.

    Args:
        context: the step's execution context (its instance and run id).
        results: the check results the step yields.
    """
    failed = {
        f"{r.asset_key.to_user_string() if r.asset_key else ''}:{r.check_name}"
        for r in results
        if not r.passed and r.severity == AssetCheckSeverity.ERROR
    }
    if not failed:
        return
    run = context.instance.get_run_by_id(context.run_id)
    earlier = (run.tags.get(FAILED_CHECKS_TAG) or "") if run is not None else ""
    named = sorted(failed | {name for name in earlier.split(", ") if name})
    context.instance.add_run_tags(context.run_id, {DATA_CHECKS_TAG: "failed", FAILED_CHECKS_TAG: ", ".join(named)})
