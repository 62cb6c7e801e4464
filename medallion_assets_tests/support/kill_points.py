"""Kill a streaming query's process at a point seen from outside it.

A crash test must not need hooks inside the engine (the JVM's DeltaSink has
none), so the points are read off the disk, the way a crash leaves them:

* the checkpoint: ``offsets/N`` (batch N planned) and ``commits/N`` (batch N
  done, as far as Spark knows);
* the Delta log: a commit file carrying the query's app transaction
  (``txn`` action, ``appId`` = the query id from the checkpoint's
  ``metadata``, ``version`` = the batch id); both engines' sinks record one;
* the table folder: data files no commit of the log adds (a batch's tasks are
  writing, or wrote and were not committed). Both engines write a task's
  Parquet file in place under the table folder and name it in the commit.

For a Dagster step writing several tables, :class:`RunCommitWatch` reads which
of them already hold a commit of a given run: the IO manager records
``dagster_run_id`` in every commit's custom metadata, on either engine.

:func:`kill_when` polls these every 20 ms and SIGKILLs the process group as
soon as a condition holds. A point that lasts only tens of milliseconds (a
batch's files written and not yet committed: about 40 to 80 ms for the
delta-rs engine's sink, whatever the batch's size) is missed by a 20 ms poll
whenever the test process is not scheduled for a moment, so ``kill_when`` can
run the process in steps once it nears the point: it is stopped (SIGSTOP)
while each look is taken and runs only a few milliseconds between looks.
Everything here only reads, except :func:`undo_checkpoint_commit`, which a test uses to recreate a crash state
an outside kill cannot hit reliably (see its docstring).
:func:`sink_engines` tells which engine wrote a stream's commits, so a test
run on one engine can check its subprocesses ran that engine too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar
from urllib.parse import unquote

from medallion_assets_tests.support.processes import signal_group

POLL_SECONDS = 0.02
#: How long the process runs between two looks once :func:`kill_when` steps it.
STEP_SECONDS = 0.005


@dataclass(frozen=True)
class Seen:
    """One look at a stream's checkpoint and table."""

    offsets: frozenset[int]
    """Batches with an ``offsets/N`` file (planned)."""
    commits: frozenset[int]
    """Batches with a ``commits/N`` file (committed in the checkpoint)."""
    txn: int | None
    """The highest batch id the Delta log records for the query (None: none yet)."""
    uncommitted: frozenset[str]
    """Data files (relative paths) under the table folder that no Delta commit adds."""
    at: float = field(default_factory=time.monotonic)


def _numbered(folder: str) -> frozenset[int]:
    try:
        return frozenset(int(name) for name in os.listdir(folder) if name.isdigit())
    except FileNotFoundError:
        return frozenset()


class StreamWatch:
    """Reads a stream's checkpoint folder and its Delta table incrementally.

    Each Delta commit file is parsed once (they never change once renamed into
    place), so a look costs a few directory listings.
    """

    def __init__(self, checkpoint: str, table: str) -> None:
        self.checkpoint = checkpoint
        self.table = table
        self.query_id: str | None = None
        self._parsed: set[int] = set()
        self._txn_by_app: dict[str, int] = {}
        self._added: set[str] = set()

    def _read_query_id(self) -> str | None:
        if self.query_id is None:
            try:
                with open(os.path.join(self.checkpoint, "metadata")) as handle:
                    self.query_id = json.loads(handle.readline()).get("id")
            except (FileNotFoundError, ValueError):
                pass
        return self.query_id

    def _read_log(self) -> None:
        folder = os.path.join(self.table, "_delta_log")
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return
        for name in sorted(names):
            stem = name[:-5]
            if not (name.endswith(".json") and len(stem) == 20 and stem.isdigit()) or int(stem) in self._parsed:
                continue
            try:
                with open(os.path.join(folder, name)) as handle:
                    actions = [json.loads(line) for line in handle if line.strip()]
            except (FileNotFoundError, ValueError):
                continue  # not in place yet: read at the next look
            for action in actions:
                if "txn" in action:
                    app, version = action["txn"]["appId"], int(action["txn"]["version"])
                    self._txn_by_app[app] = max(version, self._txn_by_app.get(app, -1))
                elif "add" in action:
                    self._added.add(unquote(action["add"]["path"]))
            self._parsed.add(int(stem))

    def data_files(self) -> frozenset[str]:
        """Parquet files under the table folder (relative paths), log and hidden files excluded."""
        found = set()
        for folder, dirs, files in os.walk(self.table):
            dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
            relative = os.path.relpath(folder, self.table)
            for name in files:
                if name.endswith(".parquet") and not name.startswith((".", "_")):
                    found.add(name if relative == "." else os.path.join(relative, name))
        return frozenset(found)

    def look(self) -> Seen:
        """The state now. The log is read after the data files, so a file a commit
        added between the two reads is never taken for an uncommitted one."""
        offsets = _numbered(os.path.join(self.checkpoint, "offsets"))
        commits = _numbered(os.path.join(self.checkpoint, "commits"))
        files = self.data_files()
        self._read_log()
        query_id = self._read_query_id()
        txn = self._txn_by_app.get(query_id) if query_id else None
        return Seen(offsets, commits, txn, frozenset(files - self._added))


def _commit_files(table: str) -> list[tuple[int, str]]:
    """``(version, file name)`` of the table's JSON commits in place, oldest first."""
    try:
        names = os.listdir(os.path.join(table, "_delta_log"))
    except FileNotFoundError:
        return []
    found = [
        (int(name[:-5]), name) for name in names if name.endswith(".json") and len(name) == 25 and name[:-5].isdigit()
    ]
    return sorted(found)


def commit_run_id(actions: list[dict]) -> str | None:
    """The Dagster run a commit's custom metadata names (``dagster_run_id``), if any.

    Both engines keep the IO manager's keys as a JSON object in ``commitInfo.userMetadata``;
    delta-rs also sets them as keys of ``commitInfo`` itself.
    """
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    try:
        custom = json.loads(info.get("userMetadata") or "{}")
    except ValueError:
        custom = {}
    run_id = (custom if isinstance(custom, dict) else {}).get("dagster_run_id") or info.get("dagster_run_id")
    return str(run_id) if run_id else None


@dataclass(frozen=True)
class RunCommits:
    """One look at which tables hold a commit of the watched run."""

    tables: frozenset[str]
    """Names (as given to :class:`RunCommitWatch`) of the tables with a commit of the run."""
    engines: frozenset[str]
    """The engines (:func:`commit_engine`) that wrote the run's commits."""
    versions: Mapping[str, int]
    """Each table's newest commit version in place (-1: no commit yet)."""
    at: float = field(default_factory=time.monotonic)


class RunCommitWatch:
    """Which of some Delta tables hold a commit of one Dagster run, read off their logs.

    Each commit file is parsed once (they never change once in place), so a look
    costs a directory listing per table.
    """

    def __init__(self, tables: Mapping[str, str], run_id: str) -> None:
        self.tables = dict(tables)
        self.run_id = run_id
        self._parsed: dict[str, set[int]] = {name: set() for name in self.tables}
        self._committed: set[str] = set()
        self._engines: set[str] = set()

    def look(self) -> RunCommits:
        versions = {}
        for name, table in self.tables.items():
            files = _commit_files(table)
            versions[name] = files[-1][0] if files else -1
            for version, file_name in files:
                if version in self._parsed[name]:
                    continue
                try:
                    with open(os.path.join(table, "_delta_log", file_name)) as handle:
                        actions = [json.loads(line) for line in handle if line.strip()]
                except (FileNotFoundError, ValueError):
                    continue  # not in place yet: read at the next look
                if commit_run_id(actions) == self.run_id:
                    self._committed.add(name)
                    self._engines.add(commit_engine(actions))
                self._parsed[name].add(version)
        return RunCommits(frozenset(self._committed), frozenset(self._engines), versions)


def sink_engines(table: str) -> set[str]:
    """The engines (:func:`commit_engine`) that wrote the table's commits carrying an app
    transaction (a stream sink's)."""
    engines = set()
    folder = os.path.join(table, "_delta_log")
    for name in sorted(os.listdir(folder)):
        if not (name.endswith(".json") and name[:-5].isdigit()):
            continue
        with open(os.path.join(folder, name)) as handle:
            actions = [json.loads(line) for line in handle if line.strip()]
        if not any("txn" in a for a in actions):
            continue
        engines.add(commit_engine(actions))
    return engines


def commit_engine(actions: list[dict]) -> str:
    """The engine that wrote a commit: ``delta-spark``, ``delta-rs`` or ``unknown (<commitInfo>)``.

    delta-spark signs its commits with ``engineInfo`` (``Apache-Spark/... Delta-Lake/...``),
    delta-rs with ``clientVersion`` (``delta-rs.<version>``).
    """
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    if "Delta-Lake" in str(info.get("engineInfo", "")):
        return "delta-spark"
    if str(info.get("clientVersion", "")).startswith("delta-rs"):
        return "delta-rs"
    return f"unknown ({info})"


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL the process group (the Python driver and its JVM) and reap it."""
    signal_group(proc, signal.SIGKILL)
    proc.wait()


_Look_co = TypeVar("_Look_co", covariant=True)
_Look = TypeVar("_Look")


class Watch(Protocol[_Look_co]):
    """What :func:`kill_when` polls: :class:`StreamWatch`, :class:`RunCommitWatch`."""

    def look(self) -> _Look_co: ...


def kill_when(
    proc: subprocess.Popen,
    watch: Watch[_Look],
    condition: Callable[[_Look], bool],
    *,
    what: str,
    timeout: float = 300,
    poll: float = POLL_SECONDS,
    step_once: Callable[[_Look], bool] | None = None,
    step: float = STEP_SECONDS,
) -> _Look:
    """SIGKILL ``proc``'s group as soon as ``condition(watch.look())`` holds.

    Once ``step_once(look)`` holds, the group runs in steps: SIGCONT, ``step``
    seconds, SIGSTOP, then a look at a state that cannot change under it. A
    point then lasts as many looks as it takes the process steps to pass it,
    however busy the machine, instead of being missed between two polls.

    Returns the look that fired the kill. Raises when the process ends first
    (a look after its end gets one more chance: the condition may have come
    true just before) or after ``timeout`` seconds (then it is killed too).
    """
    deadline = time.monotonic() + timeout
    stepping = False
    try:
        while True:
            ended = proc.poll() is not None
            seen = watch.look()
            if condition(seen):
                return seen
            if ended:
                raise AssertionError(
                    f"the process ended (rc {proc.returncode}) before {what}: {seen}; "
                    f"see {getattr(proc, 'log', 'its log')}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {seen}")
            stepping = stepping or (step_once is not None and step_once(seen))
            if stepping:
                signal_group(proc, signal.SIGCONT)
                time.sleep(step)
                signal_group(proc, signal.SIGSTOP)
            else:
                time.sleep(poll)
    finally:
        kill(proc)


def undo_checkpoint_commit(checkpoint: str, batch: int) -> bool:
    """Remove ``commits/<batch>`` and its checksum file; True if it was there.

    Spark writes ``commits/N`` right after the sink returned from batch N, so
    a process killed between the sink's Delta commit and that write leaves
    ``offsets/N``, the Delta commit of N and no ``commits/N``. Removing the
    commit file of a process that was killed (or ended) just after writing it
    gives exactly that state, provided nothing later was written: the caller
    checks no batch after ``batch`` was planned.
    """
    folder = os.path.join(checkpoint, "commits")
    present = os.path.exists(os.path.join(folder, str(batch)))
    for name in (str(batch), f".{batch}.crc"):
        try:
            os.remove(os.path.join(folder, name))
        except FileNotFoundError:
            pass
    return present
