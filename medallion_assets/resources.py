"""Resources: the SparkSession and the lake's layout.

Both are pydantic configuration (Dagster ``ConfigurableResource``), validated
when constructed, and do nothing at import or construction: the session starts
the first time an asset asks for it, and paths resolve when used, against the
working directory of the process that uses them.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from dagster_pyspark import LazyPySparkResource
from pyarrow import fs
from pydantic import Field, PrivateAttr, field_validator, model_validator
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from medallion_assets.catalog import WAREHOUSE_FOLDER, LakeCatalog
from medallion_assets.checkpoints import locate_local
from medallion_assets.delta import has_native_delta
from medallion_assets.kafka import KafkaResource, kafka_connector_config
from medallion_assets.object_store import S3Store, hadoop_aws_package
from medallion_assets.settings import (
    DEFAULT_LAKE_ROOT,
    DELTA_ENGINES,
    DEPLOYMENTS,
    Deployment,
    LakeRoot,
    Settings,
    SettingsError,
    is_s3_uri,
    one_of,
    read_settings,
    refuse_unknown,
    variables_feeding,
)
from medallion_assets.storage.engines import DeltaEngine, engine_for
from medallion_assets.storage.session import (
    maven_resolution_config,
    merged_session_config,
    plan_engine,
    start_engine,
)

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from medallion_assets.feeds import Feed

#: Spark settings of the embedded session, sized for one machine: few shuffle
#: partitions because the tables are small, and UTC so that timestamps read the
#: same whatever the host's zone.
EMBEDDED_SPARK_CONFIG: dict[str, Any] = {
    "spark.sql.shuffle.partitions": "8",
    "spark.default.parallelism": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.adaptive.enabled": "true",
}

#: The garbage collector of an embedded session's driver. The parallel collector suits a batch
#: run's throughput better than the JDK's default G1, which spends CPU on short pauses nobody
#: waits for (docs/decisions/0007-embedded-jvm-settings.md).
EMBEDDED_DRIVER_GC_OPTIONS = "-XX:+UseParallelGC"

#: When an embedded session's optimizing JIT compiler (C2) takes a method: after four times the
#: JDK's default calls and loop iterations. A run plans and generates code for hundreds of small
#: queries whose code runs a few times; with the defaults, C2 spends much of a small run's JVM CPU
#: compiling it, on cores shared with the tasks (docs/decisions/0007-embedded-jvm-settings.md).
EMBEDDED_DRIVER_JIT_OPTIONS = (
    "-XX:Tier4InvocationThreshold=20000 -XX:Tier4MinInvocationThreshold=2400 "
    "-XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=160000"
)

#: Where else a driver's JVM options come from, besides the session's own settings.
_JVM_OPTION_VARIABLES = ("PYSPARK_SUBMIT_ARGS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")


def _spark_defaults_driver_lines() -> tuple[Path | None, list[str]]:
    """Spark's ``spark-defaults.conf``, if any, and its ``spark.driver.*`` lines.

    The file is in ``SPARK_CONF_DIR``, else in ``$SPARK_HOME/conf``.
    """
    conf_dir = os.environ.get("SPARK_CONF_DIR") or (
        os.path.join(os.environ["SPARK_HOME"], "conf") if os.environ.get("SPARK_HOME") else None
    )
    defaults = Path(conf_dir, "spark-defaults.conf") if conf_dir else None
    if defaults is None or not defaults.is_file():
        return None, []
    lines = [line.strip() for line in defaults.read_text(encoding="utf-8", errors="replace").splitlines()]
    return defaults, [line for line in lines if line.startswith("spark.driver.")]


def garbage_collector_chosen_elsewhere(config: dict[str, str]) -> str | None:
    """Where a garbage collector is already chosen for the driver's JVM, if anywhere: a description.

    The JVM refuses to start with two collectors ("Multiple garbage collectors
    selected"), so the embedded session adds its own choice only when none of
    the session's settings, the JVM option variables or Spark's
    ``spark-defaults.conf`` names one.
    """
    chooses_gc = re.compile(r"-XX:\+Use\w*GC\b")
    for key in ("spark.driver.defaultJavaOptions", "spark.driver.extraJavaOptions"):
        if chooses_gc.search(str(config.get(key, ""))):
            return f"the session setting {key}"
    for name in _JVM_OPTION_VARIABLES:
        if chooses_gc.search(os.environ.get(name, "")):
            return f"the environment variable {name}"
    defaults, lines = _spark_defaults_driver_lines()
    if any(chooses_gc.search(line) for line in lines):
        return str(defaults)
    return None


def default_java_options_set_elsewhere(config: dict[str, str]) -> str | None:
    """Where the driver's ``spark.driver.defaultJavaOptions`` is already set, if anywhere: a description.

    The session's own value would replace it, so the embedded session's
    options (:func:`embedded_driver_java_options`) are added only when neither
    the session's settings, ``PYSPARK_SUBMIT_ARGS`` nor ``spark-defaults.conf`` set it.
    """
    key = "spark.driver.defaultJavaOptions"
    if key in config:
        return f"the session setting {key}"
    if key in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        return "the environment variable PYSPARK_SUBMIT_ARGS"
    defaults, lines = _spark_defaults_driver_lines()
    # A properties file: the key ends at a blank, '=' or ':'.
    if any(re.split(r"[\s=:]", line, maxsplit=1)[0] == key for line in lines):
        return str(defaults)
    return None


def embedded_driver_java_options(config: dict[str, str]) -> str:
    """The JVM options an embedded session's driver starts with (``spark.driver.defaultJavaOptions``).

    Spark puts them before ``spark.driver.extraJavaOptions``, whose flags the
    JVM reads last and lets win. The collector is left out when one is chosen
    elsewhere (:func:`garbage_collector_chosen_elsewhere`).
    """
    options = [EMBEDDED_DRIVER_JIT_OPTIONS]
    if garbage_collector_chosen_elsewhere(config) is None:
        options.insert(0, EMBEDDED_DRIVER_GC_OPTIONS)
    return " ".join(options)


class SparkResource(LazyPySparkResource):
    """dagster-pyspark's lazy SparkSession resource, configured for this lakehouse.

    By default it starts an embedded ``local[*]`` session whose Python workers
    run the current interpreter, so they can import this package (the ``delta``
    data source classes are pickled by reference). Set ``master`` to a cluster
    URL, or ``remote`` to a Spark Connect endpoint, to run the same assets
    elsewhere. Every session it hands out has the ``delta`` format enabled.

    The session is created on first use and shared through ``getOrCreate``:
    every asset of a run executed in one process uses one JVM.
    """

    master: str | None = Field(
        default="local[*]",
        description=("Spark master URL (local[*], spark://host:7077, k8s://..., yarn). Ignored when `remote` is set."),
    )
    remote: str | None = Field(
        default=None,
        description="Spark Connect endpoint (sc://host:15002). When set, no local JVM is started.",
    )
    app_name: str = Field(default="medallion-assets", description="Spark application name.")
    spark_config: dict[str, Any] = Field(
        default_factory=lambda: dict(EMBEDDED_SPARK_CONFIG),
        description="Extra Spark configuration, applied to the session builder (key -> value).",
    )
    delta_engine: str = Field(
        default="auto",
        description=(
            "Delta engine of the session: auto (delta-spark when the platform, DELTA_SPARK_JARS or Maven "
            "provides it, else delta-rs), delta-spark (fail without it) or delta-rs."
        ),
    )
    delta_spark_jars: str | None = Field(
        default=None,
        description="Local delta-spark jars: a folder of jars or a comma list of jar files (air-gapped clusters).",
    )
    delta_spark_maven: bool | None = Field(
        default=None,
        description=(
            "Fetch delta-spark from Maven (spark.jars.packages) when no jars are named: true fetches, false "
            "never does, unset (None) fetches when a probe of a few seconds finds Maven reachable (an offline "
            "machine then runs delta-rs instead of waiting on the download)."
        ),
    )
    kafka_connector_jars: str | None = Field(
        default=None,
        description="Local jars of Spark's Kafka connector (a folder or a comma list), for the Kafka bronze stream "
        "on machines without Maven.",
    )
    kafka_connector_maven: bool = Field(
        default=False,
        description="Fetch Spark's Kafka connector from Maven (spark.jars.packages) when no jars are named.",
    )
    catalog: LakeCatalog = Field(
        default_factory=LakeCatalog,
        description=(
            "Where the lake's tables are registered by name (medallion_assets.catalog): the session's catalog, "
            "filled from catalog.lake_root when spark_session is first asked for (default), a shared Hive "
            "metastore, or none."
        ),
    )
    object_store: S3Store | None = Field(
        default=None,
        description=(
            "The S3-compatible store of a lake on s3:// (MEDALLION_S3_*, AWS_* key pair): the session gets "
            "hadoop-aws from Maven and S3A's settings, its key pair on the Hadoop configuration only."
        ),
    )
    python_workers_use_driver_interpreter: bool = Field(
        default=True,
        description=(
            "Run Python workers with the interpreter running Dagster, unless "
            "spark.pyspark.python or PYSPARK_PYTHON chooses one. Right for embedded "
            "sessions; a cluster sets its own."
        ),
    )

    _engine: Any = PrivateAttr(default=None)
    _lake_attached: bool = PrivateAttr(default=False)
    _run_log: Any = PrivateAttr(default=None)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Keeps the run's log, so the session's start and readiness show on the run's page.

        The session itself still starts on first use (:meth:`_init_session`), inside the
        first step that asks for it; outside a run (a script, a sensor tick) there is no
        run log and the lines go to this module's Python logger.
        """
        self._run_log = context.log

    @field_validator("delta_engine", mode="before")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        return refuse_unknown(
            value,
            DELTA_ENGINES,
            field="SparkResource.delta_engine",
            what="a Delta engine",
            variable="MEDALLION_DELTA_ENGINE",
        )

    @model_validator(mode="after")
    def _master_or_remote(self) -> SparkResource:
        if not self.master and not self.remote:
            raise ValueError(
                "SparkResource needs `master` (SPARK_MASTER_URL with MEDALLION_DEPLOYMENT=cluster) or "
                "`remote` (SPARK_REMOTE with MEDALLION_DEPLOYMENT=connect); both are empty"
            )
        return self

    @property
    def delta_engine_in_use(self) -> DeltaEngine:
        """The Delta engine of this resource's session (starts the session if needed)."""
        if self._engine is None:
            self._engine = engine_for(self.session_by_path)
        return self._engine

    def _init_session(self) -> None:
        # Overrides dagster-pyspark's builder: master/remote first, then enable_delta.
        if self._spark_session is not None:
            return
        # A Connect client's jars are its server's: no Maven probe. A session already running in
        # this process (Dagster builds this resource twice, for the assets and inside the IO manager)
        # gets the same plan as the one that started it: the probe's answer is cached per process,
        # so the run log gives the same reason for both instead of "Maven is not used".
        probe_useless = bool(self.remote)
        # A JVM this process already runs without delta-spark (a notebook's, a test session's) cannot
        # gain it: its class path and catalog are fixed at its start, and delta-spark's settings on
        # it would only point its catalog at a class it lacks. Under auto it runs the delta-rs engine.
        fixed_without_delta = self.delta_engine == "auto" and _running_jvm_lacks_delta_spark(remote=bool(self.remote))
        plan = plan_engine(
            self.delta_engine,  # type: ignore[arg-type]
            jars=None if fixed_without_delta else self.delta_spark_jars or None,
            maven=False
            if fixed_without_delta or (probe_useless and self.delta_spark_maven is None)
            else self.delta_spark_maven,
            spark_config=self.spark_config,
        )
        if self.object_store is not None and plan.source is None and not self.remote:
            raise ObjectStoreEngineError(
                f"MEDALLION_DELTA_ENGINE={self.delta_engine!r} runs the delta-rs engine here ({plan.reason}), "
                "which cannot write a lake on an object store (MEDALLION_LAKE_ROOT=s3://...): it stages and "
                "moves its Parquet files through local folders. Set MEDALLION_DELTA_ENGINE=delta-spark (with "
                "MEDALLION_DELTA_SPARK_MAVEN or DELTA_SPARK_JARS), or MEDALLION_LAKE_ROOT to a local folder"
            )
        builder = SparkSession.builder.appName(self.app_name)
        if self.remote:
            builder = builder.remote(self.remote)
        elif self.master:
            builder = builder.master(self.master)
        connector = kafka_connector_config(
            jars=self.kafka_connector_jars or None, maven=self.kafka_connector_maven, spark_config=self.spark_config
        )
        # A Connect client starts no JVM: its server carries the jars.
        config = merged_session_config(plan.spark_config, connector) if not self.remote else {}
        if not self.remote:
            config = merged_session_config(config, self.catalog.spark_config())
        if self.object_store is not None and not self.remote:
            # hadoop-aws through the same Maven route as delta-spark's jars (a Connect server carries its own).
            config = merged_session_config(
                config,
                {"spark.jars.packages": hadoop_aws_package(), **maven_resolution_config(config)},
                self.object_store.spark_config(),
            )
        # A local master: the JVM this process starts is the driver and the only executor.
        embedded = not self.remote and str(self.master).startswith("local")
        if plan.source and embedded:
            # delta-spark rebuilds a table's snapshot with 50 tasks by default, and VACUUM lists
            # a table's folders with Spark's partition-discovery parallelism, 10000 tasks: both
            # sized for clusters (docs/decisions/0007-embedded-jvm-settings.md). An embedded session
            # has its cores. Clusters keep the defaults.
            cores = str(_local_cores(str(self.master)))
            config["spark.databricks.delta.snapshotPartitions"] = cores
            config["spark.sql.sources.parallelPartitionDiscovery.parallelism"] = cores
        config.update({str(k): str(v) for k, v in self.spark_config.items()})
        if embedded and default_java_options_set_elsewhere(config) is None:
            config["spark.driver.defaultJavaOptions"] = embedded_driver_java_options(config)
        if embedded and "spark.driver.memory" not in config and not os.environ.get("SPARK_DRIVER_MEMORY"):
            # An embedded session's driver JVM is also its only executor; Spark's 1g default
            # leaves too little for caches and broadcast joins once tables grow.
            memory = embedded_driver_memory()
            config["spark.driver.memory"] = memory
            # The delta-rs engine's MERGE collects its source to the driver; Spark's 1g cap
            # on collected results stopped silver's first lineitem MERGE at SF 1.
            config.setdefault("spark.driver.maxResultSize", f"{max(int(memory[:-1]) // 2, 1)}g")
        if (
            not self.remote
            and self.python_workers_use_driver_interpreter
            and "spark.pyspark.python" not in config
            and not os.environ.get("PYSPARK_PYTHON")
        ):
            config["spark.pyspark.python"] = sys.executable
        for key, value in config.items():
            builder = builder.config(key, value)
        # Only the resource that starts the process's session says so (Dagster builds this resource
        # twice, and the second one's getOrCreate finds the first one's session).
        starting = not _session_running(remote=bool(self.remote))
        deployment = self._deployment(config)
        if starting:
            self._log(
                f"Spark session starting: {deployment}; Delta engine {_planned_engine(plan)} ({plan.reason}). "
                "The first table waits for it (a JVM's start takes up to a minute or two on a busy machine)."
            )
        started = time.monotonic()
        secrets = {} if self.remote else self.catalog.hadoop_secrets()
        if self.object_store is not None and not self.remote:
            secrets.update(self.object_store.hadoop_secrets())
        if secrets:
            _start_context_with_hadoop_secrets(config, master=str(self.master), app_name=self.app_name, secrets=secrets)
        session = builder.getOrCreate()
        self._engine = start_engine(session, plan)
        self._spark_session = session
        if starting:
            self._log(
                f"Spark session ready after {time.monotonic() - started:.1f} s: Spark {session.version}, "
                f"{deployment}; Delta engine {self._engine.describe()}."
            )
        if self.catalog.kind == "hive" and self.catalog.lake_root:
            # The shared metastore's names serve other processes too (the Thrift server, other
            # sessions): a starting session adds the tables it lacks, such as a pandas asset's.
            self._attach_lake(session)

    def _deployment(self, config: dict[str, str]) -> str:
        """Where the session runs, for the run log.

        Embedded, a cluster's master or a Connect server (no credentials).
        """
        if self.remote:
            # A Connect URL may carry a token after ';' (sc://host:15002/;token=...): only the address is shown.
            return f"Spark Connect server {_without_credentials(str(self.remote).split(';', 1)[0].rstrip('/'))}"
        if str(self.master).startswith("local"):
            memory = config.get("spark.driver.memory") or os.environ.get("SPARK_DRIVER_MEMORY") or "Spark's default"
            return f"embedded in this process ({self.master}, driver memory {memory})"
        return f"cluster at {_without_credentials(str(self.master))}"

    def _log(self, message: str) -> None:
        if self._run_log is not None:
            self._run_log.info(message)
        else:
            _log.info(message)

    def _attach_lake(self, session: SparkSession) -> None:
        if self.catalog.enabled and self.catalog.lake_root and not self._lake_attached:
            store = self.object_store or S3Store()
            lake = LakeResource(
                root=self.catalog.lake_root,
                s3_endpoint=store.endpoint,
                s3_region=store.region,
                s3_path_style=store.path_style,
                s3_access_key_id=store.access_key_id,
                s3_secret_access_key=store.secret_access_key,
            )
            self.catalog.attach(session, self.delta_engine_in_use, lake.delta_tables())
            self._lake_attached = True

    @property
    def spark_session(self) -> SparkSession:
        """The session (started on first use), with every table of the lake named in its catalog.

        With the ``session`` catalog the names are registered here, on first use:
        registering reads each table's log, seconds for a whole lake, which a run
        whose steps work by path (:attr:`session_by_path`) does not pay.

        Raises:
            CatalogError: the catalog refused a table (the message names it and the fix).
        """
        session = self.session_by_path
        self._attach_lake(session)
        return session

    @property
    def session_by_path(self) -> SparkSession:
        """The session (started on first use), for code that reads and writes tables by path.

        The IO manager and the bronze streams use it. With the ``session`` catalog
        over the lake, no table is named until something asks for
        :attr:`spark_session`, which names the whole lake, what was written
        before included; from then on, and always with a shared metastore or a
        catalog without ``lake_root``, a table gets its name as it is written
        (:meth:`~medallion_assets.catalog.LakeCatalog.register_written`).
        """
        # dagster-pyspark's own property: starts the session on first use, never hands out None.
        return super().spark_session


def _running_jvm_lacks_delta_spark(*, remote: bool) -> bool:
    """Whether this process already runs an embedded Spark JVM that has no delta-spark."""
    if remote or not _session_running(remote=False):
        return False

    return not has_native_delta(SparkSession.builder.getOrCreate())


def _session_running(*, remote: bool) -> bool:
    """Whether this process already holds a Spark session of that kind (a JVM's, or a Connect client's)."""
    if remote:
        # deferred: the Connect client loads grpc and its protobufs, needed only where a session is remote
        from pyspark.sql.connect.session import SparkSession as ConnectSession

        return ConnectSession._get_default_session() is not None

    return SparkContext._active_spark_context is not None


def _planned_engine(plan: Any) -> str:
    """The engine a plan aims at: delta-spark (and where from), or delta-rs.

    For delta-rs, the reason says when the platform could change that.
    """
    if plan.source:
        return f"delta-spark ({plan.source})"
    return "delta-rs"


def _without_credentials(url: str) -> str:
    """A URL without the ``user:password@`` part its authority may hold."""
    return re.sub(r"//[^/@]*@", "//", url)


def _start_context_with_hadoop_secrets(
    config: dict[str, str], *, master: str, app_name: str, secrets: dict[str, str]
) -> None:
    """Start the SparkContext, then put ``secrets`` on its Hadoop configuration, before any session exists.

    The session the builder then makes copies that configuration into its shared
    state, from which its Hive client is built; the secrets never become Spark
    settings, which pyspark would pass to ``spark-submit`` on the JVM's command line.
    A context already running in this process is left as it is (its session and
    catalog were set up by whoever started it).
    """

    if SparkContext._active_spark_context is not None:
        return
    conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in config.items():
        conf.set(key, value)
    hadoop = SparkContext.getOrCreate(conf)._jsc.hadoopConfiguration()
    for key, value in secrets.items():
        hadoop.set(key, value)


def embedded_driver_memory() -> str:
    """The driver memory an embedded session gets unless configured: a quarter of the machine's, 1g to 8g.

    Half of it may be collected results (``spark.driver.maxResultSize``).

    Example:
        >>> embedded_driver_memory()  # on a 24 GB machine  # doctest: +SKIP
        '6g'
    """
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "1g"
    return f"{min(max(physical // 4 // 1024**3, 1), 8)}g"


def _local_cores(master: str) -> int:
    """The cores of a ``local``, ``local[N]`` or ``local[*]`` master."""
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    count = inside.split(",")[0]
    return os.cpu_count() or 1 if count == "*" else max(int(count), 1)


#: Folders of the lake root that hold no tables.
_NOT_LAYERS = ("landing", "_checkpoints", WAREHOUSE_FOLDER)


class LakeResource(ConfigurableResource):
    """Where the lake lives: the landing folder, the tables, the stream checkpoints.

    Layout under ``root``::

        landing/<orders|customers|reference/<table>>/   files as delivered
        <layer>/<table>/                                 one Delta table per asset key
        _checkpoints/<stream>/                           Structured Streaming checkpoints

    ``root`` may be relative; it resolves against the working directory when a
    path is asked for, never at import. A URI with a scheme (``s3://``) is kept as is.
    """

    root: str = Field(
        default=DEFAULT_LAKE_ROOT,
        description="Lake root: a local folder (relative to the working directory) or an object-store URI.",
    )
    root_variable: str | None = Field(
        default=None,
        description="The environment variable root came from (MEDALLION_LAKE_ROOT), named in errors; "
        "unset: root was given directly or is the default.",
    )
    s3_endpoint: str | None = Field(
        default=None, description="The S3-compatible store's endpoint, http(s)://host[:port]; unset: AWS S3's."
    )
    s3_region: str | None = Field(default=None, description="The bucket's region; unset: the clients' default.")
    s3_path_style: bool | None = Field(
        default=None, description="Address the bucket in the path, not the host name (self-hosted stores)."
    )
    s3_access_key_id: str | None = Field(
        default=None, description="The store's access key (EnvVar AWS_ACCESS_KEY_ID); unset: the credential chain."
    )
    s3_secret_access_key: str | None = Field(
        default=None, description="The store's secret key (EnvVar AWS_SECRET_ACCESS_KEY: never shown or logged)."
    )

    @field_validator("root")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not isinstance(value, str) or (type(value) is str and not value.strip()):
            raise ValueError(
                f"LakeResource.root={value!r} is blank: give the lake's folder or URI "
                "(MEDALLION_LAKE_ROOT sets it in the deployed definitions)"
            )
        return value

    @property
    def on_s3(self) -> bool:
        """The lake is on an S3-compatible store (an ``s3://`` or ``s3a://`` root)."""
        return is_s3_uri(self.root)

    @property
    def store(self) -> S3Store | None:
        """The lake's S3-compatible store (its settings), ``None`` for a lake not on S3."""
        if not self.on_s3:
            return None
        return S3Store(
            endpoint=self.s3_endpoint,
            region=self.s3_region,
            path_style=self.s3_path_style,
            access_key_id=self.s3_access_key_id,
            secret_access_key=self.s3_secret_access_key,
        )

    def delta_storage_options(self) -> dict[str, str] | None:
        """deltalake's object-store options for the lake's store (:meth:`S3Store.delta_storage_options`: the
        secret included, for deltalake only); ``None`` for a local lake."""
        store = self.store
        return store.delta_storage_options() if store else None

    def filesystem(self, location: str):
        """pyarrow's filesystem for ``location`` (a path under the lake, or any local path) and the path in it.

        An ``s3://``/``s3a://`` location is reached with the lake's store settings; a local path or
        ``file:`` URI through the local filesystem; another URI through pyarrow's own resolution.
        The signature of :data:`~medallion_assets.checkpoints.Locate`: checkpoints and landed files
        are read through it.
        """

        if is_s3_uri(location):
            return (self.store or S3Store()).filesystem(), location.split("://", 1)[1]
        return locate_local(location)

    def _join(self, *parts: str) -> str:
        if "://" in self.root:
            return "/".join([self.root.rstrip("/"), *parts])
        return str(Path(self.root).expanduser().resolve().joinpath(*parts))

    @property
    def root_path(self) -> str:
        """The lake root, resolved (absolute path or URI)."""
        return self._join()

    @property
    def landing_dir(self) -> str:
        """The landing folder producers write to (see docs/landing-contract.md)."""
        return self._join("landing")

    def landing_folder(self, feed: Feed) -> str:
        """The landing sub-folder a feed lands in, e.g. ``landing/orders``."""
        folder = getattr(feed.source, "folder", None)
        if folder is None:
            raise ValueError(f"feed {feed.name!r} does not land files (its source is {feed.source!r})")
        return self._join("landing", *folder.split("/"))

    def reference_folder(self, table: str) -> str:
        """The landing folder of a reference snapshot table (``landing/reference/<table>``)."""
        return self._join("landing", "reference", table)

    def checkpoint_dir(self, stream: str) -> str:
        """The Structured Streaming checkpoint of a stream, under ``_checkpoints/``."""
        return self._join("_checkpoints", stream)

    def table_path(self, key: Sequence[str]) -> str:
        """The Delta table of an asset key ``[layer, table]``: ``<root>/<layer>/<table>``."""
        parts = list(key)
        if len(parts) != 2:
            raise ValueError(f"asset keys of the lake are [layer, table], got {parts}")
        return self._join(*parts)

    def table_paths(self, layer: str) -> list[str]:
        """The folders directly under ``<root>/<layer>`` (candidate tables), sorted."""
        folder = self._join(layer)
        return [self._join(layer, name) for name in self._list(folder, directories=True)]

    def delta_tables(self) -> list[tuple[str, str, str]]:
        """``(layer, table, path)`` of every Delta table ``<root>/<layer>/<table>`` (a folder with a ``_delta_log``)."""
        found = []
        for layer in self._list(self.root_path, directories=True):
            if layer in _NOT_LAYERS:
                continue
            for path in self.table_paths(layer):
                if "_delta_log" in self._list(path, directories=True):
                    found.append((layer, path.rstrip("/").rsplit("/", 1)[-1], path))
        return found

    def files(self, folder: str, suffix: str) -> list[str]:
        """The files directly in ``folder`` whose names end with ``suffix``, as full paths, sorted."""
        return [
            f"{folder.rstrip('/')}/{name}" for name in self._list(folder, directories=False) if name.endswith(suffix)
        ]

    def files_modified(self, folder: str, suffix: str) -> dict[str, int]:
        """:meth:`files` with each file's modification time (nanoseconds since the epoch: per the landing
        contract, when it landed)."""

        filesystem, base = self.filesystem(folder)
        infos = filesystem.get_file_info(fs.FileSelector(base, allow_not_found=True))
        return {
            f"{folder.rstrip('/')}/{info.base_name}": info.mtime_ns or 0
            for info in sorted(infos, key=lambda info: info.base_name)
            if info.type == fs.FileType.File and info.base_name.endswith(suffix)
        }

    def _list(self, folder: str, *, directories: bool) -> list[str]:
        # Through pyarrow's filesystems on the driver, so an object-store root lists as a local
        # one does (given pyarrow's support for that store), with no JVM (Spark Connect has none).

        filesystem, base = self.filesystem(folder)
        wanted = fs.FileType.Directory if directories else fs.FileType.File
        infos = filesystem.get_file_info(fs.FileSelector(base, allow_not_found=True))
        return sorted(info.base_name for info in infos if info.type == wanted)

    def setup_for_execution(self, context: InitResourceContext) -> None:
        """Checks, when a run (or sensor tick) starts, that the lake root can be written.

        Dagster sets resources up before any step runs, and the Spark resource starts
        its session only when an asset first asks for it: a lake root that cannot be
        created or written stops the run here, naming the setting, instead of after
        Spark's start-up.

        Raises:
            LakeRootError: the root is a file, cannot be created, or cannot be written.
        """
        problem = self.write_problem()
        if problem:
            raise LakeRootError(problem)

    def write_problem(self) -> str | None:
        """Why the lake root cannot be written, naming :attr:`root_variable` when it came from there; else ``None``.

        A local root is created when missing (with its parents), then written to: a
        temporary file is written and removed in it. Whether that works decides, not
        the mode bits, so a read-only mount, ACLs, NFS or a pseudo file system such as
        ``/proc`` count, whatever the user's privileges (root too). An object-store URI
        (``s3://``) is not probed: its permissions are the store's, known only to a real
        write, and asking would be a network call.
        """

        if "://" in self.root:
            return None
        variable = self.root_variable
        problem = LakeRoot(self.root, variable).problem()
        if problem:
            return problem
        path = Path(self.root).expanduser().absolute()
        named = f"{variable}={self.root!r}" if variable else f"the lake root {self.root!r}"
        fix = f"point {variable or 'MEDALLION_LAKE_ROOT'} at a folder this user can write"
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            return f"{named} cannot be created ({path}: {error.strerror or error}): {fix}, or create it"
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".medallion-write-check-") as probe:
                probe.write(b"medallion")
                probe.flush()
        except OSError as error:
            return f"{named} is not writable ({path}: {error.strerror or error}): {fix}, or make it writable"
        return None


class ObjectStoreEngineError(RuntimeError):
    """The Delta engine planned cannot write a lake on an object store (its message names the settings and the
    fix)."""


class LakeRootError(OSError):
    """The lake root cannot be written (its message names the setting, the path and the fix)."""


# ---------------------------------------------------------------- per deployment


def lake_resource(settings: Settings | None = None) -> LakeResource:
    """The lake at the settings' root (``MEDALLION_LAKE_ROOT``, or ``./lakehouse`` when it is not set).

    Args:
        settings: the checked settings (default: :func:`~medallion_assets.settings.read_settings`'s).
    """
    settings = settings or read_settings()
    root = settings.lake_root
    return LakeResource(
        root=root.location,
        root_variable=root.variable,
        **{name: value for name, value in settings.fields_of("LakeResource").items() if name != "root"},
        **_credentials(settings, "LakeResource"),
    )


#: Environment variables of the Delta engine choice and the connectors' jars -> SparkResource fields.
ENGINE_VARIABLES = {
    name: field for name, field in variables_feeding("SparkResource").items() if field not in ("master", "remote")
}


def engine_settings(settings: Settings | None = None) -> dict[str, Any]:
    """The engine and connector fields of the Spark resource, from the variables that are set.

    Unset variables keep the resource's defaults (``auto``, no jars, Maven probed
    for delta-spark, not used for Kafka's connector). Kafka's connector is put on
    the session only where the Kafka feeds are in the definitions
    (``MEDALLION_KAFKA_BOOTSTRAP_SERVERS`` set): a session that reads no topic does
    not resolve or load it.

    Args:
        settings: the checked settings (default: :func:`~medallion_assets.settings.read_settings`'s).

    Raises:
        SettingsError: without ``settings``, a variable the project cannot use (a switch spelled ``ture``), named.
    """
    settings = settings or read_settings()
    fields = settings.fields_of("SparkResource")
    if not settings.kafka:
        fields = {name: value for name, value in fields.items() if not name.startswith("kafka_")}
    return fields


#: Environment variables of the IO manager's size limits -> DeltaIOManager fields (whole numbers): each
#: field is its variable's name without the prefix, in lower case (``arrow_merge_max_table_mb``).
IO_MANAGER_VARIABLES = variables_feeding("DeltaIOManager")


def io_manager_settings(settings: Settings | None = None) -> dict[str, Any]:
    """The IO manager's size limits from the variables that are set; unset ones keep the defaults.

    Args:
        settings: the checked settings (default: :func:`~medallion_assets.settings.read_settings`'s).
    """
    return (settings or read_settings()).fields_of("DeltaIOManager")


#: Environment variables of the Kafka source -> KafkaResource fields (all strings).
KAFKA_VARIABLES = variables_feeding("KafkaResource")


def _credentials(settings: Settings, resource: str, *, resolved: bool = False) -> dict[str, Any]:
    """The credential fields of ``resource`` whose variables are set, as ``EnvVar``: Dagster reads them when a
    run starts and keeps their values out of its UI; ``resolved``: their values, for a process outside Dagster."""
    return {
        field: EnvVar(name).get_value() if resolved else EnvVar(name)
        for name, field in variables_feeding(resource).items()
        if name in settings.credentials
    }


def kafka_resource(settings: Settings | None = None, *, resolved: bool = False):
    """The Kafka source of the deployment: fields from the ``MEDALLION_KAFKA_*`` variables that are set.

    With none set the resource is unconfigured and the Kafka bronze table stays empty.

    Args:
        settings: the checked settings (default: :func:`~medallion_assets.settings.read_settings`'s).
        resolved: read the SASL password now, for a process outside Dagster (the CLI), instead of
            naming it with ``EnvVar`` for Dagster to resolve (and to keep out of the UI).
    """

    settings = settings or read_settings()
    return KafkaResource(
        **settings.fields_of("KafkaResource"), **_credentials(settings, "KafkaResource", resolved=resolved)
    )


#: Environment variables of the catalog -> LakeCatalog fields (all strings).
CATALOG_VARIABLES = variables_feeding("LakeCatalog")


def lake_catalog(settings: Settings | None = None) -> LakeCatalog:
    """The catalog of the deployment: the ``MEDALLION_CATALOG*``/``MEDALLION_METASTORE_*`` variables that are set,
    over the lake of ``MEDALLION_LAKE_ROOT`` (or ``./lakehouse``). Unset: the session catalog.

    Args:
        settings: the checked settings (default: :func:`~medallion_assets.settings.read_settings`'s).
    """
    settings = settings or read_settings()
    return LakeCatalog(
        lake_root=settings.lake_root.location,
        **settings.fields_of("LakeCatalog"),
        **_credentials(settings, "LakeCatalog"),
    )


def spark_resource(deployment: Deployment | None = None, *, settings: Settings | None = None) -> SparkResource:
    """The Spark resource of a deployment: ``local``, ``cluster`` or ``connect``.

    Outside Dagster (a notebook, a script), ``spark_resource().process_config_and_initialize()``
    resolves its settings; its ``spark_session`` then finds the lake's tables by name.

    Args:
        deployment: the deployment (default: the settings', ``MEDALLION_DEPLOYMENT``).
        settings: the checked settings (default: :func:`~medallion_assets.settings.read_settings`'s).
    """
    settings = settings or read_settings()
    deployment = deployment or settings.deployment
    engine = {**engine_settings(settings), "catalog": lake_catalog(settings)}
    store = lake_resource(settings).store
    if store is not None:
        engine["object_store"] = store
    # The endpoints may carry credentials (a Connect token, a master's user:password@): named, read at run start.
    if deployment == "local":
        return SparkResource(**engine)
    if deployment == "cluster":
        return SparkResource(master=EnvVar("SPARK_MASTER_URL"), python_workers_use_driver_interpreter=False, **engine)
    if deployment == "connect":
        return SparkResource(master=None, remote=EnvVar("SPARK_REMOTE"), **engine)
    raise SettingsError(
        f"MEDALLION_DEPLOYMENT={deployment!r} is not a deployment: use {one_of(DEPLOYMENTS)} (or unset it for local)"
    )
