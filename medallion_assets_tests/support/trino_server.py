"""A single-node Trino on 127.0.0.1 with a Delta Lake catalog over a Hive metastore service, from Maven's artifacts.

Trino's server is ``io.trino:trino-server``'s archive on Maven Central: its
``lib`` and its Delta Lake plugin are unpacked into the user's cache folder once
per machine and version (:func:`trino_home`). Trino 476 runs on Java 24 or
newer, which is not the machines' default Java: :func:`trino_java` finds one
(``MEDALLION_TEST_TRINO_JAVA_HOME``, else a JDK under ``/usr/lib/jvm``).
:func:`trino_server` starts one node, coordinator and worker in one, in a
process group of its own, with one catalog ``lake`` (the test gives its
properties: docs/catalog.md's Delta Lake catalog over a metastore service),
waits until it answers and stops the group when the context ends.
:func:`query` asks it through its HTTP API (``/v1/statement``).
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import tarfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

from medallion_assets_tests.support.deployments import free_port
from medallion_assets_tests.support.maven_artifacts import cache_dir, download
from medallion_assets_tests.support.processes import start_logged, stop_group

#: The Trino release the tests run.
TRINO_VERSION = "476"
#: The oldest Java Trino 476 starts on.
TRINO_JAVA = 24
#: The catalog the lake's tables are under in Trino: ``lake.gold.pricing_summary``.
CATALOG = "lake"

_JVM_OPTIONS = [
    "-Xmx1500m",
    "-XX:+UseG1GC",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djdk.attach.allowAttachSelf=true",
    "-XX:+EnableDynamicAgentLoading",
]


def trino_home(version: str = TRINO_VERSION) -> tuple[Path | None, str]:
    """A folder with Trino's ``lib`` and its ``plugin/delta-lake``, unpacked on first use; or None and why not.

    The archive (0.8 GB, every plugin) is removed once unpacked: the folder is what is kept.
    """
    name = f"trino-server-{version}"
    home = cache_dir() / name
    if (home / "lib").is_dir() and (home / "plugin" / "delta-lake").is_dir():
        return home, ""
    archive, why_not = download(f"io/trino/trino-server/{version}/{name}.tar.gz", cache_dir() / f"{name}.tar.gz")
    if archive is None:
        return None, why_not
    staging = cache_dir() / f".{name}-{uuid.uuid4().hex[:8]}"
    try:
        with tarfile.open(archive) as tar:
            wanted = (f"{name}/lib/", f"{name}/plugin/delta-lake/")
            everything = tar.getmembers()
            # Plugins share jars as hard links to the copy in another plugin, earlier in the archive:
            # that copy is extracted too (a link to a file not extracted would have tarfile seek back
            # through the compressed archive for each), and its plugin removed once linked.
            linked = {m.linkname for m in everything if m.name.startswith(wanted) and m.islnk()}
            members = [m for m in everything if m.name.startswith(wanted) or m.name in linked]
            tar.extractall(staging, members=members, filter="data")
        for plugin in (staging / name / "plugin").iterdir():
            if plugin.name != "delta-lake":
                shutil.rmtree(plugin)
        with contextlib.suppress(OSError):  # another worker was first
            (staging / name).rename(home)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if (home / "lib").is_dir():
        archive.unlink(missing_ok=True)
    return home, ""


def _java_major(java_home: Path) -> int:
    release = java_home / "release"
    found = re.search(r'^JAVA_VERSION="(\d+)', release.read_text(), re.MULTILINE) if release.is_file() else None
    return int(found.group(1)) if found else 0


def trino_java() -> tuple[str | None, str]:
    """A ``java`` of version 24 or newer for Trino: ``MEDALLION_TEST_TRINO_JAVA_HOME``'s, else the newest JDK
    under ``/usr/lib/jvm``; or None and why not."""
    chosen = os.environ.get("MEDALLION_TEST_TRINO_JAVA_HOME")
    homes = [Path(chosen)] if chosen else [Path(p) for p in glob.glob("/usr/lib/jvm/*") if not os.path.islink(p)]
    usable = sorted((_java_major(home), str(home)) for home in homes if (home / "bin" / "java").is_file())
    usable = [entry for entry in usable if entry[0] >= TRINO_JAVA]
    if not usable:
        where = chosen or "/usr/lib/jvm"
        return (
            None,
            f"Trino {TRINO_VERSION} needs Java {TRINO_JAVA}+ and there is none at {where} "
            "(set MEDALLION_TEST_TRINO_JAVA_HOME)",
        )
    return str(Path(usable[-1][1]) / "bin" / "java"), ""


@contextlib.contextmanager
def trino_server(folder: Path, *, catalog: str, home: Path, java: str) -> Iterator[str]:
    """One Trino node on a free port of 127.0.0.1 with one catalog, ``lake``; yields its HTTP URL.

    Args:
        folder: where its configuration, data folder and log go.
        catalog: the catalog file's properties (``connector.name=delta_lake``, the metastore's URI, ...).
        home: :func:`trino_home`'s folder.
        java: :func:`trino_java`'s ``java``.
    """
    etc, catalogs = folder / "etc", folder / "etc" / "catalog"
    catalogs.mkdir(parents=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    (etc / "config.properties").write_text(
        "\n".join(
            [
                "coordinator=true",
                "node-scheduler.include-coordinator=true",
                f"http-server.http.port={port}",
                f"discovery.uri={url}",
                f"plugin.dir={home / 'plugin'}",
                f"catalog.config-dir={catalogs}",
                "query.max-memory=1GB",
                "query.max-memory-per-node=512MB",
                # Two cores: fewer threads than a server's defaults.
                "task.concurrency=2",
                "task.max-worker-threads=4",
            ]
        )
        + "\n"
    )
    (catalogs / f"{CATALOG}.properties").write_text(catalog)
    log = folder / "trino.log"
    server = start_logged(
        [
            java,
            *_JVM_OPTIONS,
            "-Dnode.environment=test",
            f"-Dnode.id={uuid.uuid4()}",
            # The address the coordinator calls its worker on: left to itself, Trino takes a non-loopback
            # interface's, which can be a test host's bridge that another test removes mid-query.
            "-Dnode.internal-address=127.0.0.1",
            f"-Dnode.data-dir={folder / 'data'}",
            f"-Dconfig={etc / 'config.properties'}",
            "-cp",
            str(home / "lib" / "*"),
            "io.trino.server.TrinoServer",
        ],
        cwd=folder,
        log=log,
    )
    try:
        _wait_until_started(url, server, log)
        yield url
    finally:
        stop_group(server)


_ACTIVE_WORKERS = "SELECT count(*) AS workers FROM system.runtime.nodes WHERE state = 'active'"


def _wait_until_started(url: str, server: subprocess.Popen, log: Path, timeout: float = 400) -> None:
    """Until the server has started and its worker (the node itself) has joined: a query runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"Trino exited with {server.returncode}:\n{log.read_text()[-6000:]}")
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            with urllib.request.urlopen(f"{url}/v1/info", timeout=2) as response:
                started = not json.load(response).get("starting", True)
            # Started, the node may not have announced itself as a worker yet, and "SELECT 1" runs on
            # the coordinator alone: a table scan still fails with "No nodes available" until the node
            # list (refreshed every few seconds) holds an active worker.
            if started and query(url, _ACTIVE_WORKERS, timeout=60)[0]["workers"] > 0:
                return
        time.sleep(1)
    raise TimeoutError(f"Trino did not start in {timeout:.0f} s:\n{log.read_text()[-6000:]}")


def _typed(value, trino_type: str):
    """A JSON value of Trino's answer as Python holds the type: decimals and dates come as text."""
    if value is None:
        return None
    if trino_type.startswith("decimal"):
        return Decimal(value)
    if trino_type == "date":
        return datetime.date.fromisoformat(value)
    return value


_NO_WORKER_YET = "No nodes available"


def query(url: str, sql: str, *, timeout: float = 300) -> list[dict]:
    """``sql``'s rows by column name, through Trino's ``/v1/statement`` (decimals as ``Decimal``, dates as ``date``).

    Raises:
        RuntimeError: the query failed (Trino's message).
    """

    def submitted() -> urllib.request.Request:
        return urllib.request.Request(
            f"{url}/v1/statement", data=sql.encode(), headers={"X-Trino-User": "medallion"}, method="POST"
        )

    request: urllib.request.Request | None = submitted()
    deadline = time.monotonic() + timeout
    columns, rows = None, []
    while request is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Trino did not answer {sql!r} in {timeout:.0f} s")
        with urllib.request.urlopen(request, timeout=60) as response:
            page = json.load(response)
        if "error" in page and _NO_WORKER_YET in page["error"].get("message", "") and time.monotonic() < deadline:
            # The worker left the node list for a moment (a missed heartbeat on a busy machine): ask again.
            time.sleep(2)
            request, columns, rows = submitted(), None, []
            continue
        if "error" in page:
            raise RuntimeError(f"Trino failed {sql!r}: {page['error'].get('message')}")
        columns = columns or [(column["name"], column["type"]) for column in page.get("columns", [])] or None
        rows.extend(page.get("data", []))
        request = urllib.request.Request(page["nextUri"]) if page.get("nextUri") else None
    return [{name: _typed(value, kind) for (name, kind), value in zip(columns or [], row, strict=True)} for row in rows]
