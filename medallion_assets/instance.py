"""The laptop's Dagster instance (``dagster_home/dagster.yaml``): one daemon per ``DAGSTER_HOME``.

The instance's ``max_concurrent_runs: 1`` is kept by its daemon, which takes
queued runs off the queue. A second ``dg dev`` (or ``dagster dev``, or
``dagster-daemon run``) on the same ``DAGSTER_HOME`` starts a second daemon
that Dagster lets run beside the first: both dequeue, and two runs, two Spark
drivers, can run at once. :class:`OneDaemonInstance` refuses that second
daemon: the first daemon to write a heartbeat takes an exclusive lock on a
file of the instance's folder and keeps it while its process lives (the
kernel releases it when the process ends, however it ends); a daemon that
finds the lock taken says which process holds it and stops before its first
iteration, and ``dg dev`` stops with it.

Only daemons write heartbeats, so the webserver, the code servers, runs and
command-line runs (``dg launch``) use the instance as Dagster's own does.
Nothing here runs at import.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import DagsterInstance
from dagster._core.instance.ref import InstanceRef  # Dagster's defaults for a custom instance class

#: The file, in the instance's folder, whose lock the running daemon holds (its text: the holder's pid).
DAEMON_LOCK_FILE = "daemon.lock"

_lock = threading.Lock()
_held: dict[str, Any] = {}


class AnotherDaemonRunsError(RuntimeError):
    """Another daemon already serves this ``DAGSTER_HOME`` (the message names its process and the fix)."""


class OneDaemonInstance(DagsterInstance):
    """Dagster's instance, refusing a second daemon on the same instance folder (see the module's docstring)."""

    @classmethod
    def config_schema(cls) -> dict[str, Any]:
        """No settings of its own (Dagster asks a custom instance class for them)."""
        return {}

    @staticmethod
    def config_defaults(base_dir: str) -> Mapping[str, Any]:
        """Dagster's own defaults for an instance in ``base_dir``."""
        return InstanceRef.config_defaults(base_dir)

    def add_daemon_heartbeat(self, daemon_heartbeat: Any) -> None:
        """Dagster's heartbeat, once this process holds the instance's daemon lock.

        Dagster's daemons call this before their first iteration and then on an
        interval. When another live process holds the lock, the refusal is written
        to stderr and the process ends at once (status 1): the daemon threads must
        not take a run off the queue, and ``dagster dev`` ends its webserver when its
        daemon ends.
        """
        problem = claim_daemon_lock(Path(self.root_directory))
        if problem:
            # On stderr, which dagster dev shows: the daemon's log handlers may not flush before the exit.
            print(f"medallion-assets: {problem}", file=sys.stderr, flush=True)
            os._exit(1)
        super().add_daemon_heartbeat(daemon_heartbeat)


def claim_daemon_lock(folder: Path) -> str | None:
    """Take (once per process) the daemon lock of the instance in ``folder``; why not, if another process holds it.

    Where the platform has no ``fcntl`` (Windows) nothing is locked and ``None`` is returned.
    """
    try:
        import fcntl  # deferred: POSIX only
    except ImportError:
        return None
    path = folder / DAEMON_LOCK_FILE
    with _lock:
        if str(path) in _held:
            return None
        handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 - kept open while the process lives
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            return (
                f"another Dagster daemon already runs on DAGSTER_HOME={str(folder)!r} (process {holder}, which "
                f"holds {path}): a `dg dev` or `dagster dev` started before this one. One daemon per DAGSTER_HOME: "
                "two would both start queued runs, and the one-run-at-a-time limit of its dagster.yaml would not "
                "hold. Use the UI that one serves, stop it first, or give this one another DAGSTER_HOME. "
                "This daemon stops, and `dg dev` with it."
            )
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        _held[str(path)] = handle
    return None
