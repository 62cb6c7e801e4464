"""The landing simulator: batches, noise, determinism, and that the contract
state of a full delivery is exactly the TPC-H data it started from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medallion_assets.pipelines.tpch import simulator
from medallion_assets.pipelines.tpch.contract import TPCH_SCHEMAS
from medallion_assets.pipelines.tpch.simulator import delivery
from medallion_assets_tests.support import contract_reference

SMALL_SCALE = 0.001


def _sorted(table: pa.Table, *keys: str) -> pa.Table:
    return table.sort_by([(key, "ascending") for key in keys])


@pytest.fixture(scope="module")
def small_landing(tmp_path_factory) -> Path:
    landing = tmp_path_factory.mktemp("small") / "landing"
    simulator.land_all(landing, scale_factor=SMALL_SCALE, batches=3, seed=3)
    return landing


def _events(landing: Path) -> list[tuple[str, int, dict]]:
    """(file name, line number, event) for every line that is JSON."""
    found = []
    for path in sorted((landing / "orders").glob("*.json")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
            try:
                found.append((path.name, number, json.loads(line)))
            except ValueError:
                continue
    return found


def test_batches_land_one_per_call_then_stop(tmp_path):
    landing = tmp_path / "landing"
    first = simulator.land_next_batch(landing, scale_factor=SMALL_SCALE, batches=2, seed=1)
    second = simulator.land_next_batch(landing, scale_factor=SMALL_SCALE, batches=2, seed=1)

    assert (first.batch, second.batch, second.is_last) == (1, 2, True)
    assert sorted(p.relative_to(landing).as_posix() for p in first.files) == [
        "customers/batch-00001.csv",
        "orders/batch-00001-001.json",
        "orders/batch-00001-002.json",
        *(f"reference/{table}/batch-00001.parquet" for table in sorted(contract_reference.REFERENCE_COLUMNS)),
    ]
    assert all(path.exists() for path in first.files + second.files)
    with pytest.raises(simulator.AllBatchesLandedError):
        simulator.land_next_batch(landing, scale_factor=SMALL_SCALE, batches=2, seed=1)
    assert simulator.land_all(landing, scale_factor=SMALL_SCALE, batches=2, seed=1) == []
    # Files are renamed into place: nothing half-written stays behind.
    assert not [p for p in landing.rglob(".*")]


def test_a_different_plan_in_the_same_folder_is_refused(tmp_path):
    landing = tmp_path / "landing"
    simulator.land_next_batch(landing, scale_factor=SMALL_SCALE, batches=2, seed=1)
    with pytest.raises(ValueError, match="plan"):
        simulator.land_next_batch(landing, scale_factor=SMALL_SCALE, batches=2, seed=2)


def test_same_seed_lands_the_same_bytes(tmp_path, small_landing):
    again = tmp_path / "landing"
    simulator.land_all(again, scale_factor=SMALL_SCALE, batches=3, seed=3)
    files = sorted(p.relative_to(small_landing) for p in small_landing.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    for relative in files:
        assert (small_landing / relative).read_bytes() == (again / relative).read_bytes(), relative


def test_tpch_tables_have_the_contract_types():
    tables = simulator.tpch_tables(scale_factor=SMALL_SCALE)
    for name, table in tables.items():
        assert table.schema.equals(TPCH_SCHEMAS[name]), name
    assert tables["orders"].num_rows == 1500
    assert tables["lineitem"].schema.field("l_quantity").type == pa.decimal128(15, 2)
    assert tables["part"].schema.field("p_size").type == pa.int32()


def test_full_small_delivery_is_exactly_tpch(small_landing):
    expected = simulator.tpch_tables(scale_factor=SMALL_SCALE)
    state = contract_reference.expected_silver_state(small_landing)

    assert state["orders"].equals(_sorted(expected["orders"], "o_orderkey"))
    assert state["lineitem"].equals(_sorted(expected["lineitem"], "l_orderkey", "l_linenumber"))
    assert state["customers"].equals(_sorted(expected["customer"], "c_custkey"))
    for table, columns in contract_reference.REFERENCE_COLUMNS.items():
        assert state[table].equals(_sorted(expected[table], columns[0][0], columns[1][0])), table


@pytest.mark.slow
def test_full_delivery_at_scale_factor_0_01_is_exactly_tpch(tmp_path):
    landing = tmp_path / "landing"
    simulator.land_all(landing, scale_factor=0.01, batches=2, seed=7)
    expected = simulator.tpch_tables(scale_factor=0.01)
    state = contract_reference.expected_silver_state(landing)

    assert state["orders"].num_rows == 15_000
    assert state["orders"].equals(_sorted(expected["orders"], "o_orderkey"))
    assert state["lineitem"].equals(_sorted(expected["lineitem"], "l_orderkey", "l_linenumber"))
    assert state["customers"].equals(_sorted(expected["customer"], "c_custkey"))
    for table, columns in contract_reference.REFERENCE_COLUMNS.items():
        assert state[table].equals(_sorted(expected[table], columns[0][0], columns[1][0])), table


def test_batch_one_alone_is_a_consistent_partial_state(tmp_path):
    landing = tmp_path / "landing"
    simulator.land_next_batch(landing, scale_factor=SMALL_SCALE, batches=3, seed=3)
    tpch = simulator.tpch_tables(scale_factor=SMALL_SCALE)
    state = contract_reference.expected_silver_state(landing)

    customer_keys = set(state["customers"]["c_custkey"].to_pylist())
    assert set(tpch["customer"]["c_custkey"].to_pylist()) <= customer_keys
    order_keys = state["orders"]["o_orderkey"].to_pylist()
    assert 0 < len(order_keys) < tpch["orders"].num_rows
    assert set(state["orders"]["o_custkey"].to_pylist()) <= customer_keys
    assert set(state["lineitem"]["l_orderkey"].to_pylist()) == set(order_keys)
    assert set(state) >= set(contract_reference.REFERENCE_COLUMNS)


def test_delivery_carries_every_kind_of_noise(small_landing):
    events = _events(small_landing)
    tpch_keys = set(simulator.tpch_tables(scale_factor=SMALL_SCALE)["orders"]["o_orderkey"].to_pylist())

    places_by_id = defaultdict(list)
    for file_name, _, event in events:
        places_by_id[event.get("event_id")].append(file_name)
    repeated = [files for files in places_by_id.values() if len(files) > 1]
    assert any(len(set(files)) < len(files) for files in repeated), "no duplicate within a file"
    assert any(len(set(files)) > 1 for files in repeated), "no duplicate across files"

    # An older version of an order arriving in a later file than the newest.
    by_key = defaultdict(list)
    for file_name, _, event in events:
        key = event.get("order", {}).get("o_orderkey")
        if isinstance(key, int) and event["event_time"] < "2000":
            by_key[key].append((file_name, event["event_time"], event["op"]))
    late_stale = [
        key
        for key, seen in by_key.items()
        if key in tpch_keys
        and any(file > max(seen, key=lambda s: s[1])[0] and time < max(s[1] for s in seen) for file, time, _ in seen)
    ]
    assert late_stale, "no out-of-order older version"

    # Orders no TPC-H order: phantoms (inserted, then deleted) and the ones silver's expectations drop
    # (an unknown status, every line item of quantity 0), delivered once each.
    statuses = {
        event["order"]["o_orderkey"]: event["order"].get("o_orderstatus")
        for _, _, event in events
        if event["op"] == "upsert" and isinstance(event["order"].get("o_orderkey"), int)
    }
    dropped = {
        key for key, status in statuses.items() if key not in tpch_keys and status == simulator.DROPPED_ORDER_STATUS
    }
    phantoms = {key: {op for _, _, op in seen} for key, seen in by_key.items() if key not in tpch_keys | dropped}
    assert phantoms and all(ops == {"upsert", "delete"} for ops in phantoms.values())
    assert dropped and all(len(by_key[key]) == 1 for key in dropped)
    for _, _, event in events:
        if event.get("order", {}).get("o_orderkey") in dropped:
            assert {item["l_quantity"] for item in event["order"]["lineitems"]} == {"0.00"}
    # The drop expectations of every kind of row fail, on exactly those rows (the customers' own check).
    drops = contract_reference.expected_drops(small_landing)
    items = sum(len(e["order"]["lineitems"]) for _, _, e in events if e.get("order", {}).get("o_orderkey") in dropped)
    assert drops == {
        "orders_status_known": len(dropped),
        "lineitem_quantity_positive": items,
        "customers_segment_known": drops.get("customers_segment_known", 0),
    }
    assert drops["customers_segment_known"] >= 2

    reasons = {reason for _, reason in contract_reference.expected_reject_reasons(small_landing)}
    for expected in ["not valid JSON", "missing o_orderkey", "malformed CSV line"]:
        assert expected in reasons
    for fragment in [
        "o_orderkey is not an integer",
        "o_totalprice is not a decimal",
        "l_extendedprice is not a decimal",
        "o_shippriority is not an integer",
        "o_orderdate is not a date",
        "c_custkey is not an integer",
        "c_acctbal is not a decimal",
        "updated_at is not a timestamp",
        "op is not I, U or D",
    ]:
        assert any(fragment in reason for reason in reasons), fragment


def test_customer_files_are_rfc4180_with_the_contract_header(small_landing):
    import csv

    segments = set()
    for path in sorted((small_landing / "customers").glob("*.csv")):
        with path.open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
        assert rows[0] == list(simulator.CUSTOMER_CSV_HEADER)
        assert {row[0] for row in rows[1:] if len(row) == 10} <= {"I", "U", "D", "X"}
        segments |= {row[7] for row in rows[1:] if len(row) == 10 and row[0] == "I"}
    assert simulator.DROPPED_CUSTOMER_SEGMENT in segments, "no customer that silver's expectation drops"


def test_the_command_gets_simulate_from_the_pipelines_hook():
    from medallion_assets.cli import build_parser

    args = build_parser().parse_args(["simulate", "--all", "--seed", "3"])
    assert args.func is simulator.simulate_command and args.all and args.seed == 3


def test_simulate_command_lands_under_the_lake_root(tmp_path, capsys):
    code = simulator.main(
        ["simulate", "--lake-root", str(tmp_path), "--scale-factor", str(SMALL_SCALE), "--batches", "2", "--all"]
    )
    assert code == 0
    assert json.loads((tmp_path / "landing" / simulator.STATE_FILE_NAME).read_text())["landed_batches"] == 2
    assert "landed batch 2/2" in capsys.readouterr().out
    assert simulator.main(["simulate", "--lake-root", str(tmp_path), "--scale-factor", str(SMALL_SCALE)]) == 1


def _landed_files(landing: Path, batch: int) -> list[Path]:
    prefix = f"batch-{batch:05d}"
    return sorted(p.relative_to(landing) for p in landing.rglob(f"{prefix}*") if p.is_file())


def _run_python(code: str, *, hash_seed: str) -> str:
    """Run ``code`` in a fresh interpreter (its own hash seed) and return what it printed."""
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return done.stdout


def test_another_process_lands_the_same_batch_byte_for_byte(tmp_path, small_landing):
    lake = tmp_path / "lake"
    command = ["simulate", "--lake-root", str(lake), "--scale-factor", str(SMALL_SCALE)]
    command += ["--batches", "3", "--seed", "3"]
    _run_python(
        f"from medallion_assets.pipelines.tpch import simulator; simulator.main({command!r})", hash_seed="12345"
    )

    files = _landed_files(lake / "landing", 1)
    assert files == _landed_files(small_landing, 1) and files
    for relative in files:
        assert (lake / "landing" / relative).read_bytes() == (small_landing / relative).read_bytes(), relative


def test_rendering_in_slices_changes_no_byte(tmp_path, small_landing, monkeypatch):
    # A prime slice size puts slice ends everywhere in the files.
    monkeypatch.setattr(delivery, "_RENDER_LINES", 97)
    again = tmp_path / "landing"
    simulator.land_all(again, scale_factor=SMALL_SCALE, batches=3, seed=3)
    for relative in _landed_files(small_landing, 1) + _landed_files(small_landing, 2) + _landed_files(small_landing, 3):
        assert (again / relative).read_bytes() == (small_landing / relative).read_bytes(), relative


def test_a_delivery_planned_in_many_chunks_is_exactly_tpch(tmp_path, monkeypatch):
    # 1,500 orders and 6,005 line items in chunks of 256: chunk edges cut
    # through the line items of orders, and every chunk has its own phantoms.
    monkeypatch.setattr(delivery, "CHUNK_ROWS", 256)
    landing = tmp_path / "landing"
    expected = simulator.tpch_tables(scale_factor=SMALL_SCALE)

    simulator.land_next_batch(landing, scale_factor=SMALL_SCALE, batches=3, seed=11)
    state = contract_reference.expected_silver_state(landing)
    customer_keys = set(state["customers"]["c_custkey"].to_pylist())
    assert set(expected["customer"]["c_custkey"].to_pylist()) <= customer_keys
    assert set(state["orders"]["o_custkey"].to_pylist()) <= customer_keys
    assert set(state["lineitem"]["l_orderkey"].to_pylist()) == set(state["orders"]["o_orderkey"].to_pylist())

    simulator.land_all(landing, scale_factor=SMALL_SCALE, batches=3, seed=11)
    state = contract_reference.expected_silver_state(landing)
    assert state["orders"].equals(_sorted(expected["orders"], "o_orderkey"))
    assert state["lineitem"].equals(_sorted(expected["lineitem"], "l_orderkey", "l_linenumber"))
    assert state["customers"].equals(_sorted(expected["customer"], "c_custkey"))

    # Phantom keys are unique across chunks: one order body per phantom key.
    tpch_keys = set(expected["orders"]["o_orderkey"].to_pylist())
    bodies = defaultdict(set)
    for _, _, event in _events(landing):
        order = event.get("order", {})
        key = order.get("o_orderkey")
        if event["op"] == "upsert" and isinstance(key, int) and key not in tpch_keys and event["event_time"] < "2000":
            bodies[key].add(json.dumps(order, sort_keys=True))
    assert len(bodies) > 6 and all(len(found) == 1 for found in bodies.values())


@pytest.mark.slow
def test_memory_is_bounded_by_the_chunk_not_the_scale_factor():
    scale = 0.1
    folder = simulator.tpch_folder(scale_factor=scale)
    table_bytes = sum(pq.read_table(folder / f"{name}.parquet").nbytes for name in ("orders", "lineitem"))
    code = f"""
import tempfile
import pyarrow as pa
from medallion_assets.pipelines.tpch import simulator
from medallion_assets.pipelines.tpch.simulator import delivery
delivery.CHUNK_ROWS = 4096
with tempfile.TemporaryDirectory() as landing:
    simulator.land_next_batch(landing, scale_factor={scale}, batches=2, seed=7)
print(pa.default_memory_pool().max_memory())
"""
    peak = int(_run_python(code, hash_seed="0").strip().splitlines()[-1])
    # Arrow's peak stays well under what merely holding orders and lineitem
    # takes (about 32 MB against 156 MB); the reader's buffers are most of it.
    assert peak < table_bytes / 3, (peak, table_bytes)
