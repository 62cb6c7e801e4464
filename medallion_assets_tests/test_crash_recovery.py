"""The bronze ingest killed (SIGKILL) at several points, then rerun: no duplicate, no loss.

Each run is a real process (its own JVM) on the test session's Delta engine.
The kill points are watched from outside the process, on the disk (the
checkpoint's ``offsets/N`` and ``commits/N``, the Delta log's app
transaction, data files no commit adds; see
:mod:`medallion_assets_tests.support.kill_points`), so they work the same whether the
sink is delta-spark's DeltaSink in the JVM or the delta-rs engine's Python
sink. The points: right after a batch's Delta commit and before Spark's
checkpoint commit, while a batch's tasks are writing files (written, not
committed), and right after a batch was planned. Bronze is checked with
delta-rs and DuckDB against the landed lines: bronze keeps every line as
delivered, once per landed file.

Files land in stages, one per micro-batch (``maxFilesPerTrigger`` 1), so the
batch a kill aims at is the last one that can be planned: a run that gets
past it can only finish that batch and stop.
"""

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import deltalake
import pytest

from medallion_assets.checkpoints import read_checkpoint
from medallion_assets.pipelines.tpch.feeds import ORDERS_RAW
from medallion_assets.resources import LakeResource
from medallion_assets_tests.support.kill_points import StreamWatch, kill_when, sink_engines, undo_checkpoint_commit
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

# Four ingest processes, each a JVM of its own: minutes each on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.both_engines, pytest.mark.timeout(2400)]
STREAM = "orders_raw"
#: Lines of the file whose batch is killed while writing. Its files exist for
#: tens of milliseconds before their commit, whatever its size (the kill steps
#: the process through that batch to see them): enough lines for a few Arrow
#: batches, small enough to stay quick.
BIG_FILE_LINES = 50_000


def land_order_file(folder: Path, n: int, lines: int) -> Counter:
    """Land one NDJSON file; after the first, each repeats a line of file 0 (at-least-once delivery)."""
    folder.mkdir(parents=True, exist_ok=True)
    body = [
        f'{{"event_id": "e{n}-{i}", "op": "upsert", "order": {{"o_orderkey": {n * 100_000 + i}}}}}'
        for i in range(lines)
    ]
    if n:
        body.append('{"event_id": "e0-0", "op": "upsert", "order": {"o_orderkey": 0}}')  # a redelivery
    body.append("not json at all")  # a bad line stays in bronze as delivered
    name = f"batch-{n:03d}.json"
    tmp = folder / f".{name}.tmp"
    tmp.write_text("\n".join(body) + "\n")
    tmp.rename(folder / name)
    return Counter((name, line) for line in body)


def bronze_lines(table: str, reader) -> Counter:
    rows = reader(table).to_pylist()
    return Counter((os.path.basename(r["_source_file"]), r["value"]) for r in rows)


def start(root: Path) -> subprocess.Popen:
    """The ingest in a process group of its own, on the engine ``MEDALLION_DELTA_ENGINE`` names."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log = root.parent / f"run-{len(list(root.parent.glob('run-*.log')))}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "medallion_assets_tests.support.ingest_runner", str(root), STREAM, "1"],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    proc.log = log
    return proc


def test_ingest_killed_at_several_points_ends_exactly_once(tmp_path, delta_engine):
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    landing = Path(lake.landing_folder(ORDERS_RAW))
    table = lake.table_path(["bronze", STREAM])
    ckpt = lake.checkpoint_dir(STREAM)
    watch = StreamWatch(ckpt, table)
    expected: Counter = Counter()

    def txn_version() -> int | None:
        return deltalake.DeltaTable(table).transaction_version(read_checkpoint(ckpt).query_id)

    # 1. After batch 1's Delta commit, before Spark's checkpoint commit of batch 1.
    # The kill fires as soon as the log holds the commit with batch 1's app
    # transaction; Spark writes commits/1 a few hundred ms after that here, but
    # under load the kill may come after it. Then the process stopped right
    # after commits/1 (batch 1 is the last one landed: nothing else to plan),
    # and removing commits/1 (and its .crc) recreates exactly the state of a
    # crash between the two writes.
    for n in (0, 1):
        expected += land_order_file(landing, n, 40)
    seen = kill_when(start(root), watch, lambda s: s.txn is not None and s.txn >= 1, what="batch 1's Delta commit")
    state = read_checkpoint(ckpt)
    assert max(state.offsets) == 1, f"nothing after batch 1 can be planned: {state}"
    if undo_checkpoint_commit(ckpt, 1):
        print("1: killed after commits/1 was written; commits/1 removed")
    else:
        print(f"1: killed between the Delta commit and commits/1 (seen {sorted(seen.commits)})")
    state = read_checkpoint(ckpt)
    assert 1 in state.offsets and 1 not in state.commits
    assert txn_version() == 1

    # 2. While batch 2's tasks write their files: a data file no commit adds
    # is there, and the log has no transaction of batch 2. (The rerun first
    # replays batch 1, which the sink must skip.)
    expected += land_order_file(landing, 2, BIG_FILE_LINES)
    earlier_orphans = watch.look().uncommitted
    seen = kill_when(
        start(root),
        watch,
        lambda s: 2 in s.offsets and s.txn == 1 and bool(s.uncommitted - earlier_orphans),
        what="batch 2's tasks writing",
        # The files exist for tens of milliseconds before their commit: step through batch 2.
        step_once=lambda s: 2 in s.offsets,
    )
    print(f"2: killed with {len(seen.uncommitted - earlier_orphans)} uncommitted file(s) of batch 2")
    assert txn_version() == 1, "killed before batch 2's Delta commit"
    state = read_checkpoint(ckpt)
    assert 1 in state.commits and 2 in state.offsets and 2 not in state.commits
    assert watch.look().uncommitted - earlier_orphans, "batch 2's written files stay behind, uncommitted"

    # 3. Right after batch 3 is planned (offsets/3 written). The rerun first
    # redoes batch 2 from its offsets.
    expected += land_order_file(landing, 3, 40)
    kill_when(start(root), watch, lambda s: 3 in s.offsets, what="batch 3 planned")
    state = read_checkpoint(ckpt)
    assert 2 in state.commits and 3 in state.offsets and 3 not in state.commits
    assert txn_version() == 2
    print("3: killed after offsets/3")

    # 4. A clean run to the end.
    for n in (4, 5):
        expected += land_order_file(landing, n, 40)
    proc = start(root)
    assert proc.wait(timeout=600) == 0, f"see {proc.log}"

    assert bronze_lines(table, read_with_deltalake) == expected
    assert bronze_lines(table, read_with_duckdb) == expected
    final = read_checkpoint(ckpt)
    assert final.pending() == [] and final.last_committed == 5
    assert deltalake.DeltaTable(table).transaction_version(final.query_id) == 5
    assert sink_engines(table) == {delta_engine}, "the runs used the test session's engine"
