"""Expectations on a real Spark DataFrame: counts, quarantine rows, blocking."""

from __future__ import annotations

from dagster import AssetCheckSeverity, AssetKey

from medallion_assets.expectations import (
    apply_expectations,
    check_specs,
    expect,
    expect_or_drop,
    expect_or_fail,
)

KEY = AssetKey(["silver", "things"])


def _frame(spark):
    return spark.createDataFrame(
        [(1, 10.0, "a"), (2, -1.0, "b"), (3, None, "c"), (None, 5.0, "d")],
        "id long, amount double, _source_file string",
    )


def test_warn_keeps_rows_and_reports_counts(spark):
    outcome = apply_expectations(
        _frame(spark), [expect("amount_positive", "amount > 0")], asset_key=KEY, table_name="things"
    )
    assert outcome.kept.count() == 4
    assert outcome.quarantined.count() == 0
    [result] = outcome.check_results
    # Kept as declared, but not green: failed with severity WARN (amber), with the count.
    assert not result.passed and result.severity == AssetCheckSeverity.WARN
    assert result.metadata["failing_rows"].value == 2  # -1.0 and null (null counts as failing)
    assert result.metadata["passing_rows"].value == 2
    assert not outcome.blocked


def test_drop_sends_rows_to_quarantine_with_reason(spark):
    outcome = apply_expectations(
        _frame(spark),
        [expect_or_drop("id_present", "id IS NOT NULL"), expect_or_drop("amount_positive", "amount > 0")],
        asset_key=KEY,
        table_name="things",
    )
    assert sorted(r.id for r in outcome.kept.collect()) == [1]
    quarantined = {r.record: r.reason for r in outcome.quarantined.collect()}
    assert len(quarantined) == 3
    reasons = sorted(quarantined.values())
    assert any("id_present" in r for r in reasons)
    assert sum("amount_positive" in r for r in reasons) == 2
    assert {r.table_name for r in outcome.quarantined.collect()} == {"things"}
    by_name = {r.check_name: r for r in outcome.check_results}
    assert all(r.severity == AssetCheckSeverity.WARN and not r.passed for r in by_name.values())
    assert by_name["id_present"].metadata["failing_rows"].value == 1
    assert by_name["amount_positive"].metadata["failing_rows"].value == 2
    assert not outcome.blocked


def test_expectations_that_no_row_fails_pass(spark):
    outcome = apply_expectations(
        _frame(spark).where("id = 1"),
        [expect("amount_positive", "amount > 0"), expect_or_drop("id_present", "id IS NOT NULL")],
        asset_key=KEY,
        table_name="things",
    )
    assert all(r.passed and r.metadata["failing_rows"].value == 0 for r in outcome.check_results)


def test_fail_blocks(spark):
    expectations = [expect_or_fail("id_present", "id IS NOT NULL")]
    outcome = apply_expectations(_frame(spark), expectations, asset_key=KEY, table_name="things")
    assert outcome.blocked
    [result] = outcome.check_results
    assert not result.passed and result.severity == AssetCheckSeverity.ERROR
    assert result.metadata["failing_rows"].value == 1
    assert outcome.quarantined.count() == 1
    [spec] = check_specs(KEY, expectations)
    assert spec.blocking
