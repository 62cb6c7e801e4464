"""Bad data in plain sight: what a silver step rejected is a failed check, metadata and its own asset group.

One Dagster run of two declared feeds on the session's engine: ``widgets``
gets a landed file of garbage (random bytes, broken JSON) beside good lines
and a row its ``expect_or_drop`` drops; ``gadgets`` declares
``max_rejected_share`` and gets more garbage than that. Files are written
with plain Python (the writers under test are the bronze stream and the
silver step). The rest is checked without a run: the counting on small
Spark frames, the check's verdicts, the declaration's validation, the groups.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from dagster import AssetCheckSeverity, AssetKey, DagsterInstance, materialize
from pyspark.sql.types import LongType, TimestampType

from medallion_assets.expectations import (
    ObservedInput,
    RejectedRows,
    count_rejected,
    expect_or_drop,
    rejected_rows_result,
)
from medallion_assets.feeds import ApplyChanges, Feed, FeedDeclarationError, Field, LandingFiles


def _feed(name: str, *, max_rejected_share: float | None = None) -> Feed:
    return Feed(
        name=f"{name}_raw",
        description=f"{name}, one JSON object per line.",
        source=LandingFiles(folder=name, format="ndjson"),
        fields=(
            Field("item_id", description="The item."),
            Field("qty", LongType(), description="How many."),
            Field("updated_at", TimestampType(), description="When it changed."),
        ),
        silver=ApplyChanges(table=name, keys=("item_id",), sequence_by=("updated_at",),
                            max_rejected_share=max_rejected_share),
        expectations=(expect_or_drop(f"{name}_qty_positive", "qty > 0"),),
    )


WIDGETS = _feed("widgets")
GADGETS = _feed("gadgets", max_rejected_share=0.25)


def _line(item_id: str, qty: int) -> str:
    return json.dumps({"item_id": item_id, "qty": str(qty), "updated_at": "2026-03-01T10:00:00Z"})


def _land(folder: Path, name: str, data: bytes) -> None:
    """A whole file, written aside and renamed, as the landing contract asks."""
    folder.mkdir(parents=True, exist_ok=True)
    aside = folder / f".{name}.tmp"
    aside.write_bytes(data)
    aside.rename(folder / name)


def _garbage() -> bytes:
    """One line of random bytes (never UTF-8: it holds 0xFF) and one of broken JSON."""
    noise = bytes(b for b in random.Random(21).randbytes(120) if b not in b"\r\n")
    return b"\xff" + noise + b"\n" + b'{"item_id": "w9", "qty": \n'


def _run_of(result, key: AssetKey) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.mark.slow
def test_garbage_and_dropped_rows_fail_amber_and_past_the_threshold_red(spark, tmp_path, monkeypatch):
    from medallion_assets.assets.bronze import bronze_assets
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.definitions import resources_for

    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    landing = lake / "landing"
    widgets = [_line("w1", 3), _line("w2", 5), _line("w3", 1), _line("w4", -2)]  # w4: dropped by the expectation
    _land(landing / "widgets", "batch-00001.json", ("\n".join(widgets) + "\n").encode())
    _land(landing / "widgets", "batch-00002.json", _garbage())
    _land(landing / "gadgets", "batch-00001.json", ("\n".join([_line("g1", 1), _line("g2", 2)]) + "\n").encode())
    _land(landing / "gadgets", "batch-00002.json", _garbage())

    feeds = [WIDGETS, GADGETS]
    result = materialize([*bronze_assets(feeds), *silver_assets(feeds)], resources=resources_for("local"),
                         instance=DagsterInstance.ephemeral())
    assert result.success
    checks = {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}

    # widgets: 6 lines read; the random bytes, the broken JSON and the dropped row set aside.
    rejected = checks[("silver/widgets", "widgets_rejected_rows")]
    assert not rejected.passed and rejected.severity == AssetCheckSeverity.WARN
    metadata = {k: v.value for k, v in rejected.metadata.items()}
    assert (metadata["input_rows"], metadata["rejected_rows"]) == (6, 3)
    assert metadata["rejected_by_reason"] == {
        "not valid UTF-8": 1, "not valid JSON": 1, "widgets_qty_positive: qty > 0": 1,
    }
    assert "| not valid JSON | 1 |" in metadata["top_reasons"]
    dropped = checks[("silver/widgets", "widgets_qty_positive")]
    assert not dropped.passed and dropped.severity == AssetCheckSeverity.WARN
    assert dropped.metadata["failing_rows"].value == 1

    # The counts are numeric metadata of both materializations, for Dagster's plots.
    for key in (AssetKey(["silver", "widgets"]), AssetKey(["quarantine", "widgets"])):
        run = _run_of(result, key)
        assert (run["medallion/input_rows"], run["medallion/rejected_rows"]) == (6, 3), key
        assert run["medallion/rejected_share"] == 0.5

    # The quarantine holds what the check counted.
    from medallion_assets_tests.delta.readers import read_with_deltalake

    assert len(read_with_deltalake(str(lake / "quarantine" / "widgets"))) == 3

    # gadgets: 2 of 4 lines rejected, above its max_rejected_share of 0.25: an ERROR.
    over = checks[("silver/gadgets", "gadgets_rejected_rows")]
    assert not over.passed and over.severity == AssetCheckSeverity.ERROR
    assert over.metadata["rejected_share"].value == 0.5 and over.metadata["max_rejected_share"].value == 0.25
    assert checks[("silver/gadgets", "gadgets_qty_positive")].passed


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
        input_rows=7, rejected_rows=4,
        by_reason=(("qty is not an integer", 3), ("not valid JSON", 1)),
    )


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
    ("rejected", "share", "passed", "severity"),
    [
        (0, None, True, AssetCheckSeverity.WARN),
        (1, None, False, AssetCheckSeverity.WARN),
        (10, 0.1, False, AssetCheckSeverity.WARN),  # exactly the share: not above it
        (11, 0.1, False, AssetCheckSeverity.ERROR),
        (0, 0.0, True, AssetCheckSeverity.WARN),
        (1, 0.0, False, AssetCheckSeverity.ERROR),
    ],
)
def test_the_check_passes_without_rejects_warns_with_some_and_errs_above_the_share(rejected, share, passed, severity):
    counts = RejectedRows(input_rows=100, rejected_rows=rejected, by_reason=(("missing qty", rejected),) if rejected else ())
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
