"""The bronze ingest killed (SIGKILL) at several points, then rerun: no duplicate, no loss.

Each run is a real process (its own JVM). The kill points: right after a
batch's Delta commit and before Spark's checkpoint commit, while the tasks
are writing files (written, not committed), and at an arbitrary moment after
a batch was planned. Bronze is checked with delta-rs and DuckDB against the
landed lines: bronze keeps every line as delivered, once per landed file.
"""

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import deltalake
import pytest

from medallion_assets.resources import LakeResource
from medallion_assets.streaming import read_checkpoint
from medallion_assets_tests.delta.readers import read_with_deltalake, read_with_duckdb

# Not yet both_engines: the kill points are pause hooks of the delta-rs engine (medallion_assets.delta._streaming).
pytestmark = pytest.mark.slow
STREAM = "orders_raw"


def land_orders(folder: Path, files: int, lines: int) -> Counter:
    """Land NDJSON files; some lines repeat across files (at-least-once delivery)."""
    folder.mkdir(parents=True, exist_ok=True)
    expected: Counter = Counter()
    for n in range(files):
        body = [f'{{"event_id": "e{n}-{i}", "op": "upsert", "order": {{"o_orderkey": {n * 1000 + i}}}}}' for i in range(lines)]
        if n:
            body.append(f'{{"event_id": "e0-0", "op": "upsert", "order": {{"o_orderkey": 0}}}}')  # a redelivery
        body.append("not json at all")  # a bad line stays in bronze as delivered
        name = f"batch-{n:03d}.json"
        tmp = folder / f".{name}.tmp"
        tmp.write_text("\n".join(body) + "\n")
        tmp.rename(folder / name)
        expected.update((name, line) for line in body)
    return expected


def bronze_lines(table: str, reader) -> Counter:
    rows = reader(table).to_pylist()
    return Counter((os.path.basename(r["_source_file"]), r["value"]) for r in rows)


def start(root: Path, env_extra: dict[str, str]) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDALLION_DELTA_STREAM_PAUSE")}
    env.update({"PYTHONPATH": os.pathsep.join(sys.path), **env_extra})
    log = root.parent / f"run-{len(list(root.parent.glob('run-*.log')))}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "medallion_assets_tests.ingest_runner", str(root), STREAM, "1"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=log.open("wb"),
    )
    proc.log = log
    return proc


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_until(condition, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the ingest ended first (rc {proc.returncode}), see {proc.log}")
        time.sleep(0.2)
    kill(proc)
    raise AssertionError("timed out waiting for the kill point")


def test_ingest_killed_at_several_points_ends_exactly_once(tmp_path):
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    expected = land_orders(Path(lake.landing_folder(STREAM)), files=6, lines=40)
    table = lake.table_path(["bronze", STREAM])
    ckpt = lake.checkpoint_dir(STREAM)
    marker = tmp_path / "paused"

    def paused_run(point: str, batch: int) -> None:
        marker.unlink(missing_ok=True)
        proc = start(root, {"MEDALLION_DELTA_STREAM_PAUSE_AT": f"{point}:{batch}",
                            "MEDALLION_DELTA_STREAM_PAUSE_MARKER": str(marker)})
        try:
            wait_until(marker.exists, proc)
        finally:
            kill(proc)

    # 1. After batch 1's Delta commit, before Spark's checkpoint commit.
    paused_run("after_commit", 1)
    state = read_checkpoint(ckpt)
    assert 1 in state.offsets and 1 not in state.commits
    assert deltalake.DeltaTable(table).transaction_version(state.query_id) == 1

    # 2. In the middle of writing files: batch 2's task wrote its file, nothing committed.
    paused_run("during_write", 2)
    assert deltalake.DeltaTable(table).transaction_version(state.query_id) == 1
    assert 2 not in read_checkpoint(ckpt).commits

    # 3. At an arbitrary moment: as soon as batch 3 is planned.
    proc = start(root, {"MEDALLION_DELTA_STREAM_PAUSE_AT": "none"})
    try:
        wait_until(lambda: 3 in read_checkpoint(ckpt).offsets, proc)
    finally:
        kill(proc)

    # 4. A clean run to the end.
    proc = start(root, {})
    assert proc.wait(timeout=400) == 0, f"see {proc.log}"

    assert bronze_lines(table, read_with_deltalake) == expected
    assert bronze_lines(table, read_with_duckdb) == expected
    final = read_checkpoint(ckpt)
    assert final.pending() == [] and final.last_committed == 5
    assert deltalake.DeltaTable(table).transaction_version(final.query_id) == 5
