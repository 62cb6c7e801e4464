"""One lake, either engine: runs alternate between delta-rs and delta-spark on the same lake.

Each run is a process of its own (one SparkContext per process) on the same
Dagster instance. After every run silver equals the landing contract's state
computed independently and gold equals DuckDB's TPC-H answers; at the end
bronze holds every landed line once: the increments, the checkpoints and the
tombstones of one engine are carried on by the other without reprocessing or
losing a row.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medallion_assets_tests import contract_reference
from medallion_assets_tests.delta.readers import read_with_deltalake
from medallion_assets_tests.test_end_to_end import (
    SEED,
    assert_gold_matches_duckdb,
    assert_history_is_closed,
    assert_silver_matches_contract,
    landed_lines,
)
from medallion_assets_tests.test_engines import _delta_spark_jars

pytestmark = pytest.mark.slow

SCALE_FACTOR = 0.01
ENGINE_PER_RUN = ("delta-rs", "delta-spark", "delta-rs")


@pytest.mark.timeout(3000)  # three whole-graph runs, each in a process of its own
def test_runs_alternating_engines_lose_and_repeat_nothing(tmp_path):
    jars = _delta_spark_jars()
    if jars is None:
        pytest.skip("engine switch not tested: DELTA_SPARK_JARS does not name a folder of delta-spark jars")
    lake, home = tmp_path / "lake", tmp_path / "dagster_home"
    home.mkdir()
    batches = len(ENGINE_PER_RUN)
    for run, engine in enumerate(ENGINE_PER_RUN, start=1):
        env = dict(os.environ, MEDALLION_LAKE_ROOT=str(lake), DAGSTER_HOME=str(home),
                   MEDALLION_DELTA_ENGINE=engine, DELTA_SPARK_JARS=jars)
        command = [sys.executable, "-m", "medallion_assets_tests.pipeline_runner", str(SCALE_FACTOR), str(batches), str(SEED)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, f"run {run} on {engine} failed:\n{done.stderr[-6000:]}"
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["engines"] and set(report["engines"].values()) == {engine}, report["engines"]
        assert report["failed_checks"] == [], f"run {run} on {engine}: {report['failed_checks']}"
        assert_silver_matches_contract(lake)
        assert_gold_matches_duckdb(lake)
    assert_history_is_closed(lake)
    bronze = read_with_deltalake(lake / "bronze" / "orders_raw")
    per_file: dict[str, int] = {}
    for source in bronze.column("_source_file").to_pylist():
        name = Path(source.replace("file:", "")).name
        per_file[name] = per_file.get(name, 0) + 1
    assert per_file == landed_lines(sorted((lake / "landing" / "orders").glob("*.json")))
    # Silver took each increment in once: every rejected line is quarantined exactly once,
    # although each run read what the one before, on the other engine, had consumed.
    assert _quarantined_rejects(lake) == sorted(contract_reference.expected_reject_reasons(lake / "landing"))


def _quarantined_rejects(lake: Path) -> list[tuple[str, str]]:
    """``(file relative to landing, reason)`` of the quarantined lines the parsers rejected."""
    parse_reasons = {reason for _, reason in contract_reference.expected_reject_reasons(lake / "landing")}
    found = []
    for table in ("orders", "customers"):
        for row in read_with_deltalake(lake / "quarantine" / table).to_pylist():
            if row["reason"] in parse_reasons:
                match = re.search(r"((orders|customers)/[^/]+)$", row["_source_file"] or "")
                found.append((match.group(1) if match else str(row["_source_file"]), row["reason"]))
    return sorted(found)
