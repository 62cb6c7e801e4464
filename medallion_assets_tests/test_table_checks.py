"""The counts behind the table checks, on real Spark DataFrames: rows that fail, not only that all pass."""

from __future__ import annotations

from medallion_assets.assets.checks import count_duplicate_keys, count_orphans


def test_duplicate_and_null_keys_fail_the_key_check(spark):
    stored = spark.createDataFrame(
        [(1, 1, "a"), (1, 2, "b"), (2, 1, "c"), (2, 1, "d"), (2, 1, "e"), (None, 1, "f")],
        "k long, line long, note string",
    )
    # (2, 1) three times: 3 failing rows, one key; the null key: 1 row, one key.
    assert count_duplicate_keys(stored, ["k", "line"]) == (6, 4, 2)
    # On k alone: k=1 twice, k=2 three times, the null once.
    assert count_duplicate_keys(stored, ["k"]) == (6, 6, 3)
    assert count_duplicate_keys(stored.where("k = 1"), ["k", "line"]) == (2, 0, 0)


def test_orphans_and_null_foreign_keys_fail_the_reference_check(spark):
    # A parent key stored twice must not count its children twice.
    parent = spark.createDataFrame([(1, 10), (1, 10), (2, 20), (3, 30)], "pk long, pk2 long")
    child = spark.createDataFrame(
        [(1, 10, "ok"), (1, 10, "ok again"), (2, 20, "ok"), (2, 99, "no such pair"), (4, 40, "no such key"),
         (None, 10, "null key")],
        "fk long, fk2 long, note string",
    )
    assert count_orphans(child, ["fk"], parent, ["pk"]) == (6, 2)
    assert count_orphans(child, ["fk", "fk2"], parent, ["pk", "pk2"]) == (6, 3)
    assert count_orphans(child.where("note LIKE 'ok%'"), ["fk", "fk2"], parent, ["pk", "pk2"]) == (3, 0)
    assert count_orphans(child.limit(0), ["fk"], parent, ["pk"]) == (0, 0)


def test_a_check_started_beside_the_write_evaluates_while_the_output_is_handled(tmp_path):
    """start_check_once_per_version returns at once; its evaluation's error fails the step."""
    import threading

    from dagster import AssetCheckKey, AssetCheckResult, AssetCheckSpec, AssetKey, DagsterInstance, Output, asset, materialize

    from medallion_assets.io_manager import start_check_once_per_version
    from medallion_assets.io_manager.manager import CHECKED_VERSIONS

    handled = threading.Event()

    def waits_for_the_output() -> AssetCheckResult:
        # Evaluated on the step's thread before the output, this wait could never end.
        assert handled.wait(20), "the check was evaluated before the step's output was handled"
        return AssetCheckResult(asset_key="table", check_name="beside", passed=True,
                                metadata={"seen_after_the_output": True})

    def fails() -> AssetCheckResult:
        raise ValueError("the comparison could not run")

    @asset(check_specs=[AssetCheckSpec("beside", asset="table"), AssetCheckSpec("broken", asset="table")])
    def table(context):
        beside = start_check_once_per_version(context, AssetCheckKey(AssetKey("table"), "beside"), waits_for_the_output)
        broken = start_check_once_per_version(context, AssetCheckKey(AssetKey("table"), "broken"), fails)
        yield Output(1)
        handled.set()
        yield beside.result()
        yield broken.result()

    with DagsterInstance.ephemeral() as instance:
        result = materialize([table], instance=instance, resources={}, raise_on_error=False)
    assert not result.success
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["beside"].passed
    assert evaluations["beside"].metadata["seen_after_the_output"].value is True
    assert CHECKED_VERSIONS in evaluations["beside"].metadata
    assert "broken" not in evaluations
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "the comparison could not run" in str(failure.event_specific_data.error)
