"""Silver's schema-drift policy, through real Dagster runs: ignore unknown order fields, or evolve the tables."""

from __future__ import annotations

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from medallion_assets.definitions import resources_for
from medallion_assets.pipelines.tpch import silver
from medallion_assets_tests.support import tpch_assets as bronze
from medallion_assets_tests.support.order_events import order_event_line
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

pytestmark = [pytest.mark.slow, pytest.mark.both_engines]


def _event(key: int, event_id: str, event_time: str, **extra) -> str:
    # Every line carries an envelope field too ("channel"), which no policy keeps.
    return order_event_line(
        key,
        event_id,
        event_time=event_time,
        envelope_fields={"channel": "web"},
        order_fields={k: v for k, v in extra.items() if k.startswith("o_")},
        item_fields={k: v for k, v in extra.items() if k.startswith("l_")},
    )


def _land(lake, name: str, lines: list[str]) -> None:
    folder = lake / "landing" / "orders"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _run(policy: str, instance: DagsterInstance):
    # The step as a deployment without Kafka loads it: it reads the landed files alone.
    result = materialize(
        [bronze.orders_raw, *silver.assets_without({bronze.orders_kafka.key})],
        resources=resources_for("local"),
        instance=instance,
        run_config={"ops": {"orders_and_lineitem": {"config": {"schema_drift": policy}}}},
    )
    return {e.asset_key: e.materialization.metadata for e in result.get_asset_materialization_events()}


def _by_key(rows: list[dict], key: str) -> dict:
    return {row[key]: row for row in rows}


def test_evolve_adds_drifted_fields_as_columns_and_later_rows_without_them_store_null(spark, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    _land(
        lake,
        "batch-00001-001.json",
        [
            _event(1, "e1", "1996-01-02T10:00:00Z"),
            _event(2, "e2", "1996-01-02T10:00:00Z", o_loyalty_tier="gold", l_gift_wrap=True),
        ],
    )

    # One instance for both runs: silver reads only what bronze gained since the run before.
    instance = DagsterInstance.ephemeral()
    first = _run("evolve", instance)

    orders = lake / "silver" / "orders"
    lineitem = lake / "silver" / "lineitem"
    assert first[AssetKey(["silver", "orders"])]["schema_drift_kept"].value == ["o_loyalty_tier"]
    assert first[AssetKey(["silver", "orders"])]["schema_drift_ignored"].value == ["event.channel"]
    assert first[AssetKey(["silver", "lineitem"])]["schema_drift_kept"].value == ["l_gift_wrap"]
    stored = _by_key(read_with_deltalake(orders).to_pylist(), "o_orderkey")
    assert {k: row["o_loyalty_tier"] for k, row in stored.items()} == {1: None, 2: "gold"}
    items = _by_key(read_with_duckdb(lineitem).to_pylist(), "l_orderkey")
    assert {k: row["l_gift_wrap"] for k, row in items.items()} == {1: None, 2: "true"}

    # Batch 2: order 2 changes without the field (its value is gone with the
    # whole-order upsert), order 3 brings new fields to tables that already evolved.
    _land(
        lake,
        "batch-00002-001.json",
        [
            _event(2, "e3", "1996-01-03T10:00:00Z"),
            _event(3, "e4", "1996-01-03T10:00:00Z", o_priority_lane="express", l_fragile="yes"),
        ],
    )
    second = _run("evolve", instance)
    assert second[AssetKey(["silver", "lineitem"])]["schema_drift_kept"].value == ["l_fragile"]

    stored = _by_key(read_with_deltalake(orders).to_pylist(), "o_orderkey")
    assert {k: (row["o_loyalty_tier"], row["o_priority_lane"]) for k, row in stored.items()} == {
        1: (None, None),
        2: (None, None),
        3: (None, "express"),
    }
    items = _by_key(read_with_deltalake(lineitem).to_pylist(), "l_orderkey")
    assert {k: (row["l_gift_wrap"], row["l_fragile"]) for k, row in items.items()} == {
        1: (None, None),
        2: (None, None),
        3: (None, "yes"),
    }
    assert set(read_with_duckdb(orders).column_names) >= {"o_loyalty_tier", "o_priority_lane"}


def test_ignore_keeps_the_contract_schema_and_reports_the_ignored_fields(spark, tmp_path, monkeypatch):
    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    _land(lake, "batch-00001-001.json", [_event(1, "e1", "1996-01-02T10:00:00Z", o_loyalty_tier="gold", l_gift_wrap=1)])

    metadata = _run("ignore", DagsterInstance.ephemeral())

    from medallion_assets.pipelines.tpch.transforms import LINEITEM_SCHEMA, ORDERS_SCHEMA

    assert metadata[AssetKey(["silver", "orders"])]["schema_drift_ignored"].value == [
        "event.channel",
        "lineitem.l_gift_wrap",
        "order.o_loyalty_tier",
    ]
    orders = read_with_deltalake(lake / "silver" / "orders")
    assert [c for c in orders.column_names if not c.startswith("_")] == ORDERS_SCHEMA.fieldNames()
    assert orders.column("o_orderkey").to_pylist() == [1]
    lineitem = read_with_deltalake(lake / "silver" / "lineitem")
    assert [c for c in lineitem.column_names if not c.startswith("_")] == LINEITEM_SCHEMA.fieldNames()
    # Bronze keeps the raw line, drifted fields included.
    [raw] = read_with_deltalake(lake / "bronze" / "orders_raw").column("value").to_pylist()
    assert "o_loyalty_tier" in raw
