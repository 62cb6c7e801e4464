"""Silver's orders step killed (SIGKILL) between two of its commits, then rerun: every reject quarantined once.

TPC-H's order step (``orders_and_lineitem``) writes ``silver.orders``
(merge), ``silver.lineitem`` (merge) and ``quarantine.orders`` (append) from
the bronze increment it has not consumed, and the next run starts after the
oldest increment any of the three recorded. A run killed once one of
``silver.orders`` and ``quarantine.orders`` holds its commit and the other
does not reads the increment again: the merges take it in again without a
change, and the append must not land twice. The kill waits for exactly one of
the two, whichever the step writes first, so the test fails if the quarantine
is written before the merges (as it was until the step put it last: each
reject was quarantined twice).

Bronze is a small delivery landed with plain Python (an update, a redelivery,
a delete, bad lines, rows that fail silver's drop expectations) and ingested
by the project's bronze stream, then copied to a second lake. On that copy
the step runs as a process of its own (its own JVM, on the test session's
engine) and is killed at the point seen from outside: the ``dagster_run_id``
the IO manager records in each Delta commit (see
:mod:`medallion_assets_tests.support.kill_points`). Then the step runs undisturbed
on the first lake, in the test session, and runs again to the end on the copy,
in the test session too (a JVM that never saw the killed run). The three
tables of both lakes are read with delta-rs and DuckDB and compared as
multisets of rows, without the quarantine's and bronze's timestamps.

About 75 s on delta-rs and 110 s on delta-spark on a 2-core machine: the step
takes 15 to 30 s per run even on these 20 lines, and it runs three times (one
of them in a new JVM).
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from dagster import materialize

from medallion_assets.definitions import resources_for
from medallion_assets_tests.support import tpch_assets as bronze
from medallion_assets_tests.support.kill_points import RunCommitWatch, kill_when
from medallion_assets_tests.support.order_events import order_event_line
from medallion_assets_tests.support.pipeline_runner import ran_to_the_end, run_orders_step
from medallion_assets_tests.support.processes import stop_group
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

# Three runs of the step, one in a process (a JVM) of its own: minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.both_engines, pytest.mark.timeout(900)]

LATER = "1996-01-05T09:00:00Z"
#: Lines the parser rejects, one delivered twice: a line is quarantined as often as it was delivered.
BAD_LINES = [
    "not json at all",
    "[1, 2]",
    json.dumps({"event_time": LATER, "op": "upsert", "order": {"o_orderkey": 30}}),  # no event_id
    json.dumps({"event_id": "m1", "event_time": LATER, "op": "merge", "order": {"o_orderkey": 31}}),
    order_event_line(32, "t1", total="twelve"),
    "not json at all",
]
#: Lines that parse: orders 1 to 8, 10 and 11 are upserted (one line item each), order 2 updated,
#: order 4 redelivered, order 5 deleted; order 9 and order 10's line item fail a drop expectation.
GOOD_LINES = [
    *(order_event_line(key, f"e{key}", total=f"{key}.50") for key in range(1, 9)),
    order_event_line(2, "u2", event_time=LATER, total="200.00"),
    order_event_line(4, "e4", total="4.50"),
    json.dumps({"event_id": "d5", "event_time": LATER, "op": "delete", "order": {"o_orderkey": 5}}),
    order_event_line(9, "e9", order_fields={"o_orderstatus": "X"}),  # orders_status_known
    order_event_line(10, "e10", item_fields={"l_discount": "1.50"}),  # lineitem_discount_in_range
    order_event_line(11, "e11"),
]
#: What one undisturbed run leaves in each table (order 9's line item is kept: it passes lineitem's expectations).
EXPECTED_ROWS = {"silver/orders": 9, "silver/lineitem": 9, "quarantine/orders": len(BAD_LINES) + 2}
#: The two tables the kill falls between.
WATCHED = ("silver/orders", "quarantine/orders")
#: Columns that say when a row was written, not what it holds.
WRITE_TIMES = {"_ingested_at", "_quarantined_at"}


def land(landing: Path) -> None:
    """Two order event files, good and bad lines mixed, as a producer delivers them."""
    landing.mkdir(parents=True)
    for n, lines in enumerate((GOOD_LINES[:6] + BAD_LINES[:3], GOOD_LINES[6:] + BAD_LINES[3:]), start=1):
        (landing / f"batch-00001-{n:03d}.json").write_text("\n".join(lines) + "\n", encoding="utf-8")


def start_step(lake: Path, run_id: str) -> subprocess.Popen:
    """The orders step as Dagster run ``run_id`` on ``lake``, in a process group of its own."""
    env = {**os.environ, "MEDALLION_LAKE_ROOT": str(lake), "PYTHONPATH": os.pathsep.join(sys.path)}
    log = lake.parent / "killed-step.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "medallion_assets_tests.support.pipeline_runner", "orders_step", run_id],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    proc.log = log
    return proc


def row_counts(table: Path, reader) -> Counter:
    """The table's rows as a multiset, the write-time columns left out."""
    return Counter(
        json.dumps({k: v for k, v in row.items() if k not in WRITE_TIMES}, sort_keys=True, default=str)
        for row in reader(table).to_pylist()
    )


def assert_same_rows(crashed: Path, undisturbed: Path, name: str) -> int:
    """The table holds the same rows in both lakes, read by delta-rs and by DuckDB; how many."""
    for reader in (read_with_deltalake, read_with_duckdb):
        got, want = row_counts(crashed / name, reader), row_counts(undisturbed / name, reader)
        extra, missing = got - want, want - got
        assert not extra and not missing, (
            f"{name} ({reader.__name__}): {got.total()} rows after the kill and the rerun, {want.total()} "
            f"undisturbed; {extra.total()} extra, e.g. {[r[:300] for r in list(extra)[:2]]}; "
            f"{missing.total()} missing, e.g. {[r[:300] for r in list(missing)[:2]]}"
        )
    return want.total()


def test_step_killed_between_its_commits_then_rerun_equals_an_undisturbed_run(
    spark, tmp_path, monkeypatch, delta_engine
):
    undisturbed, crashed = tmp_path / "undisturbed", tmp_path / "crashed"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(undisturbed))
    land(undisturbed / "landing" / "orders")
    assert materialize([bronze.orders_raw, bronze.orders_kafka], resources=resources_for("local")).success
    shutil.copytree(undisturbed / "bronze", crashed / "bronze")

    # The killed run: SIGKILL as soon as exactly one of the two tables holds a commit of it.
    killed_run = str(uuid.uuid4())
    watch = RunCommitWatch({name: str(crashed / name) for name in WATCHED}, killed_run)
    proc = start_step(crashed, killed_run)
    try:
        fired = kill_when(
            proc,
            watch,
            lambda look: len(look.tables) == 1,
            timeout=300,
            what="a commit of the run in exactly one of silver/orders and quarantine/orders",
        )
    finally:
        stop_group(proc, grace=0)
    assert proc.returncode == -9, f"the step was killed, it did not end (rc {proc.returncode}); see {proc.log}"
    # The logs read again after the kill: no commit landed between the look that fired and the kill.
    at_kill = RunCommitWatch({name: str(crashed / name) for name in EXPECTED_ROWS}, killed_run).look()
    [first] = fired.tables
    assert at_kill.tables & set(WATCHED) == {first}, f"killed between the two commits: {at_kill}"
    assert at_kill.engines == {delta_engine}, "the killed run used the test session's engine"
    print(
        f"killed after the run's commit to {first}; tables with a commit of the run: "
        f"{sorted(at_kill.tables)}; versions {dict(at_kill.versions)}"
    )

    # The undisturbed run, then the rerun to the end on the lake of the killed run.
    # Both end on the rejected-rows check, an ERROR (8 of 19 lines are bad on purpose), after their writes.
    assert ran_to_the_end(run_orders_step(str(uuid.uuid4())))
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(crashed))
    assert ran_to_the_end(run_orders_step(str(uuid.uuid4())))

    counts = {name: assert_same_rows(crashed, undisturbed, name) for name in EXPECTED_ROWS}
    assert counts == EXPECTED_ROWS
