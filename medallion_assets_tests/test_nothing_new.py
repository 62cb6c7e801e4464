"""A run with nothing new starts no JVM; one with a new landed file does the work.

Each run is a fresh process (``support/nothing_new_runner.py``), as a schedule
launches one, of a small feed's bronze and silver steps on the delta-rs
engine, on a lake of the test's own. The first run takes the landed file in;
the second, with nothing landed, must leave every table at its version, skip
the silver step, and never have started Spark in its process; then one file
lands and the third run takes it in. The schedule that launches no empty run
is ``test_ingest_schedule_skips.py``'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

pytestmark = pytest.mark.slow

TABLES = ("bronze/items_raw", "silver/items", "quarantine/items")


def _land(folder: Path, name: str, lines: list[str]) -> None:
    """A whole file, written aside and renamed, as the landing contract asks."""
    folder.mkdir(parents=True, exist_ok=True)
    aside = folder / f".{name}.tmp"
    aside.write_text("\n".join(lines) + "\n")
    aside.rename(folder / name)


def _item(item_id: str, qty: int) -> str:
    return json.dumps({"item_id": item_id, "qty": str(qty), "updated_at": "2026-03-01T10:00:00Z"})


def _run(lake: Path) -> dict:
    env = {**os.environ, "MEDALLION_LAKE_ROOT": str(lake), "MEDALLION_DELTA_ENGINE": "delta-rs"}
    done = subprocess.run(
        [sys.executable, "-m", "medallion_assets_tests.support.nothing_new_runner"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _versions(lake: Path) -> dict[str, int]:
    return {table: DeltaTable(str(lake / table)).version() for table in TABLES}


def test_a_run_with_nothing_new_starts_no_jvm_and_a_landed_file_is_taken_in(tmp_path):
    lake = tmp_path / "lake"
    landing = lake / "landing" / "items"
    _land(landing, "batch-00001.json", [_item("a", 1), _item("b", 2)])

    first = _run(lake)
    assert first["success"] and first["jvm_started"]
    assert first["materialized"] == sorted(TABLES)
    before = _versions(lake)

    quiet = _run(lake)
    assert quiet["success"]
    assert not quiet["jvm_started"], "a run with nothing new started Spark"
    assert quiet["materialized"] == []
    assert quiet["skipped"] == ["items_from_items_raw"]
    assert any("nothing new" in line and "no Spark session started" in line for line in quiet["log"])
    assert not any(line.startswith("Spark session starting") for line in quiet["log"])
    assert _versions(lake) == before

    _land(landing, "batch-00002.json", [_item("c", 3)])
    busy = _run(lake)
    assert busy["success"] and busy["jvm_started"]
    assert {"bronze/items_raw", "silver/items"} <= set(busy["materialized"])
    after = _versions(lake)
    assert after["bronze/items_raw"] > before["bronze/items_raw"]
    assert after["silver/items"] > before["silver/items"]
    assert DeltaTable(str(lake / "silver/items")).to_pyarrow_table().num_rows == 3
