"""The two Delta engines behind one asset code, and which one a session runs.

* **delta-spark**: Delta Lake's own Spark connector (``delta.tables``,
  ``format("delta")`` served by the JVM). Writes at Parquet speed and runs
  MERGE, OPTIMIZE and streaming on the executors. Its jars come from the
  platform, from local files (``DELTA_SPARK_JARS``) or from Maven.
* **delta-rs**: :mod:`medallion_assets.delta` (Spark's Python Data Source API
  with delta-rs), for clusters that can reach PyPI only.

The IO manager, the bronze streams and table maintenance talk to a table
through :class:`DeltaEngine`; everything they need that the two connectors do
not spell the same way (time travel, incremental reads, commit metadata, the
facts of the last commit, a version's files, bytes and rows) lives here, once
per engine. Both ``DeltaTable`` classes share delta-spark's surface
(``forPath``, ``merge``, ``optimize``, ``vacuum``, ``detail``,
``createIfNotExists``), so callers use them directly.

The engine is decided when the session is built (:func:`plan_engine` adds the
jars and settings) and read back from the session (:func:`engine_for`): a
session that has delta-spark runs delta-spark, any other runs delta-rs.

Nothing here runs at import.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import StructType

from medallion_assets.settings import DELTA_ENGINES, EngineSetting, one_of

log = logging.getLogger(__name__)

EngineName = Literal["delta-spark", "delta-rs"]

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
    from medallion_assets.settings import jar_location_problem

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
    from importlib.resources import files

    config = {**_spark_defaults(), **{str(k): str(v) for k, v in spark_config.items()}}
    if config.get("spark.jars.ivySettings", "").strip() or os.environ.get("DEFAULT_ARTIFACT_REPOSITORY"):
        return {}
    return {"spark.jars.ivySettings": str(files("medallion_assets").joinpath(MAVEN_IVY_SETTINGS_FILE))}


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
    import xml.etree.ElementTree as ElementTree

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
    import threading
    import urllib.error
    import urllib.request

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
    homes = [os.environ.get("SPARK_HOME")]
    try:
        import pyspark

        homes.append(os.path.dirname(pyspark.__file__))
    except ImportError:  # pragma: no cover - pyspark is a dependency
        pass
    return sorted(jar for home in homes if home for jar in glob.glob(os.path.join(home, "jars", "delta-spark_*.jar")))


def _installed_delta_spark_version() -> str:
    from importlib.metadata import version

    return version("delta-spark")


def start_engine(spark: SparkSession, plan: EnginePlan) -> DeltaEngine:
    """The engine of a freshly built session; enables the delta-rs engine where it runs.

    Raises:
        DeltaEngineUnavailableError: ``delta-spark`` was asked for and the session lacks it.
    """
    from medallion_assets.delta import enable_delta, has_native_delta

    if plan.setting != "delta-rs" and has_native_delta(spark):
        reason = plan.reason if plan.source in ("jars", "maven") else "delta-spark shipped by the platform"
        log.info("Delta engine: delta-spark (%s)", reason)
        return _delta_spark_engine(spark, reason)
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


def engine_for(spark: SparkSession) -> DeltaEngine:
    """The engine a session runs: delta-spark where the session has it, delta-rs otherwise.

    Registers the delta-rs engine's ``delta`` format on a session that has no
    delta-spark (idempotent), so any session handed to the project works.
    """
    from medallion_assets.delta import enable_delta, has_native_delta

    if has_native_delta(spark):
        return _delta_spark_engine(spark, "the session has delta-spark")
    enable_delta(spark)
    return DeltaRsEngine("the session has no delta-spark")


def _delta_spark_engine(spark: SparkSession, reason: str) -> DeltaSparkEngine:
    # A Spark Connect session has no JVM handle; its delta-spark speaks SQL.
    if hasattr(spark, "_jsparkSession"):
        return DeltaSparkEngine(reason)
    return DeltaSparkSqlEngine(f"{reason}; Spark Connect, through Delta SQL")


@dataclass(frozen=True)
class CommitFacts:
    """What the newest commit of a table did, and who wrote it (``engine_info``, empty when unknown)."""

    version: int
    operation: str
    operation_metrics: dict[str, Any]
    custom: dict[str, str]
    engine_info: str = ""


@dataclass(frozen=True)
class TableDetail:
    """A table's current files, size and partitioning (``DESCRIBE DETAIL``)."""

    num_files: int
    size_bytes: int
    partition_columns: list[str]

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TableDetail:
        """From a ``DESCRIBE DETAIL`` / ``DeltaTable.detail()`` row (both engines name the fields alike)."""
        return cls(
            int(row.get("numFiles") or 0), int(row.get("sizeInBytes") or 0), list(row.get("partitionColumns") or [])
        )


@dataclass(frozen=True)
class TableState:
    """One version of a table as its Delta log describes it, and a DataFrame reading that version.

    Attributes:
        version: the version described.
        num_files: live data files.
        size_bytes: their total size.
        num_records: rows, summed over the files' statistics; ``None`` when a
            file's statistics lack ``numRecords`` (count ``frame`` then).
        partition_columns: the table's partition columns.
        frame: the table at ``version``, resolved from the same snapshot.
    """

    version: int
    num_files: int
    size_bytes: int
    num_records: int | None
    partition_columns: list[str]
    frame: DataFrame


#: Commits searched before the whole log is read for a custom metadata key.
_RECENT_COMMITS = 20


def user_metadata(text: str | None) -> dict[str, str]:
    """Custom commit metadata from a commit's ``userMetadata``.

    Both engines store their custom keys there as one JSON object, so either
    engine reads what the other wrote; text that is not a JSON object is kept
    under ``userMetadata``.
    """
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return {"userMetadata": text}
    return {str(k): str(v) for k, v in parsed.items()}


@dataclass(frozen=True)
class MergeClause:
    """One ``WHEN`` clause of a MERGE into a target aliased ``t`` from a source aliased ``s``.

    Attributes:
        action: ``delete`` and ``update`` apply to matched rows, ``insert`` to unmatched ones.
        condition: SQL over ``t.`` and ``s.`` columns, or None for every row.
        assignments: target column -> SQL expression (update and insert).
    """

    action: Literal["delete", "update", "insert"]
    condition: str | None = None
    assignments: Mapping[str, str] | None = None


def with_unacted_matches_kept(clauses: Sequence[MergeClause], *, column: str) -> list[MergeClause]:
    """``clauses``, ending with an update that keeps as it is a matched row no other clause acts on.

    For MERGEs delta-rs runs. A matched row that none of the ``WHEN MATCHED``
    clauses acts on (a stale change: a redelivered row whose stored sequence
    is not older) made deltalake 1.6.6's MERGE hold twice the memory: 1.57 to
    1.76 GB against 0.76 GB into SF 3's ``orders`` with 15% of the source
    stale (docs/performance-record.md, "Stale changes in deltalake's MERGE").
    With the last clause the files written are the same, but delta-rs counts
    such a row as updated rather than copied. The clause is added only when
    every matched clause has a condition.

    Args:
        clauses: the MERGE's ``WHEN`` clauses, in order.
        column: a column the target table has: the last clause sets it to its stored value.

    Example:
        >>> with_unacted_matches_kept([MergeClause("update", "s.seq > t.seq", {"v": "s.v"})], column="id")[-1]
        MergeClause(action='update', condition=None, assignments={'id': 't.`id`'})
    """
    matched = [clause for clause in clauses if clause.action != "insert"]
    if not matched or not all(clause.condition for clause in matched):
        return list(clauses)
    return [*clauses, MergeClause("update", None, {column: f"t.`{column}`"})]


def _no_rows(frame: DataFrame) -> DataFrame:
    """``frame``'s columns and no row, as a plan Spark knows is empty.

    Spark's optimizer turns a zero limit into an empty relation and carries
    the emptiness through joins and unions, so a step given nothing new
    answers its counts and probes on the driver. An empty frame built from a
    Python list would run a job, with a Python worker, for every one of them.
    """
    return frame.limit(0)


def _append_stream_writer(
    frame: DataFrame, *, checkpoint_location: str, query_name: str, trigger: Mapping[str, Any]
) -> DataStreamWriter:
    """What every engine's append stream shares: mode, name, checkpoint and trigger."""
    return (
        frame.writeStream.outputMode("append")
        .queryName(query_name)
        .option("checkpointLocation", checkpoint_location)
        .trigger(**dict(trigger))
    )


class DeltaEngine:
    """What the project asks of a Delta engine.

    One method per operation the IO manager, the bronze streams and table
    maintenance need. The default implementations use delta-spark's
    ``DeltaTable`` surface, which both engines' classes share; an engine
    overrides what it spells differently. Paths are table locations; every
    method takes the session it runs on.
    """

    name: ClassVar[EngineName]

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    def describe(self) -> str:
        """The engine and why the session runs it, for the run log."""
        return f"{self.name} ({self.reason})" if self.reason else self.name

    def table_class(self) -> Any:
        """The engine's ``DeltaTable`` class (delta-spark's surface)."""
        raise NotImplementedError

    def for_path(self, spark: SparkSession, path: str) -> Any:
        """``DeltaTable.forPath(spark, path)`` of this engine."""
        return self.table_class().forPath(spark, path)

    def is_delta_table(self, spark: SparkSession, path: str) -> bool:
        """Whether ``path`` holds a Delta table."""
        return bool(self.table_class().isDeltaTable(spark, path))

    def read(
        self, spark: SparkSession, path: str, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        """The table at its latest or a pinned version, optionally only some columns."""
        raise NotImplementedError

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        """Rows that commits ``after_version + 1 .. to_version`` inserted (change data feed).

        Rewrites without a data change (OPTIMIZE) are not inserts, so compaction
        never replays rows. The table needs ``delta.enableChangeDataFeed``.
        """
        raise NotImplementedError

    def latest_commit(self, spark: SparkSession, path: str) -> CommitFacts:
        """Version, operation, metrics and custom metadata of the newest commit."""
        [info] = self._commit_infos(spark, path, 1)
        return CommitFacts(
            int(info["version"]),
            str(info.get("operation") or ""),
            dict(info.get("operationMetrics") or {}),
            _custom_metadata(info),
            str(info.get("engineInfo") or info.get("clientVersion") or ""),
        )

    def newest_commit_value(self, spark: SparkSession, path: str, key: str) -> str | None:
        """The value of custom commit metadata ``key`` in the newest commit that carries it.

        Searches the recent commits first and the whole retained log only when
        they lack it (maintenance commits carry no custom metadata). ``None``
        when no retained commit has the key.
        """
        for limit in (_RECENT_COMMITS, None):
            commits = self._custom_metadata_of_commits(spark, path, limit)
            for custom in commits:
                if key in custom:
                    return custom[key]
            if limit is not None and len(commits) < limit:
                return None
        return None

    def _custom_metadata_of_commits(self, spark: SparkSession, path: str, limit: int | None) -> list[dict[str, str]]:
        """Each commit's custom metadata, newest first (``limit``: the newest ``limit`` commits)."""
        return [_custom_metadata(info) for info in self._commit_infos(spark, path, limit)]

    def _commit_infos(self, spark: SparkSession, path: str, limit: int | None) -> list[dict[str, Any]]:
        """The newest ``limit`` commits' info (``None``: every retained one), newest first.

        Read from the log by delta-rs: these look-ups run for every input and
        output of every step, and delta-rs answers one in milliseconds where
        a history DataFrame costs a quarter of a second on delta-spark
        (``benchmarks/materialize_all.py``). Where delta-rs cannot open the
        location (a Hadoop-only scheme, a lake only the Spark server sees),
        Spark's ``DESCRIBE HISTORY`` answers.
        """
        infos = _commit_infos_from_log(path, limit)
        if infos is not None:
            return infos
        fields = ["version", "operation", "operationMetrics", "userMetadata"]
        return [row.asDict() for row in self._history(spark, path, limit).select(*fields).collect()]

    def _history(self, spark: SparkSession, path: str, limit: int | None = 1) -> DataFrame:
        """``DESCRIBE HISTORY`` of the newest ``limit`` commits (``None``: every retained one), newest first."""
        table = self.for_path(spark, path)
        return table.history(limit) if limit else table.history()

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        """Writer options that record ``metadata`` in the commit of a batch or streaming write."""
        raise NotImplementedError

    def prepare_write(self, frame: DataFrame) -> DataFrame:
        """``frame`` as this engine stores it unchanged (the default: as it is)."""
        return frame

    def save(
        self, frame: DataFrame, path: str, *, mode: Literal["append", "overwrite"], options: Mapping[str, str]
    ) -> None:
        """Append or overwrite with ``df.write.format("delta")`` and its options."""
        frame.write.format("delta").mode(mode).options(**options).save(path)

    def start_append_stream(
        self,
        frame: DataFrame,
        path: str,
        *,
        checkpoint_location: str,
        query_name: str,
        trigger: Mapping[str, Any],
        options: Mapping[str, str],
    ) -> StreamingQuery:
        """Start appending the streaming ``frame`` to the table, each micro-batch committed once.

        The default is the engine's Delta stream sink (``writeStream.format("delta")``),
        whose commits carry the app transaction ``(query id, batch id)``.
        """
        writer = _append_stream_writer(
            frame, checkpoint_location=checkpoint_location, query_name=query_name, trigger=trigger
        )
        return writer.format("delta").options(**options).start(path)

    def create_table(
        self,
        spark: SparkSession,
        path: str,
        schema: StructType,
        *,
        partition_columns: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> None:
        """Create an empty table at ``path`` unless one is there (``CREATE TABLE IF NOT EXISTS``)."""
        builder = self.table_class().createIfNotExists(spark).location(path).addColumns(schema)
        if partition_columns:
            builder = builder.partitionedBy(*partition_columns)
        for key, value in (properties or {}).items():
            builder = builder.property(key, value)
        builder.execute()

    def schema(self, spark: SparkSession, path: str) -> StructType:
        """The table's current schema."""
        return self.for_path(spark, path).toDF().schema

    def merge(
        self,
        spark: SparkSession,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        schema_evolution: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """MERGE ``source`` (alias ``s``) into the table (alias ``t``), clauses in order."""
        builder = self.for_path(spark, path).alias("t").merge(source.alias("s"), on)
        if schema_evolution:
            builder = builder.withSchemaEvolution()
        for clause in clauses:
            assignments = dict(clause.assignments or {})
            if clause.action == "delete":
                builder = builder.whenMatchedDelete(condition=clause.condition)
            elif clause.action == "update":
                builder = builder.whenMatchedUpdate(condition=clause.condition, set=assignments)
            else:
                builder = builder.whenNotMatchedInsert(condition=clause.condition, values=assignments)
        self.execute_merge(spark, builder, metadata or {})

    def compact(self, spark: SparkSession, path: str) -> None:
        """OPTIMIZE: rewrite small files into larger ones (no data change)."""
        self.for_path(spark, path).optimize().executeCompaction()

    def vacuum(self, spark: SparkSession, path: str, *, retention_hours: float) -> None:
        """VACUUM: delete files no version within ``retention_hours`` references."""
        self.for_path(spark, path).vacuum(retention_hours)

    def detail(self, spark: SparkSession, path: str) -> TableDetail:
        """Files, size and partition columns of the current version."""
        return TableDetail.from_row(self.for_path(spark, path).detail().first().asDict(recursive=True))

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        """Files, bytes, rows and partitioning of ``version``, from one lookup of its snapshot."""
        raise NotImplementedError

    def _state_from_detail(self, spark: SparkSession, path: str, version: int) -> TableState:
        # DESCRIBE DETAIL speaks of the newest version only; right after a write that is
        # ``version`` unless another writer committed since. Rows are left to count():
        # delta-spark answers a bare count from the files' statistics when they have it.
        detail = self.detail(spark, path)
        return TableState(
            version,
            detail.num_files,
            detail.size_bytes,
            None,
            detail.partition_columns,
            self.read(spark, path, version=version),
        )

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        """Run a merge builder, recording ``metadata`` in its commit."""
        raise NotImplementedError


class DeltaSparkEngine(DeltaEngine):
    """delta-spark, Delta Lake's own Spark connector.

    Custom commit metadata is stored as JSON in the commit's ``userMetadata``,
    the one free-form field delta-spark offers for every operation.
    """

    name: ClassVar[EngineName] = "delta-spark"
    _USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"

    def table_class(self) -> Any:
        from delta.tables import DeltaTable

        return DeltaTable

    def read(
        self, spark: SparkSession, path: str, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", str(int(version)))
        frame = reader.load(path)
        return frame.select(*columns) if columns else frame

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        current = self.read(spark, path, version=to_version)
        if to_version <= after_version:
            return _no_rows(current)
        columns = current.schema
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", str(after_version + 1))
            .option("endingVersion", str(to_version))
            .load(path)
        )
        return changes.where(F.col("_change_type") == "insert").select(*columns.fieldNames())

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        return {"userMetadata": json.dumps(dict(metadata), sort_keys=True)} if metadata else {}

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        from py4j.protocol import Py4JError

        # The snapshot a write leaves behind is in the DeltaLog's cache, with its checksum
        # (files, bytes and, for small tables, every add action); DESCRIBE DETAIL would
        # rebuild the version's state with a Spark job just for files and bytes.
        # DeltaLog is delta-spark's internal API: on a version whose signatures differ,
        # the public route answers the same.
        try:
            return self._state_from_log(spark, path, version)
        except Py4JError:
            log.debug("delta-spark's DeltaLog is not reachable as expected; describing %s by DESCRIBE DETAIL", path)
            return self._state_from_detail(spark, path, version)

    def _state_from_log(self, spark: SparkSession, path: str, version: int) -> TableState:
        jvm = spark._jvm
        assert jvm is not None, "a classic session: delta-spark runs in its JVM"
        none = jvm.scala.Option.apply(None)
        delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
        snapshot = delta_log.update(False, none, none)
        if snapshot.version() != version:
            snapshot = delta_log.getSnapshotAt(version, none, none, False)
        partitions = snapshot.metadata().partitionColumns()
        partition_columns = [str(partitions.apply(i)) for i in range(partitions.size())]
        checksum = snapshot.checksumOpt()
        adds = checksum.get().allFiles() if checksum.isDefined() else None
        if adds is not None and adds.isDefined():
            files = 0
            size = 0
            records: int | None = 0
            actions = adds.get().iterator()
            while actions.hasNext():
                add = actions.next()
                files += 1
                size += int(add.size())
                logical = add.numLogicalRecords()
                records = None if records is None or logical.isEmpty() else records + int(logical.get())
        else:
            # No add actions in the checksum (a large table): one job over the version's
            # add actions, whose state the read of the preview then reuses.
            numbers = F.get_json_object("stats", "$.numRecords").cast("long")
            row = (
                DataFrame(snapshot.allFiles().toDF(), spark)
                .agg(
                    F.count(F.lit(1)).alias("files"),
                    F.sum("size").alias("size"),
                    F.sum(numbers - F.coalesce(F.col("deletionVector.cardinality"), F.lit(0))).alias("records"),
                    F.count_if(numbers.isNull()).alias("without_stats"),
                )
                .first()
            )
            assert row is not None, "an aggregate without grouping returns one row"
            files, size = int(row["files"]), int(row["size"] or 0)
            records = None if row["without_stats"] else int(row["records"] or 0)
        return TableState(
            int(snapshot.version()), files, size, records, partition_columns, self.read(spark, path, version=version)
        )

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        # MERGE takes no writer options: the session setting is how delta-spark records its userMetadata.
        if not metadata:
            merge.execute()
            return
        previous = spark.conf.get(self._USER_METADATA_CONF, None)
        spark.conf.set(self._USER_METADATA_CONF, json.dumps(dict(metadata), sort_keys=True))
        try:
            merge.execute()
        finally:
            if previous is None:
                spark.conf.unset(self._USER_METADATA_CONF)
            else:
                spark.conf.set(self._USER_METADATA_CONF, previous)


class DeltaRsEngine(DeltaEngine):
    """:mod:`medallion_assets.delta`: the Python Data Source API with delta-rs.

    Reads go through the fast route (delta-rs resolves the snapshot, Spark's
    Parquet reader reads it). MERGE runs in delta-rs on the driver.
    """

    name: ClassVar[EngineName] = "delta-rs"

    def merge(
        self,
        spark: SparkSession,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        schema_evolution: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """MERGE as :meth:`DeltaEngine.merge`, kept rows included (:func:`with_unacted_matches_kept`)."""
        # The target's own first column: a source column could be one that schema evolution adds.
        kept = self.for_path(spark, path)._table().schema().fields[0].name
        super().merge(
            spark,
            path,
            source,
            on=on,
            clauses=with_unacted_matches_kept(clauses, column=kept),
            schema_evolution=schema_evolution,
            metadata=metadata,
        )

    def table_class(self) -> Any:
        from medallion_assets.delta import DeltaTable

        return DeltaTable

    def read(
        self, spark: SparkSession, path: str, *, version: int | None = None, columns: Sequence[str] | None = None
    ) -> DataFrame:
        from medallion_assets.delta import read_delta

        return read_delta(spark, path, version=version, columns=list(columns) if columns else None)

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        from medallion_assets.delta._read import read_added_rows

        current = self.read(spark, path, version=to_version)
        if to_version <= after_version:
            return _no_rows(current)
        columns = current.schema
        # An append-only range (bronze) is read from its new files by Spark; others need
        # the change data feed, which delta-rs builds on the driver.
        added = read_added_rows(spark, path, after_version=after_version, to_version=to_version)
        if added is not None:
            return added.select(*columns.fieldNames())
        changes = self.for_path(spark, path).changes(startingVersion=after_version + 1, endingVersion=to_version)
        return changes.where(F.col("_change_type") == "insert").select(*columns.fieldNames())

    def save(
        self, frame: DataFrame, path: str, *, mode: Literal["append", "overwrite"], options: Mapping[str, str]
    ) -> None:
        # Spark's Parquet writer writes the files, delta-rs commits them: the
        # same options and checks as format("delta"), without handing every row to Python.
        from medallion_assets.delta import write_delta

        write_delta(frame, path, mode=mode, options=options)

    def start_append_stream(
        self,
        frame: DataFrame,
        path: str,
        *,
        checkpoint_location: str,
        query_name: str,
        trigger: Mapping[str, Any],
        options: Mapping[str, str],
    ) -> StreamingQuery:
        # Each micro-batch goes through write_delta (Spark's Parquet writer), not the
        # Python stream sink, with the same app transaction and commit info.
        from medallion_assets.delta import append_micro_batches

        batches = append_micro_batches(path, checkpoint_location=checkpoint_location, options=options)
        writer = _append_stream_writer(
            frame, checkpoint_location=checkpoint_location, query_name=query_name, trigger=trigger
        )
        return writer.foreachBatch(batches).start()

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        # Each key on its own (what delta-rs readers show) and the JSON delta-spark reads.
        if not metadata:
            return {}
        return {
            **{f"commitInfo.{key}": str(value) for key, value in metadata.items()},
            "userMetadata": json.dumps(dict(metadata), sort_keys=True),
        }

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        from medallion_assets.delta._read import snapshot_dataframe
        from medallion_assets.delta._snapshot import resolve_snapshot

        # The add actions delta-rs lists carry each file's size and numRecords; the
        # DataFrame reads the same snapshot, so the version is resolved once.
        snapshot = resolve_snapshot(path, version=version)
        records = [f.num_records for f in snapshot.files]
        return TableState(
            snapshot.version,
            len(snapshot.files),
            sum(f.size for f in snapshot.files),
            None if any(r is None for r in records) else int(sum(r for r in records if r is not None)),
            list(snapshot.partition_columns),
            snapshot_dataframe(spark, snapshot),
        )

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        if metadata:
            merge = merge.withCommitInfo({**metadata, "userMetadata": json.dumps(dict(metadata), sort_keys=True)})
        merge.execute()


_COMMIT_INFO_FIELDS = frozenset(
    {
        "version",
        "operation",
        "operationMetrics",
        "operationParameters",
        "timestamp",
        "clientVersion",
        "engineInfo",
        "readVersion",
        "isBlindAppend",
        "userMetadata",
        "isolationLevel",
        "txnId",
    }
)


def _custom_metadata(info: Mapping[str, Any]) -> dict[str, str]:
    """Custom metadata of a commit's info: keys of its own (delta-rs's ``history()``), then ``userMetadata``."""
    custom = {str(k): str(v) for k, v in info.items() if k not in _COMMIT_INFO_FIELDS and v is not None}
    return {**custom, **user_metadata(info.get("userMetadata"))}


def _commit_infos_from_log(path: str, limit: int | None) -> list[dict[str, Any]] | None:
    """delta-rs's ``history(limit)`` of the table at ``path``; ``None`` when delta-rs cannot open it."""
    import deltalake
    from deltalake.exceptions import DeltaError

    try:
        table = deltalake.DeltaTable(path)
        infos = table.history(limit)
    except (DeltaError, OSError, ValueError) as error:
        log.debug("delta-rs cannot read the log of %s (%s); asking Spark", path, error)
        return None
    # A log whose commit files were cleaned up down to a checkpoint has no info for its version.
    return infos or [{"version": table.version()}]


class DeltaSparkSqlEngine(DeltaSparkEngine):
    """delta-spark through SQL, for Spark Connect sessions.

    delta-spark's Python ``DeltaTable`` reaches a Connect server only through
    Delta Connect's server plugin, which a Connect server with just the
    delta-spark jars does not load. Delta's SQL (``MERGE INTO``, ``OPTIMIZE``,
    ``VACUUM``, ``DESCRIBE DETAIL/HISTORY``, ``CREATE TABLE``) needs only the
    session extension, so on Connect every operation is spoken in SQL against
    ``delta.`<path>```. Same engine, same tables, same commits.
    """

    @staticmethod
    def _table(path: str) -> str:
        return "delta.`" + path.replace("`", "``") + "`"

    def for_path(self, spark: SparkSession, path: str) -> Any:
        raise NotImplementedError("on Spark Connect the delta-spark engine speaks SQL; use the engine's operations")

    def prepare_write(self, frame: DataFrame) -> DataFrame:
        # A cast to a StringType object reaches a Connect server with an explicit
        # UTF8_BINARY collation, which delta-spark stores as "string collate
        # UTF8_BINARY": delta-rs and DuckDB cannot read such a table. A cast by
        # its DDL name gives the plain string type.
        with_strings = [f for f in frame.schema.fields if "string" in f.dataType.simpleString()]
        if not with_strings:
            return frame
        recast = {f.name: F.col(f"`{f.name}`").cast(f.dataType.simpleString()).alias(f.name) for f in with_strings}
        return frame.select(*(recast.get(name, F.col(f"`{name}`")) for name in frame.columns))

    def is_delta_table(self, spark: SparkSession, path: str) -> bool:
        from pyspark.errors import AnalysisException

        try:
            [row] = spark.sql(f"DESCRIBE DETAIL {self._table(path)}").select("format").collect()
        except AnalysisException:
            return False
        return row["format"] == "delta"

    def schema(self, spark: SparkSession, path: str) -> StructType:
        return spark.read.format("delta").load(path).schema

    def create_table(
        self,
        spark: SparkSession,
        path: str,
        schema: StructType,
        *,
        partition_columns: Sequence[str] = (),
        properties: Mapping[str, str] | None = None,
    ) -> None:
        columns = ", ".join(
            f"`{f.name}` {f.dataType.simpleString()}{'' if f.nullable else ' NOT NULL'}" for f in schema.fields
        )
        statement = f"CREATE TABLE IF NOT EXISTS {self._table(path)} ({columns}) USING delta"
        if partition_columns:
            statement += " PARTITIONED BY (" + ", ".join(f"`{c}`" for c in partition_columns) + ")"
        if properties:
            statement += " TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in properties.items()) + ")"
        spark.sql(statement)

    def merge(
        self,
        spark: SparkSession,
        path: str,
        source: DataFrame,
        *,
        on: str,
        clauses: Sequence[MergeClause],
        schema_evolution: bool = False,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        import uuid

        view = f"merge_source_{uuid.uuid4().hex}"
        source.createOrReplaceTempView(view)
        parts = [
            f"MERGE {'WITH SCHEMA EVOLUTION ' if schema_evolution else ''}INTO {self._table(path)} AS t",
            f"USING {view} AS s ON {on}",
        ]
        for clause in clauses:
            when = "WHEN NOT MATCHED" if clause.action == "insert" else "WHEN MATCHED"
            condition = f" AND ({clause.condition})" if clause.condition else ""
            assignments = dict(clause.assignments or {})
            if clause.action == "delete":
                action = "DELETE"
            elif clause.action == "update":
                action = "UPDATE SET " + ", ".join(f"t.`{c}` = {e}" for c, e in assignments.items())
            else:
                action = (
                    "INSERT ("
                    + ", ".join(f"`{c}`" for c in assignments)
                    + ") VALUES ("
                    + ", ".join(assignments.values())
                    + ")"
                )
            parts.append(f"{when}{condition} THEN {action}")
        try:
            self.execute_merge(spark, _SqlStatement(spark, " ".join(parts)), metadata or {})
        finally:
            spark.catalog.dropTempView(view)

    def compact(self, spark: SparkSession, path: str) -> None:
        spark.sql(f"OPTIMIZE {self._table(path)}").collect()

    def vacuum(self, spark: SparkSession, path: str, *, retention_hours: float) -> None:
        spark.sql(f"VACUUM {self._table(path)} RETAIN {float(retention_hours)} HOURS").collect()

    def detail(self, spark: SparkSession, path: str) -> TableDetail:
        row = spark.sql(f"DESCRIBE DETAIL {self._table(path)}").first()
        assert row is not None, "DESCRIBE DETAIL returns one row"
        return TableDetail.from_row(row.asDict(recursive=True))

    def table_state(self, spark: SparkSession, path: str, version: int) -> TableState:
        # A Connect client has no handle on the DeltaLog: the SQL route.
        return self._state_from_detail(spark, path, version)

    def _history(self, spark: SparkSession, path: str, limit: int | None = 1) -> DataFrame:
        return spark.sql(f"DESCRIBE HISTORY {self._table(path)}" + (f" LIMIT {int(limit)}" if limit else ""))


@dataclass(frozen=True)
class _SqlStatement:
    """A SQL statement with a merge builder's ``execute()``."""

    spark: SparkSession
    text: str

    def execute(self) -> None:
        self.spark.sql(self.text).collect()
