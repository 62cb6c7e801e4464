"""docs/adding-a-feed.md, followed literally in both its forms: its blocks are the new pipeline's files.

The Python form is the page's two Python blocks as one file; the YAML form is
its YAML block as ``payments/defs.yaml`` and the gold block as a module of its
own. Each is written, as it is, to a package of pipelines named in
``MEDALLION_PIPELINES`` (the test must not write into the checkout, which other
workers read at the same time; the page offers both places). Files land as the
page says: its two example lines, a correction, bad lines of each kind the page
names, and a line with a field the declaration does not name, written with
plain Python (the writer under test is the bronze stream). Then the project's
own definitions are built and the feed is materialized with TPC-H's orders
upstream of its gold table. Bronze, silver, its history and gold are read back
with delta-rs and DuckDB. That both forms declare the very same feed is
``test_feed_component.py``'s (cheap); this run, the expensive part, follows the
whole page once per form.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path

import pytest
from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    DagsterInstance,
    build_sensor_context,
    materialize,
)

from medallion_assets_tests.support.feed_page import blocks, forget, write_page_pipeline
from medallion_assets_tests.support.order_events import order_event_line
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

pytestmark = [pytest.mark.slow, pytest.mark.both_engines]

BRONZE, SILVER = AssetKey(["bronze", "payments_raw"]), AssetKey(["silver", "payments"])
QUARANTINE, GOLD = AssetKey(["quarantine", "payments"]), AssetKey(["gold", "order_payments"])
HISTORY = AssetKey(["silver", "payments_history"])


@pytest.fixture(params=["python", "yaml"])
def page_pipeline(request, tmp_path, monkeypatch):
    """The page's feed in one form, as the package ``doc_pipelines_<form>``, found through ``MEDALLION_PIPELINES``."""
    package = f"doc_pipelines_{request.param}"
    write_page_pipeline(tmp_path / "pipelines", package, request.param)
    monkeypatch.syspath_prepend(str(tmp_path / "pipelines"))
    monkeypatch.setenv("MEDALLION_PIPELINES", package)
    yield request.param
    forget(package)


def land(folder: Path, name: str, lines: list[str]) -> None:
    """Whole files only, as the landing contract asks: write aside, then rename."""
    folder.mkdir(parents=True, exist_ok=True)
    aside = folder / f".{name}.tmp"
    aside.write_text("\n".join(lines) + "\n")
    aside.rename(folder / name)


def payment(payment_id: str, order_key: int, amount: str, paid_at: str, **extra) -> str:
    return json.dumps({"payment_id": payment_id, "order_key": order_key, "amount": amount, "paid_at": paid_at, **extra})


def test_the_page_adds_a_feed_that_gets_every_piece(spark, tmp_path, monkeypatch, page_pipeline):
    from medallion_assets.continuous import ContinuousStreamsConfig, run_continuous
    from medallion_assets.definitions import build_definitions
    from medallion_assets.resources import LakeResource

    lake_root = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake_root))
    lake = LakeResource(root=str(lake_root))
    landing = lake_root / "landing"
    land(
        landing / "orders",
        "batch-00001.json",
        [order_event_line(1, "e1", total="200.00"), order_event_line(2, "e2", total="80.00")],
    )
    example = [line for line in blocks("json")[0].splitlines() if line.strip()]
    land(
        landing / "payments",
        "batch-00001.json",
        [
            *example,
            payment("pay-0001", 1, "100.50", "2026-11-02T11:00:00Z"),  # a correction: later paid_at wins
            payment("pay-0003", 2, "-5.00", "2026-11-02T12:00:00Z"),  # dropped by the expectation
            payment("pay-0004", 2, "ten", "2026-11-02T12:00:00Z"),
            json.dumps({"payment_id": "pay-0005", "order_key": 2, "paid_at": "2026-11-02T12:00:00Z"}),
            "not json at all",
            payment("pay-0006", 2, "20.00", "2026-11-02T13:00:00Z", card_brand="visa"),  # drift: kept in bronze
        ],
    )

    defs = build_definitions("local", simulator=False)
    repo = defs.get_repository_def()
    keys = repo.asset_graph.get_all_asset_keys()
    assert {BRONZE, SILVER, QUARANTINE, GOLD} <= keys
    assert not repo.asset_graph.get(BRONZE).parent_keys, "no simulator upstream of a real feed"
    with_demo = build_definitions("local", simulator=True).get_repository_def().asset_graph
    assert AssetKey(["landing", "simulated_batch"]) not in with_demo.get(BRONZE).parent_keys
    sensor = repo.get_sensor_def("payments_raw_checkpoint_sensor")
    check_keys = {(k.asset_key, k.name) for k in repo.asset_graph.asset_check_keys}
    assert {
        (BRONZE, "stream_health"),
        (SILVER, "payments_amount_positive"),
        (SILVER, "payments_key_unique"),
        (SILVER, "freshness_check"),
    } <= check_keys

    assert HISTORY in keys
    wanted = {
        BRONZE,
        SILVER,
        QUARANTINE,
        GOLD,
        HISTORY,
        AssetKey(["bronze", "orders_raw"]),
        AssetKey(["bronze", "orders_kafka"]),
        AssetKey(["silver", "orders"]),
    }
    assets = list({id(a): a for a in defs.assets if set(getattr(a, "keys", ())) & wanted}.values())
    checks = [c for c in defs.asset_checks if {k.asset_key for k in c.check_keys} <= {BRONZE, SILVER}]
    instance = DagsterInstance.ephemeral()
    result = materialize([*assets, *checks], resources=defs.resources, instance=instance, raise_on_error=False)
    # The page's sample is a broken delivery by the default rule (4 of 9 lines rejected): the run fails on
    # the blocking rejected-rows check once silver and quarantine are written, and gold is not computed.
    failed = {
        e.step_key: e.step_failure_data.error.cls_name
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    }
    assert not result.success and set(failed.values()) == {"DagsterAssetCheckFailedError"}, failed
    assert GOLD not in {e.asset_key for e in result.get_asset_materialization_events()}
    # Run again, as the page says: nothing new to read, the check passes, gold is computed.
    again = materialize([*assets, *checks], resources=defs.resources, instance=instance)
    assert GOLD in {e.asset_key for e in again.get_asset_materialization_events()}

    # Bronze: every line as delivered, bad ones included.
    bronze = read_with_deltalake(str(lake_root / "bronze" / "payments_raw"))
    landed = (landing / "payments" / "batch-00001.json").read_text().splitlines()
    assert sorted(bronze.column("value").to_pylist()) == sorted(landed)

    # Silver: one row per payment, typed, the latest paid_at winning; read by DuckDB.
    silver = {r["payment_id"]: r for r in read_with_duckdb(str(lake_root / "silver" / "payments")).to_pylist()}
    assert sorted(silver) == ["pay-0001", "pay-0002", "pay-0006"]
    assert silver["pay-0001"]["amount"] == Decimal("100.50") and silver["pay-0001"]["order_key"] == 1
    assert silver["pay-0002"]["amount"] == Decimal("80.00")
    assert "card_brand" not in read_with_duckdb(str(lake_root / "silver" / "payments")).column_names
    # Each row's _sequence: the sequence fields as sortable text, then the change's file as bronze names it.
    [landed_file] = set(bronze.column("_source_file").to_pylist())
    assert landed_file.endswith("payments/batch-00001.json")
    assert silver["pay-0001"]["_sequence"] == f"2026-11-02T11:00:00.000000|{landed_file}"

    # The history: both versions of the corrected payment, nothing of the refused ones.
    history = read_with_duckdb(str(lake_root / "silver" / "payments_history")).to_pylist()
    assert sorted(history[0]) == sorted(
        ["payment_id", "order_key", "amount", "paid_at", "valid_from", "valid_to", "is_current", "is_deleted"]
    )
    versions = sorted((r["payment_id"], r["amount"], r["is_current"], r["is_deleted"]) for r in history)
    assert versions == [
        ("pay-0001", Decimal("100.50"), True, False),
        ("pay-0001", Decimal("120.50"), False, False),
        ("pay-0002", Decimal("80.00"), True, False),
        ("pay-0006", Decimal("20.00"), True, False),
    ]
    [closed] = [r for r in history if not r["is_current"]]
    assert closed["valid_to"] == silver["pay-0001"]["paid_at"] and closed["valid_from"] == closed["paid_at"]

    # Quarantine: each bad line with the reason the page names, and its file.
    quarantine = read_with_deltalake(str(lake_root / "quarantine" / "payments")).to_pylist()
    assert sorted(r["reason"] for r in quarantine) == sorted(
        [
            "not valid JSON",
            "missing amount",
            "amount is not a decimal: 'ten'",
            "payments_amount_positive: amount > 0",
        ]
    )
    assert all(r["_source_file"].endswith("batch-00001.json") for r in quarantine)

    # Gold: what each order has been paid.
    gold = {r["o_orderkey"]: r for r in read_with_duckdb(str(lake_root / "gold" / "order_payments")).to_pylist()}
    assert gold[1]["paid"] == Decimal("100.50") and gold[1]["outstanding"] == Decimal("99.50")
    assert gold[2]["paid"] == Decimal("100.00") and gold[2]["payment_count"] == 2

    # Checks: the expectation fails amber with the dropped row (handled as declared, not good data);
    # the rejected-rows check counts the four rows quarantined, an ERROR (4 of 9 lines, above the
    # default 5%) naming their file; the key is unique.
    evaluations = {
        (e.asset_key, e.check_name): e
        for e in [*again.get_asset_check_evaluations(), *result.get_asset_check_evaluations()]
    }
    dropped = evaluations[(SILVER, "payments_amount_positive")]
    assert not dropped.passed and dropped.severity == AssetCheckSeverity.WARN
    assert dropped.metadata["failing_rows"].value == 1
    rejected = evaluations[(SILVER, "payments_rejected_rows")]
    assert not rejected.passed and rejected.severity == AssetCheckSeverity.ERROR
    assert rejected.metadata["rejected_rows"].value == len(quarantine)
    assert "batch-00001.json" in rejected.metadata["rejected_files"].value
    assert evaluations[(SILVER, "payments_key_unique")].passed
    assert evaluations[(BRONZE, "stream_health")].passed

    # Column schema: the declared descriptions on bronze and silver, the gold ones on gold.
    def described(key):
        # Each table's materialization in the run that computed it (gold: the second).
        [event] = [
            m for m in (result if key != GOLD else again).get_asset_materialization_events() if m.asset_key == key
        ]
        schema = event.materialization.metadata["dagster/column_schema"].value
        return {c.name: c.description for c in schema.columns}

    assert described(SILVER)["amount"] == "Amount paid."
    assert described(SILVER)["order_key"] == "The order paid (silver.orders.o_orderkey)."
    assert described(BRONZE)["value"] and described(BRONZE)["_source_file"]
    assert described(GOLD)["outstanding"] == "o_totalprice minus paid."

    # The checkpoint sensor reports the batch with its schema drift.
    with build_sensor_context(instance=instance, resources={"lake": lake}) as context:
        ticked = sensor(context)
    [batch] = [e for e in ticked.asset_events if isinstance(e, AssetMaterialization) and e.asset_key == BRONZE]
    assert batch.metadata["schema_drift_fields"].value == ["card_brand"]
    assert batch.metadata["schema_drift_rows"].value == 1
    assert ticked.run_requests, "a batch with rows requests silver and gold"

    if page_pipeline == "yaml":
        return  # continuous mode takes the feed by its name: the same Feed, the same stream (the Python run shows it)
    # Continuous mode runs the new stream by its name.
    land(landing / "payments", "batch-00002.json", [payment("pay-0007", 1, "1.00", "2026-11-03T09:00:00Z")])
    table = str(lake_root / "bronze" / "payments_raw")
    config = ContinuousStreamsConfig(
        streams=["payments_raw"], trigger_interval="1 second", run_seconds=120, poll_seconds=0.5
    )
    started = time.monotonic()
    # Stop on the logged progress, not on the table: Spark commits a batch to the
    # table before it reports the batch's progress, and a stop in between loses the report.
    logged: list[str] = []
    run = run_continuous(
        spark,
        lake,
        config,
        install_signal_handlers=False,
        log_progress=logged.append,
        should_stop=lambda: any(line.startswith("payments_raw: batch ") for line in logged),
    )
    assert run.progress["payments_raw"], "continuous mode ran the feed's stream"
    assert len(read_with_deltalake(table)) == len(landed) + 1
    assert time.monotonic() - started < 120
