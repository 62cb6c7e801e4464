"""An S3-compatible object store for the object-store tests: S3Proxy, from Maven's artifacts, on 127.0.0.1
(or on the test network's bridge address, support/netns.py, for the test hosts).

S3Proxy (``org.gaul:s3proxy``) is a real S3 server (Jetty, AWS signature v2/v4,
multipart uploads, conditional writes) in front of a pluggable blob store; here
its ``filesystem-nio2`` store keeps the objects in a folder of the test's. It is
on Maven Central, which CI reaches (no MinIO build is on the reachable
registries, and moto's server is a mock of AWS's API, not a store), and it runs
on the Java 17 the machine has. It honours ``If-None-Match: *`` on PUT, the
conditional put delta-rs commits with on S3.

The server's jars are ``org.gaul:s3proxy`` and its runtime dependencies,
resolved by Maven into the user's cache folder once per machine and version
(:func:`server_jars`). Its credentials are generated per server and written
only to its properties file (mode 0600), never to a command line.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from pathlib import Path

from medallion_assets_tests.support.kafka_broker import free_port
from medallion_assets_tests.support.maven_artifacts import cache_dir, resolve_dependencies, small_jvm_options
from medallion_assets_tests.support.processes import start_logged, stop_group

#: The S3Proxy release the tests run (built for Java 17).
S3PROXY_VERSION = "4.1.0"
#: jackson-databind 3, which S3Proxy uses, needs annotations newer than those its other dependencies bring,
#: and Maven's nearest-wins resolution would pick the older ones (S3Proxy's own BOM is not inherited).
JACKSON_ANNOTATIONS_VERSION = "2.22"
#: The region the server signs for (S3Proxy accepts any; clients must agree with each other).
REGION = "us-east-1"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.tests</groupId><artifactId>s3proxy-server</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.gaul</groupId><artifactId>s3proxy</artifactId><version>{s3proxy}</version></dependency>
    <dependency><groupId>com.fasterxml.jackson.core</groupId><artifactId>jackson-annotations</artifactId>
      <version>{annotations}</version></dependency>
  </dependencies>
</project>
"""

_LOGBACK = """<configuration>
  <appender name="out" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d %level %logger{20} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="out"/></root>
</configuration>
"""


def server_jars(version: str = S3PROXY_VERSION) -> tuple[Path | None, str]:
    """The folder of S3Proxy's jars, resolved by Maven on first use; or None and why not."""
    return resolve_dependencies(
        _POM.format(s3proxy=version, annotations=JACKSON_ANNOTATIONS_VERSION),
        cache_dir() / f"s3proxy-{version}",
        f"s3proxy-{version}.jar",
        f"org.gaul:s3proxy:{version}",
    )


class ObjectStore:
    """A running S3Proxy on 127.0.0.1 (or ``address``) with generated credentials; :meth:`stop` ends it.

    Attributes:
        endpoint: ``http://<address>:<port>``.
        access_key_id, secret_access_key: the credentials it accepts (and no others).
        folder: where it keeps its buckets (one sub-folder each) and its log.
    """

    def __init__(self, jars: Path, folder: Path, address: str = "127.0.0.1") -> None:
        self.jars = jars
        self.folder = folder
        (folder / "data").mkdir(parents=True, exist_ok=True)
        self.address = address
        self.port = free_port()
        self.endpoint = f"http://{address}:{self.port}"
        self.access_key_id = f"test-{secrets.token_hex(6)}"
        self.secret_access_key = secrets.token_urlsafe(24)
        properties = folder / "s3proxy.properties"
        properties.touch(mode=0o600)
        properties.write_text(
            "\n".join(
                [
                    f"s3proxy.endpoint={self.endpoint}",
                    "s3proxy.authorization=aws-v2-or-v4",
                    f"s3proxy.identity={self.access_key_id}",
                    f"s3proxy.credential={self.secret_access_key}",
                    "jclouds.provider=filesystem-nio2",
                    f"jclouds.filesystem.basedir={folder / 'data'}",
                ]
            )
            + "\n"
        )
        (folder / "logback.xml").write_text(_LOGBACK)
        self.log = folder / "s3proxy.log"
        self.process: subprocess.Popen | None = start_logged(
            [
                "java",
                *small_jvm_options("256m"),
                f"-Dlogback.configurationFile={folder / 'logback.xml'}",
                "-cp",
                str(jars / "*"),
                "org.gaul.s3proxy.Main",
                "--properties",
                str(properties),
            ],
            cwd=folder,
            log=self.log,
        )
        self._wait_until_listening()

    def _wait_until_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"S3Proxy exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection((self.address, self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"S3Proxy did not listen on {self.endpoint} within {timeout}s")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def storage_options(self) -> dict[str, str]:
        """deltalake's (object_store's) options for this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_ALLOW_HTTP": "true",
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        }

    def filesystem(self, *, allow_bucket_creation: bool = False):
        """A pyarrow S3 filesystem on this server."""
        from pyarrow import fs  # deferred: pyarrow's S3 support is loaded only by the tests that use the store

        return fs.S3FileSystem(
            endpoint_override=f"{self.address}:{self.port}",
            scheme="http",
            access_key=self.access_key_id,
            secret_key=self.secret_access_key,
            region=REGION,
            allow_bucket_creation=allow_bucket_creation,
        )

    def create_bucket(self, name: str) -> str:
        """Creates bucket ``name`` through the S3 API; returns ``s3://<name>``."""
        self.filesystem(allow_bucket_creation=True).create_dir(name)
        return f"s3://{name}"

    def environment(self, bucket: str, prefix: str = "lake") -> dict[str, str]:
        """The project's settings of a lake at ``s3://<bucket>/<prefix>`` on this server."""
        return {
            "MEDALLION_LAKE_ROOT": f"s3://{bucket}/{prefix}",
            "MEDALLION_S3_ENDPOINT": self.endpoint,
            "MEDALLION_S3_REGION": REGION,
            "MEDALLION_S3_PATH_STYLE": "true",
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
        }

    def stop(self) -> None:
        """Ends the server's process group (by the id it was started with) and reaps it."""
        if self.process is not None:
            stop_group(self.process, grace=15)
            self.process = None

    def __enter__(self) -> ObjectStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(folder: Path, address: str = "127.0.0.1") -> tuple[ObjectStore | None, str]:
    """An :class:`ObjectStore` on ``address`` keeping its objects under ``folder``; or None and why not
    (no Maven, no Java)."""
    jars, reason = server_jars()
    if jars is None:
        return None, reason
    if not any(os.access(Path(p) / "java", os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep)):
        return None, "java is not on PATH to run S3Proxy"
    return ObjectStore(jars, folder, address), ""
