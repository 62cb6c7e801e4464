"""Where the suite's time goes, and an order of the tests that keeps both workers busy.

A pytest plugin (``conftest.py`` loads it):

* At the end of a run it prints each test module's total and the slowest tests,
  the other Delta engine's test session included (``test_engines.py`` runs it in a
  subprocess, which hands its figures back through the test's report), so the next
  change sees what it added.
* Under pytest-xdist it orders the tests by their recorded durations
  (``test_durations.json``): the long ones are spread over the workers first, the
  short ones fill in behind them, and xdist's work stealing evens out the rest. A
  long test that started last would otherwise decide the suite's time.
* ``--store-durations`` writes this run's figures to ``test_durations.json``, for
  a change that adds or reshapes a slow test. A test missing from it counts as short.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS_FILE = Path(__file__).parent / "test_durations.json"
#: Set for the other engine's test session: where it writes its per-test seconds.
DURATIONS_OUT_VARIABLE = "MEDALLION_TEST_DURATIONS_OUT"
#: The key of a report's user property that carries a nested session's per-test seconds.
NESTED_SESSION_PROPERTY = "nested_session_durations"
#: Tests recorded as taking longer than this are placed before the others.
LONG_TEST_SECONDS = 20.0


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        action="store_true",
        default=False,
        help=f"write this run's per-test seconds to {DURATIONS_FILE.name} (the xdist order reads it)",
    )


class _Clock:
    """Seconds per test (setup, call and teardown together), gathered where reports arrive."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.nested: dict[str, dict[str, float]] = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration
        for name, value in getattr(report, "user_properties", ()):
            if name == NESTED_SESSION_PROPERTY:
                label, seconds = value
                self.nested[label] = seconds

    def pytest_sessionfinish(self, session):
        if hasattr(session.config, "workerinput"):  # the controller has every worker's figures
            return
        nested_target = os.environ.get(DURATIONS_OUT_VARIABLE)
        if nested_target:  # the other engine's session: its figures go to the test that started it, nowhere else
            Path(nested_target).write_text(json.dumps(self.seconds, indent=0, sort_keys=True))
        elif session.config.getoption("store_durations"):
            recorded = {nodeid: round(s, 1) for nodeid, s in sorted(self.seconds.items())}
            DURATIONS_FILE.write_text(json.dumps(recorded, indent=1) + "\n")

    def pytest_terminal_summary(self, terminalreporter):
        if not self.seconds:
            return
        rows = [("", nodeid, s) for nodeid, s in self.seconds.items()]
        for label, seconds in self.nested.items():
            rows += [(label, nodeid, s) for nodeid, s in seconds.items()]
        modules: dict[tuple[str, str], float] = defaultdict(float)
        for label, nodeid, s in rows:
            modules[(label, nodeid.split("::")[0])] += s
        write = terminalreporter.write_line
        terminalreporter.section("where the time goes")
        wall = time.monotonic() - self.started
        in_tests = sum(self.seconds.values())
        write(
            f"wall {wall / 60:.1f} min; test time {in_tests / 60:.1f} min in this session "
            f"({in_tests / max(wall, 1e-9):.2f} tests at once on average)"
        )
        write("per module (minutes; a nested session's modules carry its label):")
        for (label, module), s in sorted(modules.items(), key=lambda kv: -kv[1]):
            if s >= 1.0:
                write(f"  {s / 60:6.1f}  {f'[{label}] ' if label else ''}{module}")
        write("slowest tests (seconds):")
        for label, nodeid, s in sorted(rows, key=lambda row: -row[2])[:15]:
            write(f"  {s:7.1f}  {f'[{label}] ' if label else ''}{nodeid}")


def pytest_configure(config):
    config.pluginmanager.register(_Clock(), "medallion-timing")


def recorded_durations() -> dict[str, float]:
    """Seconds per test id from the last stored run; empty when none was stored."""
    try:
        return json.loads(DURATIONS_FILE.read_text())
    except (OSError, ValueError):
        return {}


@pytest.hookimpl(trylast=True)  # after ``-m`` and ``-k`` have deselected: xdist splits what is left
def pytest_collection_modifyitems(config, items):
    workers = int(getattr(config, "workerinput", {}).get("workercount", 0))
    if workers < 2 or len(items) < workers:
        return
    items[:] = balanced_order(items, workers, recorded_durations())


def balanced_order(items: list, workers: int, seconds: dict[str, float]) -> list:
    """``items`` in the order that starts every worker of xdist's ``worksteal`` on its share of long tests.

    ``worksteal`` hands worker *k* the *k*-th of ``workers`` contiguous slices of
    the list and later lets idle workers steal from the end of busy ones. The long
    tests are dealt out longest first, each to the slice with the least recorded
    time so far, at the head of that slice; the short ones fill the slices up to
    the sizes xdist will cut, in collection order.
    """
    cost = {item.nodeid: seconds.get(item.nodeid, 0.0) for item in items}
    long_tests = sorted((i for i in items if cost[i.nodeid] > LONG_TEST_SECONDS), key=lambda i: -cost[i.nodeid])
    short_tests = [i for i in items if cost[i.nodeid] <= LONG_TEST_SECONDS]
    sizes, left = [], len(items)
    for remaining in range(workers, 0, -1):  # as xdist cuts: an even share of what is left, in turn
        sizes.append(left // remaining)
        left -= sizes[-1]
    slices: list[list] = [[] for _ in range(workers)]
    loads = [0.0] * workers
    for item in long_tests:
        open_slices = [k for k in range(workers) if len(slices[k]) < sizes[k]]
        k = min(open_slices, key=lambda j: loads[j])
        slices[k].append(item)
        loads[k] += cost[item.nodeid]
    for item in short_tests:
        k = next(k for k in range(workers) if len(slices[k]) < sizes[k])
        slices[k].append(item)
    return [item for part in slices for item in part]
