"""The test session's route to delta-spark: Maven, or the jars ``DELTA_SPARK_JARS`` names.

conftest's session, the other engine's test session and the processes the tests start
(deployments, the engine switch) plan delta-spark through these.
"""

from __future__ import annotations

import os
from pathlib import Path

from medallion_assets.storage.session import delta_spark_jar_files, plan_engine


def delta_spark_jars_from_env() -> str | None:
    """``DELTA_SPARK_JARS`` where it names delta-spark's jars, else ``None``."""
    location = os.environ.get("DELTA_SPARK_JARS")
    if not location:
        return None
    try:
        delta_spark_jar_files(location)
    except FileNotFoundError:
        return None
    return location


def delta_spark_source() -> dict[str, str] | None:
    """The settings that give a process of this test session delta-spark, or ``None`` if none can.

    The jars of ``DELTA_SPARK_JARS`` where they are named (air-gapped machines), else Maven where
    conftest found it reachable (``MEDALLION_DELTA_SPARK_MAVEN=true``, the default route).
    """
    jars = delta_spark_jars_from_env()
    if jars:
        return {"DELTA_SPARK_JARS": jars}
    if os.environ.get("MEDALLION_DELTA_SPARK_MAVEN") == "true":
        return {"MEDALLION_DELTA_SPARK_MAVEN": "true"}
    return None


def delta_spark_jars_from_maven() -> str | None:
    """delta-spark's jars as Maven delivered them to this test session, a ``DELTA_SPARK_JARS`` comma list.

    Ivy's copies of delta-spark, delta-storage, delta-kernel-* and unitycatalog-* (conftest's
    resolution recorded Spark's ``spark.jars``), or ``None`` where the tests do not use Maven.
    """
    delivered = [
        jar
        for jar in os.environ.get("MEDALLION_TEST_MAVEN_JARS", "").split(",")
        if os.path.basename(jar).startswith(("io.delta_", "io.unitycatalog_"))
    ]
    return ",".join(jar.removeprefix("file:") for jar in delivered) or None


def delta_spark_jar_folder(tmp_path: Path) -> str:
    """A folder of delta-spark's jars only, as docs/catalog.md's class paths name one (``<folder>/*``).

    ``DELTA_SPARK_JARS``'s folder, or links to the jars Maven delivered to this test session
    (Ivy's cache holds every other package's jars beside them).
    """
    jars = delta_spark_jars_from_env()
    if jars and os.path.isdir(jars):
        return os.path.join(jars, "*")
    folder = tmp_path / "delta-spark-jars"
    folder.mkdir()
    for jar in (jars or delta_spark_jars_from_maven() or "").split(","):
        if jar:
            (folder / os.path.basename(jar)).symlink_to(jar)
    assert list(folder.iterdir()), "no delta-spark jars for a class path"
    return os.path.join(str(folder), "*")


#: Why a delta-spark test skips: no route to delta-spark's jars.
NO_DELTA_SPARK = "neither Maven (unreachable) nor DELTA_SPARK_JARS (a folder of delta-spark jars) gives delta-spark"


def delta_spark_plan(engine: str = "delta-spark"):
    """:func:`plan_engine` for ``engine`` with this test session's route to delta-spark.

    The route is :func:`delta_spark_source`'s.
    """
    source = delta_spark_source() or {}
    return plan_engine(
        engine,
        jars=source.get("DELTA_SPARK_JARS"),  # type: ignore[arg-type]
        maven=bool(source.get("MEDALLION_DELTA_SPARK_MAVEN")),
    )
