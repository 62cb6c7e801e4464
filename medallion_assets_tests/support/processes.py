"""Stopping the processes a test started, and only those.

Every process a test starts runs in a session of its own (``start_new_session=True``),
so its process group is its own id and holds its JVM and workers. A group may be
signalled only while its leader has not been reaped: until then the kernel keeps the
id reserved. Once ``poll()`` or ``wait()`` has reaped the leader the id is free, and
on these machines ids come round again within minutes (``kernel.pid_max`` is 32768
and a full run starts about 1,800 processes and threads a minute), so a late
``killpg`` could hit a process another test worker just started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group ``proc`` leads, if its id is still ``proc``'s.

    Nothing is sent once the leader has been reaped: what the group held has lost
    its parent, and a JVM started by PySpark ends with it.
    """
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def stop_group(proc: subprocess.Popen, *, sig: int = signal.SIGTERM, grace: float = 30) -> int:
    """``sig`` to ``proc``'s group, SIGKILL after ``grace`` seconds if the leader is still there; reaped."""
    signal_group(proc, sig)
    try:
        return proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        return proc.wait()


@contextlib.contextmanager
def process_list_watch(text: str, *, every: float = 0.5):
    """Reads every process's command line (``ps -eo args``) every ``every`` seconds while the context runs;
    yields the list of lines found holding ``text``, filled as they are seen (a secret must stay empty)."""
    import threading

    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
            seen.extend(line[:300] for line in listing.splitlines() if text in line)
            stop.wait(every)

    watcher = threading.Thread(target=watch, name="process-list-watch", daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


def start_logged(command: list[str], *, cwd, log, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``command`` in a session of its own (so :func:`stop_group` can end it), its output in ``log``."""
    return subprocess.Popen(
        command, cwd=cwd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
