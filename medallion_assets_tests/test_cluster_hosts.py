"""A Spark standalone cluster on hosts of its own, the lake only on the object store.

Four test hosts (network namespaces on one bridge, support/netns.py): the
standalone master, a worker on each of two more, and the driver on the fourth,
each Spark process bound to its host's address (``SPARK_LOCAL_IP``) and with its
own work and temporary folders. S3Proxy listens on the bridge's address in the
root namespace, where the test also reads the tables back with deltalake: the
lake is in the bucket and nowhere else. The driver is a Python process on its
host running the project's own session (``resources_for``'s ``spark``, the
settings of a ``cluster`` deployment on an ``s3://`` lake), which takes
delta-spark and hadoop-aws from the driver's Ivy cache through
``spark.jars.packages``; the executors fetch those jars from the driver.

Skipped, saying why, where namespaces cannot be made (not root, no
CAP_NET_ADMIN), where Maven or Java is missing for S3Proxy, or without a route
to delta-spark.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import deltalake
import pytest

from medallion_assets_tests.support import netns, object_store
from medallion_assets_tests.support.cluster_job import EVENT, ROWS, expected_rows
from medallion_assets_tests.support.delta_spark import NO_DELTA_SPARK, delta_spark_source
from medallion_assets_tests.support.deployments import standalone_master, standalone_worker
from medallion_assets_tests.support.processes import process_list_watch, signal_group

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: The hosts of the test network, in the order their addresses are given.
HOSTS = ("master", "worker-b", "worker-c", "driver")


@pytest.fixture
def hosts(tmp_path):
    """The test network and its hosts by name; the store (S3Proxy) on the bridge's address."""
    reason = netns.why_unavailable()
    if reason is not None:
        pytest.skip(f"test hosts not available: {reason}")
    if delta_spark_source() is None:
        pytest.skip(f"delta-spark on the cluster not tested: {NO_DELTA_SPARK}")
    with netns.network(*HOSTS) as (net, by_name):
        store, why_not = object_store.start(tmp_path / "s3proxy", address=net.address)
        if store is None:
            pytest.skip(why_not)
        with store:
            yield net, by_name, store


class _Clock:
    """Seconds since the test started at each named point, printed at the end (where the time goes)."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.points: list[tuple[str, float]] = []

    def mark(self, what: str) -> None:
        self.points.append((what, time.monotonic() - self.started))

    def report(self) -> str:
        return ", ".join(f"{what} {seconds:.0f} s" for what, seconds in self.points)


def _events(log: Path) -> list[dict]:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return [json.loads(line[len(EVENT) :]) for line in lines if line.startswith(EVENT)]


def _wait_for_event(log: Path, event: str, driver: subprocess.Popen, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [e for e in _events(log) if e["event"] == event]
        if found:
            return found[0]
        if driver.poll() is not None:
            raise AssertionError(f"the driver ended ({driver.returncode}) before '{event}':\n{log.read_text()[-6000:]}")
        time.sleep(0.3)
    raise AssertionError(f"no '{event}' from the driver in {timeout:.0f} s:\n{log.read_text()[-6000:]}")


def _executors(session: dict) -> list[dict]:
    """The application's live executors, from the driver's REST API (reached over the bridge)."""
    url = f"{session['ui']}/api/v1/applications/{session['app']}/executors"
    with urllib.request.urlopen(url, timeout=15) as response:
        return json.load(response)


def _wait_until_both_workers_run_tasks(
    session: dict, addresses: set[str], driver: subprocess.Popen, log: Path, timeout: float = 120
) -> list[dict]:
    deadline = time.monotonic() + timeout
    executors: list[dict] = []
    while time.monotonic() < deadline:
        if driver.poll() is not None:
            raise AssertionError(f"the driver ended ({driver.returncode}) first:\n{log.read_text()[-6000:]}")
        try:
            executors = _executors(session)
        except OSError:  # a driver busy on a loaded machine answers late: ask again
            time.sleep(0.5)
            continue
        busy = {e["hostPort"].rsplit(":", 1)[0] for e in executors if e["id"] != "driver" and e["activeTasks"] > 0}
        if addresses <= busy:
            return executors
        time.sleep(0.2)
    raise AssertionError(f"tasks never ran on both {sorted(addresses)} at once; last seen: {executors}")


def _wait_until(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.5)


def _driver_command(table: str, step: str) -> list[str]:
    return [sys.executable, "-m", "medallion_assets_tests.support.cluster_job", table, step]


def _driver_conf(folder: Path, address: str) -> Path:
    """The driver host's Spark conf folder: the tests' defaults, with the driver bound to ``address`` (as a
    deployment's ``spark-defaults.conf`` on that host would say) and its web UI on, for the test's REST calls."""
    folder.mkdir(parents=True)
    tests_conf = Path(os.environ["SPARK_CONF_DIR"])
    (folder / "log4j2.properties").write_text((tests_conf / "log4j2.properties").read_text())
    defaults = [
        line for line in (tests_conf / "spark-defaults.conf").read_text().splitlines() if "spark.ui." not in line
    ]
    defaults += [f"spark.driver.host {address}", f"spark.driver.bindAddress {address}", "spark.ui.enabled true"]
    (folder / "spark-defaults.conf").write_text("\n".join(defaults) + "\n")
    return folder


def _table_rows(table: str, store) -> dict[int, str]:
    rows = deltalake.DeltaTable(table, storage_options=store.storage_options()).to_pyarrow_table().to_pylist()
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)), "no id twice"
    return {row["id"]: row["value"] for row in rows}


def test_a_delta_spark_merge_across_hosts_survives_a_worker_killed_mid_job(tmp_path, hosts):
    _, host, store = hosts
    clock = _Clock()
    bucket = "cluster"
    store.create_bucket(bucket)
    table = f"s3://{bucket}/lake/silver/numbers"
    settings = {
        **store.environment(bucket),
        **(delta_spark_source() or {}),
        "MEDALLION_DEPLOYMENT": "cluster",
        "MEDALLION_DELTA_ENGINE": "delta-spark",
        "PYTHONPATH": os.pathsep.join(sys.path),  # the driver imports this checkout
    }
    workers = {name: host[name].address for name in ("worker-b", "worker-c")}
    with (
        process_list_watch(store.secret_access_key) as secret_seen,
        standalone_master(tmp_path / "master", host=host["master"]) as master,
        standalone_worker(tmp_path / "worker-b", master, host=host["worker-b"]),
        standalone_worker(tmp_path / "worker-c", master, host=host["worker-c"]) as victim,
    ):
        clock.mark("cluster up")
        conf = _driver_conf(tmp_path / "driver" / "conf", host["driver"].address)
        env = netns.host_environment(
            host["driver"],
            tmp_path / "driver",
            {**os.environ, **settings, "SPARK_MASTER_URL": master.url, "SPARK_CONF_DIR": str(conf)},
        )
        log = tmp_path / "driver" / "driver.log"
        driver = host["driver"].start(_driver_command(table, "write"), log=log, env=env)
        session = _wait_for_event(log, "session", driver, timeout=300)
        assert session["ui"].startswith(f"http://{host['driver'].address}:"), "the driver binds to its host's address"
        _wait_for_event(log, "merging", driver, timeout=300)
        clock.mark("written")
        running = _wait_until_both_workers_run_tasks(session, set(workers.values()), driver, log)
        signal_group(victim, signal.SIGKILL)  # the worker and its executor: the host's Spark dies at once
        clock.mark("worker-c killed")
        driver.wait(timeout=420)
        clock.mark("driver done")
        events = {e["event"]: e for e in _events(log)}
        assert "executors-seen" in events, log.read_text()[-6000:]
        if "failed" in events:
            # A clean failure: nothing of the merge committed; the rerun, on a worker restarted on
            # worker-c's host, merges once.
            assert driver.returncode == 1
            assert (
                deltalake.DeltaTable(table, storage_options=store.storage_options()).version()
                == events["written"]["version"]
            )
            _wait_until(lambda: master.alive_workers() == 1, "the master drops the killed worker")
            with standalone_worker(tmp_path / "worker-c-again", master, host=host["worker-c"]):
                rerun_log = tmp_path / "driver" / "rerun.log"
                rerun = host["driver"].start(_driver_command(table, "merge"), log=rerun_log, env=env)
                assert rerun.wait(timeout=420) == 0, rerun_log.read_text()[-6000:]
            clock.mark("rerun done")
        else:
            assert driver.returncode == 0, log.read_text()[-6000:]
            assert events["merged"]["version"] == events["written"]["version"] + 1
    print(f"\nwhere the time goes: {clock.report()}; the driver's outcome: {sorted(events)}")

    # Both workers' executors ran the merge's tasks; the killed one is gone, the survivor finished.
    executors = {e["hostPort"].rsplit(":", 1)[0]: e for e in running if e["id"] != "driver"}
    assert set(executors) == set(workers.values())
    seen = {e["hostPort"].rsplit(":", 1)[0]: e for e in events["executors-seen"]["executors"] if e["id"] != "driver"}
    assert seen[workers["worker-c"]]["isActive"] is False
    assert seen[workers["worker-b"]]["isActive"] is True and seen[workers["worker-b"]]["totalTasks"] > 0

    # The table in the bucket, read by deltalake: every row once, the merge applied once.
    assert _table_rows(table, store) == expected_rows()
    assert len(expected_rows()) == ROWS * 3 // 2
    # The lake is only in the bucket: no Delta log in any host's folders.
    local_logs = [p for p in tmp_path.rglob("_delta_log") if (tmp_path / "s3proxy") not in p.parents]
    assert local_logs == []
    assert secret_seen == [], "the secret is on no command line"
    outputs = [  # the driver's, the master's, the workers' and the executors' (S3Proxy's own is the store's)
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and p.name.endswith((".log", "stderr", "stdout")) and (tmp_path / "s3proxy") not in p.parents
    ]
    assert outputs and not [p for p in outputs if store.secret_access_key in p.read_text(errors="replace")]
    # Each worker holds the driver's jars twice (about 0.7 GB each: its fetch cache, the executor's folder),
    # and the killed one never cleaned up: not kept in the test's folder.
    for worker in tmp_path.glob("worker-*"):
        shutil.rmtree(worker / "tmp", ignore_errors=True)
        for jar in worker.rglob("*.jar"):
            jar.unlink()
