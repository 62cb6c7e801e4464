"""A throwaway PostgreSQL cluster for tests: ``initdb`` and ``pg_ctl`` in a temporary folder, on 127.0.0.1.

PostgreSQL refuses to run as root; when the tests do (a CI container), the
cluster runs as the ``postgres`` system user that Debian's package creates,
through ``runuser``. The server is stopped by its process id when the context ends.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from medallion_assets_tests.support.deployments import free_port

#: Debian's PostgreSQL JDBC driver (libpostgresql-jdbc-java), which .ci/run installs.
DEBIAN_JDBC_JAR = "/usr/share/java/postgresql.jar"


@dataclass(frozen=True)
class Postgres:
    """A running cluster: where to reach it and the database made for the test."""

    port: int
    database: str
    user: str
    password: str
    #: psql as the cluster's admin over its socket (trusted: no password on a command line).
    admin_psql: tuple[str, ...] = ()

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://127.0.0.1:{self.port}/{self.database}"

    def query(self, sql: str) -> list[tuple[str, ...]]:
        """``sql``'s rows in the test's database, as text, read by psql (a reader independent of the JVM)."""
        done = subprocess.run(
            [*self.admin_psql, "-d", self.database, "-AtF", "\t", "-c", sql], check=True, capture_output=True, text=True
        )
        return [tuple(line.split("\t")) for line in done.stdout.splitlines() if line]


def postgres_bin() -> str | None:
    """The folder of the server's programs (``initdb``, ``postgres``, ``pg_isready``): Debian's newest, else PATH's."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if candidates:
        return os.path.dirname(candidates[-1])
    found = shutil.which("initdb")
    return (
        os.path.dirname(found) if found and os.path.exists(os.path.join(os.path.dirname(found), "pg_isready")) else None
    )


def jdbc_jar() -> str | None:
    """The PostgreSQL JDBC driver's jar: ``MEDALLION_TEST_POSTGRES_JDBC_JAR``, else Debian's."""
    jar = os.environ.get("MEDALLION_TEST_POSTGRES_JDBC_JAR") or DEBIAN_JDBC_JAR
    return jar if os.path.isfile(jar) else None


@contextmanager
def postgres_cluster(*, database: str = "metastore") -> Iterator[Postgres]:
    """Start a PostgreSQL cluster in a temporary folder with a database and a password user; stop it and
    remove the folder after.

    The folder is not under pytest's ``tmp_path``: pytest makes its base folder private
    (0700) again whenever another test session starts (the nested session of the other
    engine), which would lock the ``postgres`` user out of its running cluster.
    """
    binaries = postgres_bin()
    if binaries is None:
        raise FileNotFoundError("PostgreSQL's initdb is not installed (Debian: apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="medallion-postgres-"))
    try:
        with _cluster(binaries, folder, database) as cluster:
            yield cluster
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _cluster(binaries: str, folder: Path, database: str) -> Iterator[Postgres]:
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    data, sockets = folder / "data", folder / "sockets"
    sockets.mkdir()
    if as_root:
        shutil.chown(folder, "postgres")
        shutil.chown(sockets, "postgres")
    # A password of this cluster's own: a test that looks for it in `ps` or logs finds this one only.
    user, password, port = "medallion", f"medallion-{secrets.token_hex(8)}", free_port()
    subprocess.run(
        [
            *run_as,
            f"{binaries}/initdb",
            "-D",
            str(data),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-U",
            "postgres",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
        cwd=folder,
    )
    log = folder / "postgres.log"
    with open(log, "ab") as output:
        server = subprocess.Popen(
            [
                *run_as,
                f"{binaries}/postgres",
                "-D",
                str(data),
                "-p",
                str(port),
                "-h",
                "127.0.0.1",
                "-k",
                str(sockets),
                "-c",
                "fsync=off",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=folder,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            ready = subprocess.run([f"{binaries}/pg_isready", "-h", "127.0.0.1", "-p", str(port)], capture_output=True)
            if ready.returncode == 0:
                break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
        # The admin talks over the socket (trusted); the metastore over TCP, with its password.
        psql = [
            *run_as,
            f"{binaries}/psql",
            "-h",
            str(sockets),
            "-p",
            str(port),
            "-U",
            "postgres",
            "-v",
            "ON_ERROR_STOP=1",
        ]
        # On stdin: a password on psql's command line would show in `ps`, which the tests watch.
        subprocess.run(
            psql, input=f"CREATE USER {user} PASSWORD '{password}'", text=True, check=True, capture_output=True
        )
        subprocess.run([*psql, "-c", f"CREATE DATABASE {database} OWNER {user}"], check=True, capture_output=True)
        yield Postgres(port=port, database=database, user=user, password=password, admin_psql=tuple(psql))
    finally:
        # postgres itself (runuser execs it in the same process group); SIGINT is its fast shutdown.
        try:
            os.killpg(server.pid, signal.SIGINT)
        except ProcessLookupError:
            pass
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
