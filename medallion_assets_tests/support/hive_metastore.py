"""The standalone Hive metastore service (Thrift) on 127.0.0.1 in front of a test PostgreSQL, from Maven's artifacts.

Its jars are ``org.apache.hive:hive-standalone-metastore-server`` with the
Hadoop client jars it needs and its ``bin`` archive (for the database schema
scripts ``schematool`` runs), resolved by Maven into the user's cache folder
once per machine and version (:func:`metastore_jars`).
:func:`metastore_service` writes the service's ``metastore-site.xml`` (owner
only: it holds the database password, which is on no command line), creates
the schema with Hive's ``schematool``, as a production metastore is set up,
starts ``HiveMetaStore`` on a free port in a process group of its own, waits for
the port and stops the group when the context ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from medallion_assets_tests.support.deployments import free_port
from medallion_assets_tests.support.maven_artifacts import (
    CONSOLE_LOG4J2,
    cache_dir,
    resolve_dependencies,
    small_jvm_options,
)
from medallion_assets_tests.support.postgres import Postgres
from medallion_assets_tests.support.processes import start_logged, stop_group

#: The Hive release whose standalone metastore the tests run: the newest whose Thrift API still serves
#: the calls of the Hive 2.3 client built into Spark (Hive 4's metastore dropped ``get_table``).
HIVE_VERSION = "3.1.3"
#: The Hadoop release Hive 3.1.3 is built with: its jars are the metastore's file system and configuration.
HADOOP_VERSION = "3.1.0"

_SERVER = "hive-standalone-metastore"
# Old Hadoop poms name the JDK's tools.jar, which Java 9+ lacks; log4j 1 and its bindings would
# shadow the log4j 2 binding the metastore logs through.
_EXCLUSIONS = """<exclusions>
        <exclusion><groupId>jdk.tools</groupId><artifactId>jdk.tools</artifactId></exclusion>
        <exclusion><groupId>org.slf4j</groupId><artifactId>slf4j-log4j12</artifactId></exclusion>
        <exclusion><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId></exclusion>
        <exclusion><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId></exclusion>
        <exclusion><groupId>log4j</groupId><artifactId>log4j</artifactId></exclusion>
      </exclusions>"""
_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tests</groupId><artifactId>hive-metastore</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.hive</groupId><artifactId>{_SERVER}</artifactId><version>{{hive}}</version>
      {_EXCLUSIONS}</dependency>
    <dependency><groupId>org.apache.hive</groupId><artifactId>{_SERVER}</artifactId><version>{{hive}}</version>
      <classifier>bin</classifier><type>tar.gz</type>{_EXCLUSIONS}</dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-common</artifactId><version>{{hadoop}}</version>
      {_EXCLUSIONS}</dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-hdfs</artifactId><version>{{hadoop}}</version>
      {_EXCLUSIONS}</dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-mapreduce-client-core</artifactId>
      <version>{{hadoop}}</version>{_EXCLUSIONS}</dependency>
  </dependencies>
</project>
"""

_JVM_OPTIONS = small_jvm_options("512m")


def metastore_jars(version: str = HIVE_VERSION) -> tuple[Path | None, str]:
    """The folder of the metastore's jars (its schema scripts under ``scripts/``), resolved on first use;
    or None and why not."""
    folder, why_not = resolve_dependencies(
        _POM.format(hive=version, hadoop=HADOOP_VERSION),
        cache_dir() / f"hive-metastore-{version}",
        f"{_SERVER}-{version}.jar",
        f"org.apache.hive:{_SERVER}:{version}",
    )
    if folder is None:
        return None, why_not
    scripts = folder / "scripts" / "metastore" / "upgrade" / "postgres"
    if not scripts.is_dir():
        archive = folder / f"{_SERVER}-{version}-bin.tar.gz"
        if not archive.is_file():
            return None, f"{archive.name} is missing from {folder}: remove the folder to resolve it again"
        _unpack_scripts(archive, folder)
    return folder, ""


def _unpack_scripts(archive: Path, folder: Path) -> None:
    """The archive's ``scripts/metastore/upgrade/postgres`` into ``folder/scripts/...``, placed at once."""
    staging = folder / f".scripts-{os.getpid()}"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if "/scripts/metastore/upgrade/postgres/" in m.name and m.isfile()]
        for member in members:
            member.name = member.name.split("/", 1)[1]  # apache-hive-metastore-<version>-bin/ off
        tar.extractall(staging, members=members, filter="data")
    with contextlib.suppress(OSError):  # another worker was first
        (staging / "scripts").rename(folder / "scripts")
    shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class MetastoreService:
    """A running metastore service: its Thrift URI and its folder (configuration and log)."""

    uris: str
    folder: Path

    @property
    def log(self) -> Path:
        return self.folder / "metastore.log"


def _site_xml(settings: dict[str, str]) -> str:
    properties = "\n".join(
        f"  <property><name>{escape(key)}</name><value>{escape(value)}</value></property>"
        for key, value in settings.items()
    )
    return f'<?xml version="1.0"?>\n<configuration>\n{properties}\n</configuration>\n'


#: The service's own settings: the schema is schematool's, and the standalone jar's classes stand in
#: for the defaults that name Hive's query engine (hive-exec), which a standalone metastore lacks.
SERVICE_SETTINGS = {
    "metastore.schema.verification": "true",
    "metastore.expression.proxy": "org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy",
    "metastore.task.threads.always": "org.apache.hadoop.hive.metastore.events.EventCleanerTask,"
    "org.apache.hadoop.hive.metastore.RuntimeStatsCleanerTask",
}


@contextlib.contextmanager
def metastore_service(
    database: Postgres, folder: Path, *, jdbc_jar: str, jars: Path, site: dict[str, str] | None = None
) -> Iterator[MetastoreService]:
    """Hive's metastore service over ``database``, on a free port of 127.0.0.1; stopped when the context ends.

    Args:
        database: the PostgreSQL database the metastore keeps its tables in (the schema is created here).
        folder: where its configuration (``conf/metastore-site.xml``, owner only) and its log go.
        jdbc_jar: PostgreSQL's JDBC driver.
        jars: :func:`metastore_jars`'s folder.
        site: the ``metastore-site.xml`` settings (default :data:`SERVICE_SETTINGS`); the database's
            connection, the port, the address (127.0.0.1) and the warehouse folder are this test's.
    """
    conf = folder / "conf"
    conf.mkdir(parents=True)
    port = free_port()
    site_file = conf / "metastore-site.xml"
    # Created owner-only before the password is written into it; read by the JVM, not passed to it.
    site_file.touch(mode=0o600)
    site_file.write_text(
        _site_xml(
            {
                **(SERVICE_SETTINGS if site is None else site),
                "metastore.thrift.port": str(port),
                "metastore.thrift.bind.host": "127.0.0.1",
                "javax.jdo.option.ConnectionURL": database.jdbc_url,
                "javax.jdo.option.ConnectionDriverName": "org.postgresql.Driver",
                "javax.jdo.option.ConnectionUserName": database.user,
                "javax.jdo.option.ConnectionPassword": database.password,
                "metastore.warehouse.dir": (folder / "warehouse").as_uri(),
            }
        )
    )
    (conf / "log4j2.properties").write_text(CONSOLE_LOG4J2)
    class_path = os.pathsep.join([str(conf), str(jars / "*"), jdbc_jar])
    java = [
        "java",
        *_JVM_OPTIONS,
        f"-Dlog4j2.configurationFile={conf / 'log4j2.properties'}",
        "-cp",
        class_path,
    ]
    log = folder / "metastore.log"
    # schematool reads the connection from metastore-site.xml on the class path, its scripts from METASTORE_HOME.
    init = subprocess.run(
        [
            *java,
            "org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool",
            "-dbType",
            "postgres",
            "-initSchema",
        ],
        env={**os.environ, "METASTORE_HOME": str(jars)},
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (folder / "schematool.log").write_text(init.stdout + init.stderr)
    if init.returncode != 0:
        raise RuntimeError(f"schematool -initSchema failed ({init.returncode}):\n{(init.stdout + init.stderr)[-4000:]}")
    server = start_logged([*java, "org.apache.hadoop.hive.metastore.HiveMetaStore"], cwd=folder, log=log)
    try:
        _wait_for_port(port, server, log)
        yield MetastoreService(uris=f"thrift://127.0.0.1:{port}", folder=folder)
    finally:
        stop_group(server)


def _wait_for_port(port: int, server: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Its main thread may fail while other threads keep the JVM up.
        if server.poll() is not None or 'Exception in thread "main"' in log.read_text(errors="replace"):
            raise RuntimeError(f"the metastore service failed to start:\n{log.read_text()[-4000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the metastore service did not listen in {timeout:.0f} s:\n{log.read_text()[-4000:]}")
