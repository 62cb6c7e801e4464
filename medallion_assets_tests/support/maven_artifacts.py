"""Servers the tests start from Maven Central's artifacts, kept in the user's cache folder between test sessions.

:func:`resolve_dependencies` resolves a generated POM's runtime dependencies
with ``mvn -U dependency:copy-dependencies`` (through the machine's own Maven
settings) into a folder of jars; :func:`download` fetches one artifact file.
Both work in a private folder beside the target and rename it into place, so
concurrent test workers may resolve at once: the first to finish wins. Each
returns ``None`` and the reason when the artifact cannot be had (no Maven, no
network), for the caller's ``pytest.skip``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

#: Maven Central, where :func:`download` fetches an artifact file.
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


def cache_dir() -> Path:
    """Where the servers' jars are kept between test sessions: ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "medallion-assets-tests"


def resolve_dependencies(pom: str, target: Path, marker: str, what: str) -> tuple[Path | None, str]:
    """The folder ``target`` of ``pom``'s runtime dependencies, resolved by Maven on first use; or None and why not.

    Args:
        pom: a POM (packaging ``pom``) whose dependencies are the jars wanted.
        target: the folder the jars end in.
        marker: a file name that is in ``target`` once the resolution succeeded.
        what: the artifact, for the reason given when Maven fails.
    """
    if (target / marker).is_file():
        return target, ""
    mvn = shutil.which("mvn")
    if mvn is None:
        return None, f"Maven (mvn) is not on PATH to resolve {what}"
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        (work / "pom.xml").write_text(pom)
        # -U: an earlier attempt that failed (offline) is tried again rather than remembered by Maven.
        result = subprocess.run(
            [
                mvn,
                "-q",
                "-B",
                "-U",
                "-f",
                str(work / "pom.xml"),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={work / 'jars'}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if result.returncode != 0 or not (work / "jars" / marker).is_file():
            said = [line for line in (result.stdout + result.stderr).splitlines() if "[ERROR]" in line]
            first = re.sub(r"\x1b\[[0-9;]*m", "", said[0] if said else f"mvn exited with {result.returncode}")
            return None, f"Maven could not resolve {what}: {first.strip()[:400]}"
        try:
            (work / "jars").rename(target)
        except OSError:  # another worker was first
            pass
        return target, ""
    finally:
        shutil.rmtree(work, ignore_errors=True)


def download(path: str, target: Path) -> tuple[Path | None, str]:
    """Maven Central's file ``path`` (``group/as/folders/artifact/version/file``) as ``target``, fetched on
    first use; or None and why not."""
    if target.is_file():
        return target, ""
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(f"{MAVEN_CENTRAL}/{path}", timeout=60) as response:
            shutil.copyfileobj(response, out, length=1 << 20)
        os.replace(partial, target)
        return target, ""
    except OSError as error:
        return None, f"could not download {MAVEN_CENTRAL}/{path}: {error}"
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


#: log4j2 settings for a test's JVM service: everything at INFO to the console, which the test logs to a file.
CONSOLE_LOG4J2 = """rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
"""


def small_jvm_options(heap: str) -> list[str]:
    """JVM options for a small test service: a ``heap`` ceiling, the serial collector, C1 only (fast start)."""
    return [f"-Xmx{heap}", "-Xms64m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
