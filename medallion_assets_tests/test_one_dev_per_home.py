"""One ``dg dev`` per ``DAGSTER_HOME``: a second one on the same home is refused, the first goes on.

Two real ``dg dev`` processes, as the README starts them, on one home holding the
project's ``dagster.yaml`` and on two free ports. The second one's daemon finds the
first one's lock (``medallion_assets/instance.py``), says which process holds it and
ends, and ``dg dev`` shuts down with it; the first one keeps its daemon and its UI.
Both are stopped by their process groups.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from medallion_assets.instance import DAEMON_LOCK_FILE
from medallion_assets_tests.support.deployments import free_port
from medallion_assets_tests.support.processes import stop_group

REPO_ROOT = Path(__file__).resolve().parent.parent


def _dg_dev(port: int, env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "dg"), "dev", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait(condition, what: str, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None or what.startswith("the second"), f"dg dev ended:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s:\n{log.read_text()[-3000:]}"
        time.sleep(1)


def _serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _live(pid_text: str) -> bool:
    try:
        os.kill(int(pid_text), 0)
    except (ValueError, ProcessLookupError):
        return False
    return True


@pytest.mark.slow
def test_a_second_dg_dev_on_the_same_home_is_refused_and_the_first_goes_on(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    env = {**os.environ, "DAGSTER_HOME": str(home), "MEDALLION_LAKE_ROOT": str(tmp_path / "lakehouse")}
    lock = home / DAEMON_LOCK_FILE
    first_port, second_port = free_port(), free_port()
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = _dg_dev(first_port, env, first_log)
    second = None
    try:
        _wait(
            lambda: _serving(first_port) and lock.is_file() and _live(lock.read_text().strip()),
            "the first dg dev's UI and daemon",
            first,
            first_log,
        )
        holder = lock.read_text().strip()
        second = _dg_dev(second_port, env, second_log)
        refusal = (
            f"another Dagster daemon already runs on DAGSTER_HOME={str(home)!r} (process {holder}, which holds {lock})"
        )
        _wait(lambda: refusal in second_log.read_text(), "the second dg dev's refusal", second, second_log)
        # Its daemon ended before taking anything off the queue, and dg dev shuts down with it.
        _wait(
            lambda: "dagster-daemon process shut down unexpectedly with return code 1" in second_log.read_text(),
            "the second dg dev's shutdown",
            second,
            second_log,
            timeout=60,
        )
        # The first one goes on: same daemon, same lock, its UI answers, and no daemon of it met another's heartbeats.
        assert first.poll() is None and _serving(first_port)
        assert lock.read_text().strip() == holder and _live(holder)
        assert "still sending heartbeats" not in first_log.read_text()
    finally:
        if second is not None:
            stop_group(second, grace=60)
        stop_group(first, grace=60)
