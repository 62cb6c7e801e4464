"""Local Spark deployments for tests: the pyspark wheel's own standalone cluster, Connect server and Thrift server.

Each runs on 127.0.0.1 (a standalone master or worker: or on a test host of
support/netns.py, at its address) in processes of its own, started from the wheel's
``bin/spark-class`` (the Thrift server: with the commands docs/catalog.md gives),
and is stopped by the context manager that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from medallion_assets_tests.support.netns import Host, host_environment
from medallion_assets_tests.support.processes import start_logged, stop_group


def spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], log: Path, env: dict[str, str] | None = None, host: Host | None = None) -> subprocess.Popen:
    command = [os.path.join(spark_home(), "bin", "spark-class"), *args]
    if host is not None:
        return host.start(command, log=log, env=host_environment(host, log.parent, {**os.environ, **(env or {})}))
    return start_logged(command, cwd=None, log=log, env={**os.environ, **(env or {})})


def _wait_for(condition, what: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError, ValueError):
            if condition():
                return
        time.sleep(0.5)
    raise TimeoutError(f"{what} did not come up in {timeout:.0f} s:\n{log.read_text()[-4000:]}")


@contextlib.contextmanager
def standalone_cluster(folder: Path, *, cores: int = 1, memory: str = "2g") -> Iterator[str]:
    """A standalone master and one worker on 127.0.0.1; yields the master URL."""
    with standalone_master(folder) as master, standalone_worker(folder, master, cores=cores, memory=memory):
        yield master.url


@dataclass(frozen=True)
class StandaloneMaster:
    """A running standalone master: its ``spark://`` URL and the address and port of its web UI."""

    url: str
    address: str
    ui_port: int

    def alive_workers(self) -> int:
        """The workers the master counts as alive (its UI's JSON)."""
        with urllib.request.urlopen(f"http://{self.address}:{self.ui_port}/json/", timeout=2) as response:
            return int(json.load(response).get("aliveworkers", 0))


@contextlib.contextmanager
def standalone_master(folder: Path, *, host: Host | None = None) -> Iterator[StandaloneMaster]:
    """The wheel's standalone master on 127.0.0.1 (free ports), or on ``host``'s address (Spark's own ports:
    the namespace is the master's alone); its log is ``folder/master.log``."""
    address = host.address if host else "127.0.0.1"
    port, ui = (7077, 8080) if host else (free_port(), free_port())
    log = folder / "master.log"
    process = _start(
        ["org.apache.spark.deploy.master.Master", "--host", address, "--port", str(port), "--webui-port", str(ui)],
        log,
        host=host,
    )
    try:
        master = StandaloneMaster(f"spark://{address}:{port}", address, ui)
        _wait_for(lambda: master.alive_workers() is not None, "the standalone master", process, log)
        yield master
    finally:
        stop_group(process)


def spark_conf_with_event_logs(tmp_path: Path) -> Path:
    """The tests' Spark defaults plus an uncompressed event log per application (in ``tmp_path/events``), to
    read for secrets; returns the folder to give as ``SPARK_CONF_DIR``."""
    conf, events = tmp_path / "spark_conf", tmp_path / "events"
    conf.mkdir()
    events.mkdir()
    for source in Path(os.environ["SPARK_CONF_DIR"]).iterdir():  # conftest's
        (conf / source.name).write_bytes(source.read_bytes())
    with open(conf / "spark-defaults.conf", "a") as defaults:
        defaults.write(
            f"\nspark.eventLog.enabled true\nspark.eventLog.dir file:{events}\nspark.eventLog.compress false\n"
        )
    return conf


@contextlib.contextmanager
def standalone_worker(
    folder: Path, master: StandaloneMaster, *, cores: int = 1, memory: str = "2g", host: Host | None = None
) -> Iterator[subprocess.Popen]:
    """A worker of ``master`` on 127.0.0.1, or on ``host``'s address, its executors' folders under
    ``folder/work``, its log ``folder/worker.log``; yields its process (the leader of its group, which
    holds its executors), once the master counts one more worker alive."""
    log = folder / "worker.log"
    before = master.alive_workers()
    process = _start(
        [
            "org.apache.spark.deploy.worker.Worker",
            master.url,
            "--host",
            host.address if host else "127.0.0.1",
            "--cores",
            str(cores),
            "--memory",
            memory,
            "--webui-port",
            str(8081 if host else free_port()),
            "--work-dir",
            str(folder / "work"),
        ],
        log,
        host=host,
    )
    try:
        _wait_for(lambda: master.alive_workers() > before, "the standalone worker", process, log)
        yield process
    finally:
        stop_group(process)


@contextlib.contextmanager
def connect_server(folder: Path, *, spark_config: dict[str, str], python: str) -> Iterator[str]:
    """A Spark Connect server (embedded ``local[2]`` Spark) on 127.0.0.1; yields ``sc://`` URL.

    Args:
        folder: where its log goes.
        spark_config: settings of the server's session (the delta-spark jars go here).
        python: the interpreter of its Python workers (it must import this project).
    """
    port = free_port()
    args = [
        "org.apache.spark.deploy.SparkSubmit",
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2]",
        "--conf",
        f"spark.connect.grpc.binding.port={port}",
        "--conf",
        "spark.connect.grpc.binding.address=127.0.0.1",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        f"spark.pyspark.python={python}",
        "--conf",
        "spark.sql.session.timeZone=UTC",
    ]
    for key, value in spark_config.items():
        args += ["--conf", f"{key}={value}"]
    log = folder / "connect.log"
    server = _start(args + ["spark-internal"], log, env={"PYSPARK_PYTHON": python})
    try:
        _wait_for_port(port, "the Spark Connect server", server, log)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop_group(server)


def _wait_for_port(port: int, what: str, server: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True

    _wait_for(listening, what, server, log, timeout)


#: The page whose Thrift server set-up :func:`documented_thrift_server` follows.
CATALOG_PAGE = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"


def page_blocks(page: Path, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in a Markdown page, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), flags=re.MULTILINE | re.DOTALL)


def documented_metastore_conf(
    *, values: dict[str, str], class_path: dict[str, str], page: Path = CATALOG_PAGE, name: str = "metastore.conf"
) -> str:
    """The page's Spark properties file ``name`` (a ``properties`` block starting ``# <name>``), with this
    machine's values for the settings named in ``values`` and its jars for the entries of
    ``spark.driver.extraClassPath`` named in ``class_path``.

    Raises:
        AssertionError: the page has no such file, or lacks a setting or class path entry to replace
            (the page changed: the test must follow it).
    """
    [conf] = [block for block in page_blocks(page, "properties") if block.startswith(f"# {name}\n")]
    settings = [line.split(None, 1) for line in conf.splitlines() if line.strip() and not line.startswith("#")]
    keys = [key for key, _ in settings]
    missing = sorted(set(values) - set(keys))
    assert not missing, f"{page.name}'s metastore.conf has no {missing}"
    lines = []
    for key, value in settings:
        value = values.get(key, value.strip())
        if key == "spark.driver.extraClassPath":
            entries = value.split(os.pathsep)
            assert set(class_path) <= set(entries), f"{page.name}'s class path {entries} lacks {sorted(class_path)}"
            value = os.pathsep.join(class_path.get(entry, entry) for entry in entries)
        lines.append(f"{key} {value}")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def documented_thrift_server(folder: Path, conf: str, *, page: Path = CATALOG_PAGE) -> Iterator[tuple[str, str]]:
    """Spark's Thrift server started as ``page`` says: its ``metastore.conf`` (``conf``, owner-only) in
    ``folder`` and its start command run there by bash, on a free port instead of 10000.

    Yields:
        ``(JDBC URL, the page's beeline command on that port)``.
    """
    [start] = [block for block in page_blocks(page, "bash") if "HiveThriftServer2" in block]
    [ask] = [block for block in page_blocks(page, "bash") if "/bin/beeline" in block]
    assert "hive.server2.thrift.port=10000" in start and "127.0.0.1:10000" in ask, "the page's port changed"
    port = free_port()
    conf_file = folder / "metastore.conf"
    conf_file.write_text(conf)
    conf_file.chmod(0o600)
    log = folder / "thrift.log"
    server = _run_page_block(start.replace("=10000", f"={port}"), folder, log)
    try:
        _wait_for_port(port, "the Spark Thrift server", server, log, timeout=400)
        prelude = start.split("\n", 1)[0]  # SPARK_HOME=...
        yield f"jdbc:hive2://127.0.0.1:{port}/default", prelude + "\n" + ask.replace(":10000", f":{port}")
    finally:
        stop_group(server)


def _run_page_block(block: str, folder: Path, log: Path) -> subprocess.Popen:
    """A docs page's ``bash`` block, started in ``folder`` with its output in ``log``.

    The page's ``python`` is the interpreter running the tests (the one that has pyspark).
    """
    env = {**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    return start_logged(["bash", "-c", block], cwd=folder, log=log, env=env)


#: The page whose Connect server start :func:`documented_connect_server` follows.
KAFKA_PAGE = Path(__file__).resolve().parents[2] / "docs" / "kafka.md"


@contextlib.contextmanager
def documented_connect_server(folder: Path, *, page: Path = KAFKA_PAGE) -> Iterator[str]:
    """A Spark Connect server started as ``page`` says (its ``bash`` block that starts
    ``SparkConnectServer``), run in ``folder`` by bash on a free port instead of 15002.

    The page's ``python`` is the interpreter running the tests.

    Yields:
        the server's ``sc://`` URL.
    """
    [start] = [block for block in page_blocks(page, "bash") if "SparkConnectServer" in block]
    assert "spark.connect.grpc.binding.port=15002" in start, "the page's port changed"
    port = free_port()
    log = folder / "connect.log"
    server = _run_page_block(start.replace("=15002", f"={port}"), folder, log)
    try:
        _wait_for_port(port, "the Spark Connect server", server, log, timeout=400)
        yield f"sc://127.0.0.1:{port}"
    finally:
        stop_group(server)


def beeline(url: str, query: str, *, timeout: float = 300) -> list[dict[str, str]]:
    """``query``'s rows through the pyspark wheel's ``beeline``, as text by column name."""
    import csv
    import io

    done = subprocess.run(
        [
            os.path.join(spark_home(), "bin", "beeline"),
            "-u",
            url,
            "-n",
            "medallion",
            "--silent=true",
            "--showHeader=true",
            "--outputformat=csv2",
            "-e",
            query,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"beeline failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    # beeline echoes its prompt ("0: jdbc:hive2://...> ") in front of the header line.
    lines = [re.sub(r"^\d+: jdbc:hive2://\S*> ", "", line) for line in done.stdout.splitlines() if line.strip()]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))
