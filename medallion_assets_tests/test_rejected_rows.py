"""Bad data in plain sight: what a silver step rejected is a failed check, metadata and its own asset group.

One Dagster run of three declared feeds on the session's engine: ``widgets``
gets a few garbage lines (random bytes, broken JSON) among many good ones and
a row its ``expect_or_drop`` drops, a WARN under the default share;
``gadgets`` (``max_rejected_share=1``: the whole-file rule only) gets a file
of 3,000 random bytes, and ``plans``, a CSV feed, a file whose header is not
its declaration: both ERRORs naming the file, which fail their (blocking)
steps and the run, and the run carries the tag; a retry quarantines nothing
twice and passes.
Files are written with plain Python (the writers under test are the bronze
stream and the silver step). The rest is checked without a run: the counting
on small Spark frames, the check's verdicts, the declaration's validation, the
groups.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, AssetKey, DagsterInstance, materialize
from pyspark.sql.types import LongType, TimestampType

from medallion_assets.expectations import (
    DATA_CHECKS_TAG,
    DEFAULT_MAX_REJECTED_SHARE,
    FAILED_CHECKS_TAG,
    ObservedInput,
    RejectedFile,
    RejectedRows,
    count_rejected,
    expect_or_drop,
    rejected_rows_result,
)
from medallion_assets.feeds import ApplyChanges, Feed, FeedDeclarationError, Field, LandingFiles


def _feed(name: str, *, max_rejected_share: float | None = DEFAULT_MAX_REJECTED_SHARE) -> Feed:
    return Feed(
        name=f"{name}_raw",
        description=f"{name}, one JSON object per line.",
        source=LandingFiles(folder=name, format="ndjson"),
        fields=(
            Field("item_id", description="The item."),
            Field("qty", LongType(), description="How many."),
            Field("updated_at", TimestampType(), description="When it changed."),
        ),
        silver=ApplyChanges(
            table=name, keys=("item_id",), sequence_by=("updated_at",), max_rejected_share=max_rejected_share
        ),
        expectations=(expect_or_drop(f"{name}_qty_positive", "qty > 0"),),
    )


WIDGETS = _feed("widgets")
GADGETS = _feed("gadgets", max_rejected_share=1.0)
PLANS = Feed(
    name="plans_raw",
    description="Plans, CSV.",
    source=LandingFiles(folder="plans", format="csv"),
    fields=(
        Field("key", description="The account."),
        Field("email", description="Its address."),
        Field("plan", description="Its plan."),
        Field("updated_at", TimestampType(), description="When."),
    ),
    silver=ApplyChanges(table="plans", keys=("key",), sequence_by=("updated_at",)),
)


def _line(item_id: str, qty: int) -> str:
    return json.dumps({"item_id": item_id, "qty": str(qty), "updated_at": "2026-03-01T10:00:00Z"})


def _land(folder: Path, name: str, data: bytes) -> None:
    """A whole file, written aside and renamed, as the landing contract asks."""
    folder.mkdir(parents=True, exist_ok=True)
    aside = folder / f".{name}.tmp"
    aside.write_bytes(data)
    aside.rename(folder / name)


def _garbage() -> list[bytes]:
    """One line of random bytes (never UTF-8: it holds 0xFF) and one of broken JSON."""
    noise = bytes(b for b in random.Random(21).randbytes(120) if b not in b"\r\n")
    return [b"\xff" + noise, b'{"item_id": "w9", "qty": ']


def _random_file() -> tuple[bytes, int]:
    """3,000 random bytes (line breaks \\n only, so the lines are easy to count) and their lines."""
    data = bytes(b for b in random.Random(73).randbytes(3000) if b != ord("\r"))
    lines = data.split(b"\n")
    return data, len(lines) - (lines[-1] == b"")


def _csv(rows: list[list[str]], **writer) -> bytes:
    """CSV as Python's csv module writes it: lines end with \\r\\n."""
    import io

    text = io.StringIO(newline="")
    csv.writer(text, **writer).writerows(rows)
    return text.getvalue().encode()


def _run_of(result, key: AssetKey) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.mark.slow
def test_garbage_lines_fail_amber_and_a_file_rejected_whole_red_naming_it(spark, tmp_path, monkeypatch):
    from medallion_assets.assets.bronze import bronze_assets
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.definitions import resources_for
    from medallion_assets_tests.support.readers import read_with_deltalake

    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    landing = lake / "landing"
    # widgets: 110 lines, 3 rejected (2.7%, under the default 5%): the garbage, the broken JSON, w4 dropped.
    widgets = [_line(f"w{i}", i) for i in range(5, 104)] + [_line("w4", -2)]
    _land(landing / "widgets", "batch-00001.json", ("\n".join(widgets) + "\n").encode())
    mixed = [_line(f"v{i}", 1).encode() for i in range(8)]
    _land(landing / "widgets", "batch-00002.json", b"\n".join([mixed[0], *_garbage(), *mixed[1:]]) + b"\n")
    _land(landing / "gadgets", "batch-00001.json", ("\n".join([_line("g1", 1), _line("g2", 2)]) + "\n").encode())
    noise, noise_lines = _random_file()
    _land(landing / "gadgets", "batch-00002.json", noise)
    header = ["key", "email", "plan", "updated_at"]
    good = [
        ["k1", "a@example.com", "gold", "2026-03-01T10:00:00Z"],
        ["k2", "b@example.com", "free", "2026-03-01T10:00:00Z"],
    ]
    _land(landing / "plans", "batch-00001.csv", _csv([header, *good], quoting=csv.QUOTE_ALL))
    _land(
        landing / "plans",
        "batch-00002.csv",
        _csv([["id", "name", "favourite_colour"], ["1", "x", "blue"], ["2", "y", "red"]]),
    )

    feeds = [WIDGETS, GADGETS, PLANS]
    instance = DagsterInstance.ephemeral()
    assets = [*bronze_assets(feeds), *silver_assets(feeds)]
    result = materialize(assets, resources=resources_for("local"), instance=instance, raise_on_error=False)
    # The rejected-rows check is blocking: at ERROR it fails its step (after the step's writes) and so the run.
    failed = {
        e.step_key: e.step_failure_data.error.cls_name
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    }
    assert not result.success and failed == {
        "gadgets_from_gadgets_raw": "DagsterAssetCheckFailedError",
        "plans_from_plans_raw": "DagsterAssetCheckFailedError",
    }, failed
    checks = {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}

    # widgets: 110 lines read; the random bytes, the broken JSON and the dropped row set aside: a WARN.
    rejected = checks[("silver/widgets", "widgets_rejected_rows")]
    assert not rejected.passed and rejected.severity == AssetCheckSeverity.WARN
    metadata = {k: v.value for k, v in rejected.metadata.items()}
    assert (metadata["input_rows"], metadata["rejected_rows"]) == (110, 3)
    assert metadata["rejected_by_reason"] == {
        "not valid UTF-8": 1,
        "not valid JSON": 1,
        "widgets_qty_positive: qty > 0": 1,
    }
    assert "| not valid JSON | 1 |" in metadata["top_reasons"]
    # The same as plain text, readable in the check's row without opening the Markdown.
    assert sorted(metadata["reasons"].split("; ")) == [
        "not valid JSON: 1",
        "not valid UTF-8: 1",
        "widgets_qty_positive: qty > 0: 1",
    ]
    assert metadata["files_rejected_whole"] == 0
    assert [
        (f["file"].rsplit("/", 1)[1], f["rejected_rows"], f["input_rows"], f["rejected_whole"])
        for f in metadata["rejected_by_file"]
    ] == [("batch-00002.json", 2, 10, False), ("batch-00001.json", 1, 100, False)]
    dropped = checks[("silver/widgets", "widgets_qty_positive")]
    assert not dropped.passed and dropped.severity == AssetCheckSeverity.WARN
    assert dropped.metadata["failing_rows"].value == 1

    # The counts are numeric metadata of both materializations, for Dagster's plots.
    for key in (AssetKey(["silver", "widgets"]), AssetKey(["quarantine", "widgets"])):
        run = _run_of(result, key)
        assert (run["medallion/input_rows"], run["medallion/rejected_rows"]) == (110, 3), key
    assert len(read_with_deltalake(str(lake / "quarantine" / "widgets"))) == 3
    # Every quarantine column, and silver's _sequence, is described in the column schema the UI shows.
    quarantine_columns = {
        c.name: c.description
        for c in _run_of(result, AssetKey(["quarantine", "widgets"]))["dagster/column_schema"].columns
    }
    assert set(quarantine_columns) == set(read_with_deltalake(str(lake / "quarantine" / "widgets")).column_names)
    assert all(quarantine_columns.values()), quarantine_columns
    silver_columns = {
        c.name: c.description for c in _run_of(result, AssetKey(["silver", "widgets"]))["dagster/column_schema"].columns
    }
    assert "greater" in silver_columns["_sequence"]

    # gadgets: the file of random bytes is rejected whole: an ERROR (max_rejected_share=1: that rule only).
    over = checks[("silver/gadgets", "gadgets_rejected_rows")]
    assert not over.passed and over.severity == AssetCheckSeverity.ERROR
    metadata = {k: v.value for k, v in over.metadata.items()}
    assert (metadata["input_rows"], metadata["rejected_rows"], metadata["files_rejected_whole"]) == (
        2 + noise_lines,
        noise_lines,
        1,
    )
    [noisy] = metadata["rejected_by_file"]
    assert noisy["file"].endswith("/gadgets/batch-00002.json") and noisy["rejected_whole"] and noisy["share"] == 1.0
    assert "gadgets/batch-00002.json" in over.description and "every line rejected" in over.description
    assert "gadgets/batch-00002.json" in metadata["rejected_files"]
    assert checks[("silver/gadgets", "gadgets_qty_positive")].passed
    assert sorted(read_with_deltalake(str(lake / "silver" / "gadgets")).column("item_id").to_pylist()) == ["g1", "g2"]

    # plans: the file whose header is not the declaration is rejected whole, the header named.
    plans = checks[("silver/plans", "plans_rejected_rows")]
    assert not plans.passed and plans.severity == AssetCheckSeverity.ERROR
    wrong = (
        "header does not match the declaration: expected (key, email, plan, updated_at), "
        "found (id, name, favourite_colour)"
    )
    [file] = plans.metadata["rejected_by_file"].value
    assert file["file"].endswith("/plans/batch-00002.csv") and file["reason"] == wrong
    assert (file["rejected_rows"], file["input_rows"], file["rejected_whole"]) == (2, 2, True)
    assert wrong in plans.metadata["rejected_files"].value and wrong in plans.description
    quarantine = read_with_deltalake(str(lake / "quarantine" / "plans")).to_pylist()
    assert (
        sorted((row["_source_file"].rsplit("/", 1)[1], row["reason"]) for row in quarantine)
        == [("batch-00002.csv", wrong)] * 2
    )
    # The good file, its header quoted and its lines ending \r\n as Python's csv writes them, went through.
    silver_plans = read_with_deltalake(str(lake / "silver" / "plans")).to_pylist()
    assert sorted((row["key"], row["email"], row["plan"]) for row in silver_plans) == [tuple(r[:3]) for r in good]

    # The run failed for its data, and its tags say which checks.
    tags = instance.get_run_by_id(result.run_id).tags
    assert tags[DATA_CHECKS_TAG] == "failed"
    assert tags[FAILED_CHECKS_TAG] == "silver/gadgets:gadgets_rejected_rows, silver/plans:plans_rejected_rows"

    # A retry of the failed steps reads nothing new (the writes recorded what they consumed): it
    # quarantines nothing twice, its checks pass, and the run succeeds.
    quarantined = {t: len(read_with_deltalake(str(lake / "quarantine" / t))) for t in ("gadgets", "plans")}
    retry = materialize(
        assets,
        resources=resources_for("local"),
        instance=instance,
        selection=[k for f in (GADGETS, PLANS) for k in (f.silver_key, f.quarantine_key)],
    )
    assert retry.success
    assert {t: len(read_with_deltalake(str(lake / "quarantine" / t))) for t in quarantined} == quarantined
    again = {e.check_name: e for e in retry.get_asset_check_evaluations()}
    assert again["gadgets_rejected_rows"].passed and again["plans_rejected_rows"].passed
    assert again["plans_rejected_rows"].metadata["input_rows"].value == 0


def test_rejected_rows_are_counted_by_reason_and_input_rows_observed(spark):
    lines = spark.createDataFrame([(f"line {i}",) for i in range(7)], "value string").repartition(3)
    observed = ObservedInput(lines)
    reasons = _with_reasons(observed.frame)
    quarantined = reasons.where("reason IS NOT NULL").cache()
    counted = count_rejected(quarantined, input_rows=observed.rows)
    # Reported by the rollup's read of every line, not counted again.
    assert observed.metric("rows") == 7
    quarantined.unpersist()
    assert counted == RejectedRows(
        input_rows=7,
        rejected_rows=4,
        by_reason=(("qty is not an integer", 3), ("not valid JSON", 1)),
    )


def test_a_rejected_kafka_message_is_not_a_file_rejected_whole(spark):
    # Each message is one line with its own origin: a bad one must not read as a broken delivery.
    judged = spark.createDataFrame(
        [
            ("{bad", "kafka://orders/0/17", "not valid JSON"),
            ("{}", "kafka://orders/1/3", None),
            ("x", "file:///landing/o/a.json", "not valid JSON"),
            ("y", "file:///landing/o/a.json", None),
            ("z", "file:///landing/o/b.json", "not valid JSON"),
        ],
        "value string, _source_file string, _reject_reason string",
    ).cache()
    quarantined = judged.where("_reject_reason IS NOT NULL").withColumnRenamed("_reject_reason", "reason").cache()
    counted = count_rejected(quarantined, input_rows=lambda: 5, judged=judged)
    assert (counted.rejected_rows, counted.files_rejected_whole) == (3, 1)
    assert [(f.file, f.rejected_rows, f.input_rows, f.whole) for f in counted.by_file] == [
        ("file:///landing/o/b.json", 1, 1, True),
        ("file:///landing/o/a.json", 1, 2, False),
    ]
    result = rejected_rows_result(counted, asset_key=["silver", "orders"], table="orders", max_rejected_share=0.9)
    assert result.severity == AssetCheckSeverity.ERROR and "b.json" in result.description
    without_files = count_rejected(
        quarantined.where("_source_file LIKE 'kafka:%'"),
        input_rows=lambda: 2,
        judged=judged.where("_source_file LIKE 'kafka:%'"),
    )
    assert (without_files.rejected_rows, without_files.files_rejected_whole, without_files.by_file) == (1, 0, ())
    result = rejected_rows_result(without_files, asset_key=["silver", "orders"], table="orders", max_rejected_share=0.9)
    assert (result.passed, result.severity) == (False, AssetCheckSeverity.WARN)
    quarantined.unpersist()
    judged.unpersist()


def test_nothing_read_counts_zero_though_spark_drops_the_empty_stage_observed(spark):
    # Adaptive execution replaces a stage that produced no rows, its observed metrics too.
    observed = ObservedInput(spark.createDataFrame([], "value string"))
    quarantined = _with_reasons(observed.frame).where("reason IS NOT NULL").cache()
    assert count_rejected(quarantined, input_rows=observed.rows) == RejectedRows(input_rows=0, rejected_rows=0)
    quarantined.unpersist()


def _with_reasons(frame):
    """A reason on some lines, the value quoted on three (one kind), so the kinds group them."""
    from pyspark.sql import functions as F

    number = F.regexp_extract("value", r"(\d+)", 1).cast("int")
    return frame.select(
        F.when(number.isin(1, 2, 3), F.concat(F.lit("qty is not an integer: '"), F.col("value"), F.lit("'")))
        .when(number == 5, F.lit("not valid JSON"))
        .alias("reason")
    )


@pytest.mark.parametrize(
    ("rejected", "whole", "share", "passed", "severity"),
    [
        (0, 0, None, True, AssetCheckSeverity.WARN),
        (1, 0, None, False, AssetCheckSeverity.WARN),
        (10, 1, None, False, AssetCheckSeverity.WARN),  # None: never ERROR, a file rejected whole neither
        (5, 0, DEFAULT_MAX_REJECTED_SHARE, False, AssetCheckSeverity.WARN),  # the default: exactly 5% is not above
        (6, 0, DEFAULT_MAX_REJECTED_SHARE, False, AssetCheckSeverity.ERROR),
        (10, 0, 0.1, False, AssetCheckSeverity.WARN),  # exactly the share: not above it
        (11, 0, 0.1, False, AssetCheckSeverity.ERROR),
        (2, 1, 0.1, False, AssetCheckSeverity.ERROR),  # a file rejected whole, under the share
        (2, 1, 1.0, False, AssetCheckSeverity.ERROR),  # 1: the whole-file rule only
        (99, 0, 1.0, False, AssetCheckSeverity.WARN),
        (0, 0, 0.0, True, AssetCheckSeverity.WARN),
        (1, 0, 0.0, False, AssetCheckSeverity.ERROR),
    ],
)
def test_the_check_passes_without_rejects_warns_with_some_and_errs_on_a_whole_file_or_above_the_share(
    rejected, whole, share, passed, severity
):
    files = (
        (
            RejectedFile(
                file="file:///landing/things/b.json",
                rejected_rows=2,
                input_rows=2,
                unparsed_rows=2,
                reason="not valid JSON",
            ),
        )
        if whole
        else ()
    )
    counts = RejectedRows(
        input_rows=100,
        rejected_rows=rejected,
        by_reason=(("missing qty", rejected),) if rejected else (),
        by_file=files,
        files_rejected_whole=whole,
    )
    result = rejected_rows_result(counts, asset_key=["silver", "things"], table="things", max_rejected_share=share)
    assert (result.passed, result.severity) == (passed, severity)
    assert result.check_name == "things_rejected_rows"
    assert result.metadata["rejected_rows"].value == rejected and result.metadata["input_rows"].value == 100


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan"), "5%", True])
def test_a_reject_threshold_outside_zero_to_one_is_refused_naming_feed_and_fix(share):
    with pytest.raises(FeedDeclarationError, match=r"feed 'widgets_raw': silver.max_rejected_share = .* from 0 to 1"):
        _feed("widgets", max_rejected_share=share)


def test_quarantine_tables_are_a_group_of_their_own_linked_to_the_table_they_guard():
    from medallion_assets.definitions import build_definitions

    defs = build_definitions("local")
    graph = defs.resolve_asset_graph()
    for table, source in (("orders", "orders_raw"), ("customers", "customers_cdc")):
        quarantine = graph.get(AssetKey(["quarantine", table]))
        assert quarantine.group_name == "quarantine"
        assert graph.get(AssetKey(["silver", table])).group_name == "silver"
        assert quarantine.metadata["medallion/guards"].value == AssetKey(["silver", table])
        assert quarantine.description.startswith(f"Rows of {source}")
        assert (AssetKey(["silver", table]), f"{table}_rejected_rows") in {
            (k.asset_key, k.name) for k in graph.asset_check_keys
        }
    # The jobs that run silver run the quarantine its steps write (the steps cannot be split).
    for job in ("ingest", "refresh"):
        selected = defs.resolve_job_def(job).asset_layer.executable_asset_keys
        assert {AssetKey(["quarantine", "orders"]), AssetKey(["quarantine", "customers"])} <= selected
