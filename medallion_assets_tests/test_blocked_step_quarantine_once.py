"""A step blocked by a failed ``expect_or_fail``, retried as it is, then fixed: each reject quarantined once.

TPC-H's order step gets a delivery with a line that does not parse, an order
a ``drop`` expectation stops and an order a ``fail`` expectation stops. The
failed expectation blocks the step: ``silver.orders`` and ``silver.lineitem``
are not written, ``quarantine.orders`` is, and the step's read position (the
oldest of its tables') stays before the delivery. The step is retried twice
on the same input, each retry blocked again and reading the delivery again;
then the producer corrects the order and the next run reads the delivery a
fourth time with the correction, and passes. Through all of it
``quarantine.orders``, read with delta-rs and with DuckDB, holds each of the
three rejects once.

The delivery is landed as plain files and ingested by the project's bronze
stream; every run is a Dagster materialization on the test session's engine.
"""

import json
from collections import Counter
from pathlib import Path

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from medallion_assets.assets.silver import QUARANTINE
from medallion_assets.definitions import resources_for
from medallion_assets.io_manager import delta_table, write_spec_from_metadata
from medallion_assets.pipelines.tpch import silver
from medallion_assets_tests.support import tpch_assets as bronze
from medallion_assets_tests.support.order_events import order_event_line
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

#: Good orders, enough that the three rejects stay under the rejected-rows check's 5% (a WARN, not an ERROR).
GOOD_ORDERS = 60
NOT_JSON = "not json at all"
#: Stopped by ``orders_status_known`` (drop) and ``orders_total_price_non_negative`` (fail).
DROPPED, FAILED = 61, 62
#: The rejects' reasons, each to be quarantined once.
EXPECTED_REASONS = Counter({"not valid JSON": 1, "orders_status_known": 1, "orders_total_price_non_negative": 1})


def land(orders_dir: Path) -> None:
    """The delivery: good orders, a line that is not JSON, one order to drop and one that fails."""
    orders_dir.mkdir(parents=True)
    lines = [
        *(order_event_line(key, f"e{key}", total=f"{key}.50") for key in range(1, GOOD_ORDERS + 1)),
        NOT_JSON,
        order_event_line(DROPPED, f"e{DROPPED}", order_fields={"o_orderstatus": "X"}),
        order_event_line(FAILED, f"e{FAILED}", total="-5.00"),
    ]
    (orders_dir / "batch-00001-001.json").write_text("\n".join(lines) + "\n", encoding="utf-8")


def quarantined(lake: Path) -> Counter:
    """The quarantine's rows (without ``_quarantined_at``) and how often each is there, read by delta-rs and DuckDB."""
    counted = []
    for reader in (read_with_deltalake, read_with_duckdb):
        rows = reader(lake / "quarantine" / "orders").to_pylist()
        counted.append(
            Counter(
                json.dumps({k: v for k, v in row.items() if k != "_quarantined_at"}, sort_keys=True) for row in rows
            )
        )
    by_deltalake, by_duckdb = counted
    assert by_deltalake == by_duckdb, "delta-rs and DuckDB read the same rows"
    return by_deltalake


def assert_each_reject_once(lake: Path, when: str) -> None:
    """The quarantine holds the delivery's three rejects, each once (the failed order with its file)."""
    rows = quarantined(lake)
    repeated = {row[:200]: n for row, n in rows.items() if n > 1}
    assert not repeated, f"{when}: rows quarantined more than once: {repeated}"
    reasons = Counter()
    for row in rows:
        reason = json.loads(row)["reason"]
        reasons.update(name for name in EXPECTED_REASONS if name in reason)
    assert reasons == EXPECTED_REASONS and rows.total() == EXPECTED_REASONS.total(), f"{when}: {rows}"
    [failed] = [json.loads(row) for row in rows if "orders_total_price_non_negative" in row]
    assert json.loads(failed["record"])["o_orderkey"] == FAILED
    assert failed["_source_file"].endswith("batch-00001-001.json")


def test_a_quarantine_is_told_apart_by_all_but_its_write_time_and_only_an_append_declares_that():
    assert write_spec_from_metadata(QUARANTINE).append_keys == ("table_name", "reason", "record", "_source_file")
    with pytest.raises(ValueError, match="append_keys apply to write mode 'append' only"):
        delta_table(write_mode="merge", merge_keys=["id"], append_keys=["id"])


# Five runs of the step: a minute or two on a quiet 2-core machine.
@pytest.mark.slow
@pytest.mark.both_engines
@pytest.mark.timeout(900)
def test_blocked_step_retried_then_fixed_quarantines_each_reject_once(spark, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    orders_dir = lake / "landing" / "orders"
    land(orders_dir)
    instance = DagsterInstance.ephemeral()
    every = [bronze.orders_raw, bronze.orders_kafka, silver.orders_and_lineitem]

    blocked = materialize(every, resources=resources_for("local"), instance=instance, raise_on_error=False)
    assert not blocked.success
    assert not (lake / "silver" / "orders").exists(), "the failed expectation kept silver unwritten"
    assert_each_reject_once(lake, "after the blocked run")

    # Retried as it is (the step alone, re-executed): blocked again on the same rows.
    for retry in (1, 2):
        again = materialize(
            every,
            selection=list(silver.orders_and_lineitem.keys),
            resources=resources_for("local"),
            instance=instance,
            raise_on_error=False,
        )
        assert not again.success
        [evaluation] = [
            e for e in again.get_asset_check_evaluations() if e.check_name == "orders_total_price_non_negative"
        ]
        assert not evaluation.passed, "the retry judged the same delivery again"
        assert AssetKey(["quarantine", "orders"]) in {e.asset_key for e in again.get_asset_materialization_events()}
        assert not (lake / "silver" / "orders").exists()
        assert_each_reject_once(lake, f"after retry {retry}")

    # The producer corrects the order; the next run reads the blocked delivery again with it, and passes.
    correction = order_event_line(FAILED, "c1", event_time="1996-01-03T08:00:00Z", total="5.00")
    (orders_dir / "batch-00002-001.json").write_text(correction + "\n", encoding="utf-8")
    fixed = materialize(every, resources=resources_for("local"), instance=instance)
    assert fixed.success
    orders = {
        row["o_orderkey"]: str(row["o_totalprice"])
        for row in read_with_deltalake(lake / "silver" / "orders").to_pylist()
    }
    assert sorted(orders) == [*range(1, GOOD_ORDERS + 1), FAILED]
    assert orders[FAILED] == "5.00"
    assert_each_reject_once(lake, "after the fixed run")
