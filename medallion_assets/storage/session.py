"""The session plan: which Delta engine a Spark session is built for, and the settings that get it there.

* delta-spark's jars come from the platform (Spark's own jars folder), from local
  files (``DELTA_SPARK_JARS``) or from Maven (``spark.jars.packages``, resolved
  with the project's Ivy settings), found by a short probe of the repositories
  Spark would download from.
* Without delta-spark, the session runs the delta-rs engine
  (:mod:`medallion_assets.delta`).

:func:`plan_engine` decides before the session exists; :func:`start_engine`
reads the outcome from the built session. Which writer commits each write
afterwards is :func:`medallion_assets.storage.writers.choose_writer`'s choice.

Nothing here runs at import.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
import urllib.error
import urllib.request
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.metadata import version as installed_version
from typing import Literal

import pyspark
from pyspark.sql import SparkSession

from medallion_assets.delta import enable_delta, has_native_delta
from medallion_assets.settings import DELTA_ENGINES, EngineSetting, jar_location_problem, one_of
from medallion_assets.storage.engines import DeltaEngine, DeltaRsEngine, delta_spark_engine

log = logging.getLogger(__name__)

#: What a session needs to run delta-spark, whatever delivers the jars.
DELTA_SPARK_SESSION_CONFIG: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Deletion vectors are off in open-source Delta's defaults; pinned here
    # because delta-rs and DuckDB's delta extension cannot read them.
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
}

#: The Maven coordinates ``delta.configure_spark_with_delta_pip`` uses for this
#: Spark (Scala 2.13); fetched when Maven answers the probe, or when the user says so.
DELTA_SPARK_MAVEN_PACKAGE = "io.delta:delta-spark_2.13:{version}"


class DeltaEngineUnavailableError(RuntimeError):
    """delta-spark was asked for explicitly, but the session cannot run it."""


@dataclass(frozen=True)
class EnginePlan:
    """The engine a session is being built for, and the settings that get it there.

    Attributes:
        setting: what the user asked for (``auto``, ``delta-spark``, ``delta-rs``).
        spark_config: settings to add to the session builder (jars, extension).
        source: where delta-spark comes from (``jars``, ``maven``, ``platform``),
            or ``None`` when the plan is the delta-rs engine.
        reason: one sentence for the run log: why this engine.
        warning: the reason is something to fix (Maven answered without the jar
            delta-spark's Python package asks for), logged as a warning, not news.
    """

    setting: EngineSetting
    spark_config: dict[str, str] = field(default_factory=dict)
    source: Literal["jars", "maven", "platform"] | None = None
    reason: str = ""
    warning: bool = False


def jar_files(
    location: str,
    *,
    variable: str = "DELTA_SPARK_JARS",
    holds: str = "delta-spark, delta-storage, delta-kernel-*, unitycatalog-*",
) -> list[str]:
    """The jar files a variable names: a folder of jars, or a comma list of jars.

    Args:
        location: the variable's value.
        variable: its name, for the error (``DELTA_SPARK_JARS``, ``KAFKA_SPARK_JARS``).
        holds: which jars belong there, for the error.

    Raises:
        FileNotFoundError: a named file is missing, or the folder holds no jar.
    """
    problem = jar_location_problem(variable, location, holds=holds)
    if problem:
        raise FileNotFoundError(problem)
    entries = [entry.strip() for entry in location.split(",") if entry.strip()]
    if len(entries) == 1 and os.path.isdir(entries[0]):
        return sorted(glob.glob(os.path.join(entries[0], "*.jar")))
    return entries


def delta_spark_jar_files(location: str) -> list[str]:
    """The jar files of ``DELTA_SPARK_JARS`` (see :func:`jar_files`)."""
    return jar_files(location)


#: Session settings whose values are comma lists: two sources of jars add up, not replace.
_LIST_SETTINGS = ("spark.jars", "spark.jars.packages")


def merged_session_config(*configs: dict[str, str]) -> dict[str, str]:
    """Session settings from several plans (Delta's, a connector's): jar lists joined, the rest by order."""
    merged: dict[str, str] = {}
    for config in configs:
        for key, value in config.items():
            if key in _LIST_SETTINGS and merged.get(key):
                merged[key] = ",".join([merged[key], value])
            else:
                merged[key] = value
    return merged


def plan_engine(
    setting: EngineSetting,
    *,
    jars: str | None = None,
    maven: bool | None = False,
    delta_version: str | None = None,
    spark_config: Mapping[str, str] | None = None,
) -> EnginePlan:
    """Decide, before the session exists, how it will get its Delta engine.

    Under ``auto`` delta-spark comes from, in this order: the platform (its
    Spark ships delta-spark's jars; also recognised once the session exists,
    see :func:`engine_for`), the local jars in ``jars``, Maven. With
    ``maven=None`` Maven is used when a short probe (:func:`maven_reachable`,
    at most :data:`MAVEN_PROBE_SECONDS`) finds the repository Spark would
    download from; an offline machine waits no longer than that and gets the
    delta-rs engine, with the reason. ``maven=True`` fetches without probing,
    ``maven=False`` never does. An explicit ``delta-spark`` takes the same
    sources, then expects the platform to have it. Maven's jar is the installed
    delta-spark Python package's version; where a repository answers without it
    (404), the plan's reason names the artifact and the fix and is a warning.
    The packages are resolved with :func:`maven_resolution_config`'s Ivy settings.

    Args:
        setting: ``auto``, ``delta-spark`` or ``delta-rs``.
        jars: ``DELTA_SPARK_JARS``: a folder of jars or a comma list of jar files.
        maven: ``MEDALLION_DELTA_SPARK_MAVEN``: fetch delta-spark from Maven
            (``spark.jars.packages``): ``True``, ``False``, or ``None`` to probe.
        delta_version: the delta-spark version to fetch (default: the installed
            ``delta-spark`` Python package's).
        spark_config: the session's settings, for the repositories Spark would use
            (``spark.jars.repositories``, ``spark.jars.ivySettings``).

    Returns:
        The plan: extra session settings and the reason to log.

    Example:
        >>> plan_engine("delta-rs").spark_config
        {}
    """
    if setting not in DELTA_ENGINES:
        raise ValueError(
            f"MEDALLION_DELTA_ENGINE={setting!r} is not a Delta engine: use {one_of(DELTA_ENGINES)} "
            "(or unset it for auto)"
        )
    if setting == "delta-rs":
        return EnginePlan(setting, reason="MEDALLION_DELTA_ENGINE is delta-rs")
    if jars:
        files = delta_spark_jar_files(jars)
        config = {"spark.jars": ",".join(files), **DELTA_SPARK_SESSION_CONFIG}
        return EnginePlan(setting, config, "jars", f"delta-spark from the {len(files)} jars of DELTA_SPARK_JARS")
    if platform_delta_spark_jars():
        return EnginePlan(
            setting, dict(DELTA_SPARK_SESSION_CONFIG), "platform", "delta-spark shipped with Spark's own jars"
        )
    version = delta_version or _installed_delta_spark_version()
    artifact = DELTA_SPARK_MAVEN_PACKAGE.format(version=version)
    package = {
        "spark.jars.packages": artifact,
        **maven_resolution_config(spark_config or {}),
        **DELTA_SPARK_SESSION_CONFIG,
    }
    if maven:
        return EnginePlan(setting, package, "maven", f"delta-spark {version} from Maven (MEDALLION_DELTA_SPARK_MAVEN)")
    warning = False
    if maven is None:
        probe = maven_reachable(maven_repositories(spark_config or {}), artifact=artifact)
        if probe.reachable:
            return EnginePlan(setting, package, "maven", f"delta-spark {version} from Maven ({probe.detail})")
        missing = probe.detail
        if probe.answered:
            # Maven is there but not this version: a mismatch to fix, not an offline machine.
            warning = True
            missing = (
                f"{probe.detail}, the jar of the installed delta-spark Python package {version} (the two "
                "must be the same version): install a delta-spark version Maven serves (`pip install -e .` "
                "installs the pinned one), or set DELTA_SPARK_JARS to that version's jars"
            )
    else:
        missing = "no delta-spark jars: DELTA_SPARK_JARS is not set and Maven is not used"
    fix = (
        "set DELTA_SPARK_JARS to a folder of the delta-spark jars, or MEDALLION_DELTA_SPARK_MAVEN=true where "
        "Spark reaches Maven (through a proxy)"
    )
    if setting == "delta-spark":
        # No jars named: the platform must provide them (checked once the session exists).
        return EnginePlan(
            setting, dict(DELTA_SPARK_SESSION_CONFIG), "platform", f"delta-spark from the platform ({missing})", warning
        )
    if warning:
        return EnginePlan(setting, reason=f"{missing}; using delta-rs meanwhile", warning=True)
    return EnginePlan(
        setting, reason=f"{missing}; using delta-rs unless the platform ships delta-spark; for delta-spark {fix}"
    )


#: The longest an engine plan waits to learn whether Maven can be reached.
MAVEN_PROBE_SECONDS = 3.0

#: Where Spark's Ivy downloads packages from unless configured otherwise (``DEFAULT_ARTIFACT_REPOSITORY``
#: overrides it, as in Spark's ``MavenUtils``).
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"


@dataclass(frozen=True)
class MavenProbe:
    """What the Maven probe found.

    Attributes:
        reachable: a repository has the artifact.
        detail: which one, or why none did (for the engine plan's reason).
        answered: no repository has it, but one answered (HTTP 404): the version
            is not served there, the network is not the problem.
    """

    reachable: bool
    detail: str
    answered: bool = False


_probes: dict[tuple[tuple[str, ...], str, float], MavenProbe] = {}


def maven_repositories(spark_config: Mapping[str, str]) -> list[str]:
    """The remote repositories Spark's Ivy would fetch ``spark.jars.packages`` from.

    ``spark.jars.ivySettings`` replaces Spark's resolvers: its ``ibiblio`` roots and
    ``url`` resolvers' artifact patterns are used. Otherwise ``spark.jars.repositories``
    comes first, then Maven Central (or ``DEFAULT_ARTIFACT_REPOSITORY``). Settings not in
    ``spark_config`` are read from ``spark-defaults.conf`` (``SPARK_CONF_DIR``).

    Args:
        spark_config: the session's settings.
    """
    config = {**_spark_defaults(), **{str(k): str(v) for k, v in spark_config.items()}}
    ivy_settings = config.get("spark.jars.ivySettings", "").strip()
    if ivy_settings:
        roots = _ivy_settings_roots(ivy_settings)
        if roots:
            return roots
    listed = [url.strip() for url in config.get("spark.jars.repositories", "").split(",") if url.strip()]
    return [*listed, os.environ.get("DEFAULT_ARTIFACT_REPOSITORY") or MAVEN_CENTRAL]


#: The Ivy settings the project gives Spark for the packages it fetches (package data of medallion_assets).
MAVEN_IVY_SETTINGS_FILE = "maven_ivysettings.xml"


def maven_resolution_config(spark_config: Mapping[str, str]) -> dict[str, str]:
    """How Spark's Ivy should resolve the packages the project adds to ``spark.jars.packages``.

    Where the user configured resolution (``spark.jars.ivySettings`` in ``spark_config`` or
    ``spark-defaults.conf``, or ``DEFAULT_ARTIFACT_REPOSITORY``) nothing is added. Otherwise
    the project's Ivy settings: Maven Central (after any ``spark.jars.repositories``), without
    Spark's ``~/.m2/repository`` resolver, which fails the session where Maven left only an
    artifact's POM there, and with a file lock per artifact, so JVMs sharing an Ivy cache
    (``spark.jars.ivy``, default ``~/.ivy2``) do not write the same download at once.

    Args:
        spark_config: the session's settings.
    """
    config = {**_spark_defaults(), **{str(k): str(v) for k, v in spark_config.items()}}
    if config.get("spark.jars.ivySettings", "").strip() or os.environ.get("DEFAULT_ARTIFACT_REPOSITORY"):
        return {}
    return {"spark.jars.ivySettings": str(resources.files("medallion_assets").joinpath(MAVEN_IVY_SETTINGS_FILE))}


def _spark_defaults() -> dict[str, str]:
    folder = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    path = os.path.join(folder, "spark-defaults.conf") if folder else None
    if not path or not os.path.isfile(path):
        return {}
    settings = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            parts = line.strip().split(None, 1)
            if len(parts) == 2 and not parts[0].startswith("#"):
                settings[parts[0]] = parts[1].strip()
    return settings


def _ivy_settings_roots(path: str) -> list[str]:
    try:
        tree = ElementTree.parse(path)
    except (OSError, ElementTree.ParseError):
        return []
    roots = []
    for element in tree.iter():
        root, pattern = element.get("root"), element.get("pattern", "")
        if element.tag == "ibiblio" and root:
            roots.append(root)
        elif element.tag == "artifact" and pattern.startswith("http"):
            roots.append(pattern.split("[", 1)[0])
    return roots


def maven_reachable(repositories: Sequence[str], *, artifact: str, timeout: float = MAVEN_PROBE_SECONDS) -> MavenProbe:
    """Whether a repository answers for ``artifact`` within ``timeout`` seconds, asked once per process.

    A HEAD request for the artifact's POM, the repositories asked side by side;
    a name that does not resolve, a refused connection or silence all count as
    unreachable. Ivy uses the JVM's proxy settings, this probe the process's
    (``HTTPS_PROXY``): where they differ, set ``MEDALLION_DELTA_SPARK_MAVEN``.

    Args:
        repositories: repository roots (:func:`maven_repositories`).
        artifact: ``group:name:version``.
        timeout: the most the answer may take, name resolution included.
    """
    key = (tuple(repositories), artifact, timeout)
    if key not in _probes:
        _probes[key] = _probe(list(repositories), artifact, timeout)
    return _probes[key]


def _probe(repositories: list[str], artifact: str, timeout: float) -> MavenProbe:
    group, name, version = artifact.split(":")
    answers: dict[str, str | None] = {}  # repository -> None (has it) or why not
    absent: list[str] = []  # repositories that answered without it
    done = threading.Event()

    def ask(root: str) -> None:
        url = f"{root.rstrip('/')}/{group.replace('.', '/')}/{name}/{version}/{name}-{version}.pom"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
                answers[root] = None
        except urllib.error.HTTPError as error:
            answers[root] = f"{root} answered {error.code} for {artifact}"
            if error.code == 404:
                absent.append(root)
        except (OSError, ValueError) as error:
            answers[root] = f"{root}: {getattr(error, 'reason', error)}"
        if answers[root] is None or len(answers) == len(repositories):
            done.set()

    # Threads, not a socket timeout alone: name resolution ignores socket timeouts.
    for root in repositories:
        threading.Thread(target=ask, args=(root,), daemon=True, name=f"maven-probe {root}").start()
    done.wait(timeout)
    found = [root for root, why in list(answers.items()) if why is None]
    if found:
        return MavenProbe(True, f"{found[0]} has {artifact}")
    reasons = [why or "" for why in answers.values()] + [
        f"{root}: no answer in {timeout:g} s" for root in repositories if root not in answers
    ]
    if absent:
        return MavenProbe(False, f"Maven has no {artifact} ({'; '.join(reasons)})", answered=True)
    return MavenProbe(False, f"Maven not reachable ({'; '.join(reasons)})")


def platform_delta_spark_jars() -> list[str]:
    """delta-spark jars in Spark's own jars folder (``SPARK_HOME/jars`` or pyspark's), where a platform ships them."""
    homes = [os.environ.get("SPARK_HOME"), os.path.dirname(pyspark.__file__)]
    return sorted(jar for home in homes if home for jar in glob.glob(os.path.join(home, "jars", "delta-spark_*.jar")))


def _installed_delta_spark_version() -> str:
    return installed_version("delta-spark")


def start_engine(spark: SparkSession, plan: EnginePlan) -> DeltaEngine:
    """The engine of a freshly built session; enables the delta-rs engine where it runs.

    Raises:
        DeltaEngineUnavailableError: ``delta-spark`` was asked for and the session lacks it.
    """
    if plan.setting != "delta-rs" and has_native_delta(spark):
        reason = plan.reason if plan.source in ("jars", "maven") else "delta-spark shipped by the platform"
        log.info("Delta engine: delta-spark (%s)", reason)
        return delta_spark_engine(spark, reason)
    if plan.setting == "delta-spark":
        raise DeltaEngineUnavailableError(
            "MEDALLION_DELTA_ENGINE is delta-spark, but the Spark session has no delta-spark classes "
            f"({plan.reason}): set DELTA_SPARK_JARS to the folder of the delta-spark jars, set "
            "MEDALLION_DELTA_SPARK_MAVEN=true on a machine that reaches Maven, or use MEDALLION_DELTA_ENGINE=auto "
            "to fall back to delta-rs"
        )
    enable_delta(spark)
    log.log(logging.WARNING if plan.warning else logging.INFO, "Delta engine: delta-rs (%s)", plan.reason)
    return DeltaRsEngine(plan.reason)
