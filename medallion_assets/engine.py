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
facts of the last commit) lives here, once per engine. Both ``DeltaTable``
classes share delta-spark's surface (``forPath``, ``merge``, ``optimize``,
``vacuum``, ``detail``, ``createIfNotExists``), so callers use them directly.

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

log = logging.getLogger(__name__)

EngineName = Literal["delta-spark", "delta-rs"]
EngineSetting = Literal["auto", "delta-spark", "delta-rs"]

#: What a session needs to run delta-spark, whatever delivers the jars.
DELTA_SPARK_SESSION_CONFIG: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Deletion vectors are off in open-source Delta's defaults; pinned here
    # because delta-rs and DuckDB's delta extension cannot read them.
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
}

#: The Maven coordinates ``delta.configure_spark_with_delta_pip`` uses for this
#: Spark (Scala 2.13); only fetched when the user opts in.
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
    """

    setting: EngineSetting
    spark_config: dict[str, str] = field(default_factory=dict)
    source: Literal["jars", "maven", "platform"] | None = None
    reason: str = ""


def delta_spark_jar_files(location: str) -> list[str]:
    """The jar files of ``DELTA_SPARK_JARS``: a folder of jars, or a comma list of jars.

    Raises:
        FileNotFoundError: a named file is missing, or the folder holds no jar.
    """
    entries = [entry.strip() for entry in location.split(",") if entry.strip()]
    if len(entries) == 1 and os.path.isdir(entries[0]):
        jars = sorted(glob.glob(os.path.join(entries[0], "*.jar")))
        if not jars:
            raise FileNotFoundError(
                f"DELTA_SPARK_JARS names the folder {entries[0]!r}, which holds no .jar file; "
                "put the delta-spark jars there (delta-spark, delta-storage, delta-kernel-*, unitycatalog-*)"
            )
        return jars
    missing = [entry for entry in entries if not os.path.isfile(entry)]
    if missing:
        raise FileNotFoundError(f"DELTA_SPARK_JARS names jars that do not exist: {', '.join(missing)}")
    return entries


def plan_engine(
    setting: EngineSetting,
    *,
    jars: str | None = None,
    maven: bool = False,
    delta_version: str | None = None,
) -> EnginePlan:
    """Decide, before the session exists, how it will get its Delta engine.

    Under ``auto`` delta-spark comes from, in this order: the platform (the
    session turns out to have it already; see :func:`engine_for`), the local
    jars in ``jars``, Maven when ``maven`` is set. Maven is an explicit opt-in,
    never a probe: an offline machine must not hang on a download. With none of
    these, the session runs the delta-rs engine.

    Args:
        setting: ``auto``, ``delta-spark`` or ``delta-rs``.
        jars: ``DELTA_SPARK_JARS``: a folder of jars or a comma list of jar files.
        maven: fetch delta-spark from Maven (``spark.jars.packages``).
        delta_version: the delta-spark version to fetch (default: the installed
            ``delta-spark`` Python package's).

    Returns:
        The plan: extra session settings and the reason to log.

    Example:
        >>> plan_engine("delta-rs").spark_config
        {}
    """
    if setting not in ("auto", "delta-spark", "delta-rs"):
        raise ValueError(f"MEDALLION_DELTA_ENGINE must be auto, delta-spark or delta-rs, got {setting!r}")
    if setting == "delta-rs":
        return EnginePlan(setting, reason="MEDALLION_DELTA_ENGINE is delta-rs")
    if jars:
        files = delta_spark_jar_files(jars)
        config = {"spark.jars": ",".join(files), **DELTA_SPARK_SESSION_CONFIG}
        return EnginePlan(setting, config, "jars", f"delta-spark from the {len(files)} jars of DELTA_SPARK_JARS")
    if maven:
        version = delta_version or _installed_delta_spark_version()
        config = {"spark.jars.packages": DELTA_SPARK_MAVEN_PACKAGE.format(version=version), **DELTA_SPARK_SESSION_CONFIG}
        return EnginePlan(setting, config, "maven", f"delta-spark {version} from Maven (MEDALLION_DELTA_SPARK_MAVEN)")
    if setting == "delta-spark":
        # No jars named: the platform must provide them (checked once the session exists).
        return EnginePlan(setting, dict(DELTA_SPARK_SESSION_CONFIG), "platform", "delta-spark from the platform")
    return EnginePlan(
        setting,
        reason=(
            "no delta-spark jars: DELTA_SPARK_JARS is not set and MEDALLION_DELTA_SPARK_MAVEN is off, "
            "so unless the platform ships delta-spark the session runs the delta-rs engine"
        ),
    )


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
        return DeltaSparkEngine()
    if plan.setting == "delta-spark":
        raise DeltaEngineUnavailableError(
            "MEDALLION_DELTA_ENGINE is delta-spark, but the Spark session has no delta-spark classes: "
            "set DELTA_SPARK_JARS to the folder of the delta-spark jars, set MEDALLION_DELTA_SPARK_MAVEN=true "
            "on a machine that reaches Maven, or use MEDALLION_DELTA_ENGINE=auto to fall back to delta-rs"
        )
    enable_delta(spark)
    log.info("Delta engine: delta-rs (%s)", plan.reason or "chosen")
    return DeltaRsEngine()


def engine_for(spark: SparkSession) -> DeltaEngine:
    """The engine a session runs: delta-spark where the session has it, delta-rs otherwise.

    Registers the delta-rs engine's ``delta`` format on a session that has no
    delta-spark (idempotent), so any session handed to the project works.
    """
    from medallion_assets.delta import enable_delta, has_native_delta

    if has_native_delta(spark):
        return DeltaSparkEngine()
    enable_delta(spark)
    return DeltaRsEngine()


@dataclass(frozen=True)
class CommitFacts:
    """What the newest commit of a table did."""

    version: int
    operation: str
    operation_metrics: dict[str, Any]
    custom: dict[str, str]


class DeltaEngine:
    """What the project asks of a Delta engine beyond delta-spark's shared surface.

    Subclasses implement it once per connector. Paths are table locations;
    every method takes the session it runs on.
    """

    name: ClassVar[EngineName]

    def table_class(self) -> Any:
        """The engine's ``DeltaTable`` class (delta-spark's surface)."""
        raise NotImplementedError

    def for_path(self, spark: SparkSession, path: str) -> Any:
        """``DeltaTable.forPath(spark, path)`` of this engine."""
        return self.table_class().forPath(spark, path)

    def is_delta_table(self, spark: SparkSession, path: str) -> bool:
        """Whether ``path`` holds a Delta table."""
        return bool(self.table_class().isDeltaTable(spark, path))

    def read(self, spark: SparkSession, path: str, *, version: int | None = None,
             columns: Sequence[str] | None = None) -> DataFrame:
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
        raise NotImplementedError

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        """Writer options that record ``metadata`` in the commit of a batch or streaming write."""
        raise NotImplementedError

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        """Run a merge builder, recording ``metadata`` in its commit."""
        raise NotImplementedError

    def describe(self) -> str:
        """One line for logs and metadata."""
        return self.name


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

    def read(self, spark: SparkSession, path: str, *, version: int | None = None,
             columns: Sequence[str] | None = None) -> DataFrame:
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", str(int(version)))
        frame = reader.load(path)
        return frame.select(*columns) if columns else frame

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        columns = self.read(spark, path, version=to_version).schema
        if to_version <= after_version:
            return spark.createDataFrame([], columns)
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", str(after_version + 1))
            .option("endingVersion", str(to_version))
            .load(path)
        )
        return changes.where(F.col("_change_type") == "insert").select(*columns.fieldNames())

    def latest_commit(self, spark: SparkSession, path: str) -> CommitFacts:
        [row] = self.for_path(spark, path).history(1).select(
            "version", "operation", "operationMetrics", "userMetadata"
        ).collect()
        custom: dict[str, str] = {}
        if row["userMetadata"]:
            try:
                custom = {str(k): str(v) for k, v in json.loads(row["userMetadata"]).items()}
            except (ValueError, AttributeError):
                custom = {"userMetadata": row["userMetadata"]}
        return CommitFacts(int(row["version"]), str(row["operation"]), dict(row["operationMetrics"] or {}), custom)

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        return {"userMetadata": json.dumps(dict(metadata), sort_keys=True)} if metadata else {}

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

    def table_class(self) -> Any:
        from medallion_assets.delta import DeltaTable

        return DeltaTable

    def read(self, spark: SparkSession, path: str, *, version: int | None = None,
             columns: Sequence[str] | None = None) -> DataFrame:
        from medallion_assets.delta import read_delta

        return read_delta(spark, path, version=version, columns=list(columns) if columns else None)

    def read_inserts(self, spark: SparkSession, path: str, *, after_version: int, to_version: int) -> DataFrame:
        columns = self.read(spark, path, version=to_version).schema
        if to_version <= after_version:
            return spark.createDataFrame([], columns)
        changes = self.for_path(spark, path).changes(startingVersion=after_version + 1, endingVersion=to_version)
        return changes.where(F.col("_change_type") == "insert").select(*columns.fieldNames())

    def latest_commit(self, spark: SparkSession, path: str) -> CommitFacts:
        import deltalake

        table = deltalake.DeltaTable(path)
        history = table.history(1)
        info = history[0] if history else {}
        known = {"version", "operation", "operationMetrics", "operationParameters", "timestamp",
                 "clientVersion", "engineInfo", "readVersion", "isBlindAppend", "userMetadata"}
        custom = {str(k): str(v) for k, v in info.items() if k not in known}
        return CommitFacts(int(info.get("version", table.version())), str(info.get("operation", "")),
                           dict(info.get("operationMetrics") or {}), custom)

    def commit_metadata_options(self, metadata: Mapping[str, str]) -> dict[str, str]:
        return {f"commitInfo.{key}": str(value) for key, value in metadata.items()}

    def execute_merge(self, spark: SparkSession, merge: Any, metadata: Mapping[str, str]) -> None:
        if metadata:
            merge = merge.withCommitInfo(dict(metadata))
        merge.execute()
