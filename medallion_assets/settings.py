"""Every environment variable the project reads, checked once, early, by name.

:func:`read_settings` runs when the definitions load (the ``@definitions``
function), before any resource is built or any Spark session starts. A
value the project cannot use stops the load with one :class:`SettingsError`
whose first line names the variable, the value, what it may be and the fix;
several wrong values are listed one per line in the same error. The resources'
own validators stay (they protect direct construction), but a user who set a
variable reads about the variable, not about a pydantic field.

:data:`VARIABLES` is the table docs/settings.md is written from. Reading the
environment here has no side effect: nothing is created, imported from the
user's packages, or connected to, except ``MEDALLION_PIPELINES``'s packages
being looked up (they are imported right after, by the definitions, anyway).

Nothing here runs at import.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast, get_args

#: Where Spark runs: embedded, on a cluster (``SPARK_MASTER_URL``), or through Spark Connect (``SPARK_REMOTE``).
Deployment = Literal["local", "cluster", "connect"]
#: The Delta engine a session is asked for (``auto``: delta-spark where it can be had, else delta-rs).
EngineSetting = Literal["auto", "delta-spark", "delta-rs"]
#: Where the lake's tables are registered by name.
CatalogKind = Literal["session", "hive", "none"]
DEPLOYMENTS: tuple[Deployment, ...] = get_args(Deployment)
DELTA_ENGINES: tuple[EngineSetting, ...] = get_args(EngineSetting)
CATALOGS: tuple[CatalogKind, ...] = get_args(CatalogKind)
DEFAULT_LAKE_ROOT = "./lakehouse"


def one_of(allowed: tuple[str, ...]) -> str:
    """The allowed values in words, for an error: ``auto, delta-spark or delta-rs``."""
    return f"{', '.join(allowed[:-1])} or {allowed[-1]}" if len(allowed) > 1 else allowed[0]


def refuse_unknown(value: Any, allowed: tuple[str, ...], *, field: str, what: str, variable: str) -> Any:
    """``value`` as it is, if it is one of ``allowed``; for a resource field's validator.

    An :class:`~dagster.EnvVar` (a ``str`` subclass) passes: Dagster validates the
    resource again once it has resolved the variable.

    Raises:
        ValueError: naming ``field``, the value, the allowed values and the ``variable`` that sets it.
    """
    if type(value) is str and value not in allowed:
        raise ValueError(
            f"{field}={value!r} is not {what}: use {one_of(allowed)} ({variable} sets it in the deployed definitions)"
        )
    return value


class SettingsError(ValueError):
    """One or more environment variables hold values the project cannot use (one line each)."""


@dataclass(frozen=True)
class Variable:
    """One environment variable the project reads, as docs/settings.md describes it.

    Attributes:
        name: the variable.
        does: what it sets.
        allowed: the values it may take.
        default: what an unset variable means.
        setting: the :class:`Settings` field holding its checked, typed value (``None``: a credential).
        feeds: the resource field it configures, ``Resource.field`` (``None``: it shapes the definitions).
        credential: it may carry a password or token: :func:`read_settings` checks it but keeps only
            whether it is set (:attr:`Settings.credentials`); the resources name it with Dagster's
            ``EnvVar``, so its value is read when a run starts and never shown or logged.
    """

    name: str
    does: str
    allowed: str
    default: str
    setting: str | None = None
    feeds: str | None = None
    credential: bool = False


#: Every environment variable the project reads (docs/settings.md is this table).
VARIABLES: tuple[Variable, ...] = (
    Variable(
        "MEDALLION_DEPLOYMENT",
        "Where Spark runs: embedded, on a cluster, or through Spark Connect.",
        ", ".join(DEPLOYMENTS),
        "local",
        setting="deployment",
    ),
    Variable(
        "SPARK_MASTER_URL",
        "The cluster's master, with MEDALLION_DEPLOYMENT=cluster (required there).",
        "spark://host:port, k8s://https://host:port, yarn, mesos://host:port, local[N]",
        "none",
        feeds="SparkResource.master",
        credential=True,
    ),
    Variable(
        "SPARK_REMOTE",
        "The Spark Connect endpoint, with MEDALLION_DEPLOYMENT=connect (required there).",
        "sc://host[:port][/;params]",
        "none",
        feeds="SparkResource.remote",
        credential=True,
    ),
    Variable(
        "MEDALLION_DELTA_ENGINE",
        "Which Delta engine the session runs.",
        ", ".join(DELTA_ENGINES),
        "auto",
        setting="delta_engine",
        feeds="SparkResource.delta_engine",
    ),
    Variable(
        "DELTA_SPARK_JARS",
        "Local delta-spark jars (machines without Maven).",
        "a folder of .jar files, or a comma list of .jar files",
        "none",
        setting="delta_spark_jars",
        feeds="SparkResource.delta_spark_jars",
    ),
    Variable(
        "MEDALLION_DELTA_SPARK_MAVEN",
        "Fetch delta-spark from Maven: unset probes Maven under auto "
        "(and delta-spark), true fetches without probing, false never fetches.",
        "true/false (also yes/no, on/off, 1/0)",
        "unset: probe",
        setting="delta_spark_maven",
        feeds="SparkResource.delta_spark_maven",
    ),
    Variable(
        "KAFKA_SPARK_JARS",
        "Local jars of Spark's Kafka connector, for the Kafka bronze stream.",
        "a folder of .jar files, or a comma list of .jar files",
        "none",
        setting="kafka_connector_jars",
        feeds="SparkResource.kafka_connector_jars",
    ),
    Variable(
        "MEDALLION_KAFKA_MAVEN",
        "Fetch Spark's Kafka connector from Maven when KAFKA_SPARK_JARS is not set.",
        "true/false (also yes/no, on/off, 1/0)",
        "false",
        setting="kafka_maven",
        feeds="SparkResource.kafka_connector_maven",
    ),
    Variable(
        "MEDALLION_LAKE_ROOT",
        "The lake's root folder (landing, layers, checkpoints); must be writable.",
        "a local folder (relative: to the working directory) or an object-store URI (s3://...)",
        DEFAULT_LAKE_ROOT,
        setting="lake_root",
        feeds="LakeResource.root",
    ),
    Variable(
        "MEDALLION_DEMO",
        "Include the project's own pipelines (medallion_assets.pipelines: TPC-H) and the "
        "simulator; off: only the MEDALLION_PIPELINES packages (which it then requires).",
        "on/off (also true/false, yes/no, 1/0)",
        "on",
        setting="demo",
    ),
    Variable(
        "MEDALLION_SIMULATOR",
        "Include the demo feed landing/simulated_batch.",
        "on/off (also true/false, yes/no, 1/0)",
        "on (off with MEDALLION_DEMO=off)",
        setting="simulator",
    ),
    Variable(
        "MEDALLION_PIPELINES",
        "Pipeline packages besides medallion_assets.pipelines (instead of it with MEDALLION_DEMO=off).",
        "a comma list of importable Python packages",
        "none",
        setting="pipelines",
    ),
    Variable(
        "MEDALLION_CATALOG",
        "Where the lake's tables are registered by name: the session's own catalog "
        "(filled from the lake when a session starts), a shared Hive metastore, or nowhere.",
        ", ".join(CATALOGS),
        "session",
        setting="catalog",
        feeds="LakeCatalog.kind",
    ),
    Variable(
        "MEDALLION_CATALOG_DATABASE_PREFIX",
        "Prefix of the layer databases (team_ gives team_gold.<table>).",
        "letters, digits and _, starting with a letter or _",
        "none",
        setting="catalog_database_prefix",
        feeds="LakeCatalog.database_prefix",
    ),
    Variable(
        "MEDALLION_METASTORE_URL",
        "JDBC URL of the Hive metastore's database, with MEDALLION_CATALOG=hive.",
        "jdbc:postgresql://host:port/db (or another JDBC URL)",
        "none",
        setting="metastore_url",
        feeds="LakeCatalog.metastore_url",
    ),
    Variable(
        "MEDALLION_METASTORE_USER",
        "User of the metastore database.",
        "any text",
        "none",
        feeds="LakeCatalog.metastore_user",
        credential=True,
    ),
    Variable(
        "MEDALLION_METASTORE_PASSWORD",
        "Password of the metastore database (never logged or shown).",
        "any text",
        "none",
        feeds="LakeCatalog.metastore_password",
        credential=True,
    ),
    Variable(
        "MEDALLION_METASTORE_DRIVER",
        "JDBC driver class of the metastore database.",
        "a Java class name",
        "org.postgresql.Driver",
        setting="metastore_driver",
        feeds="LakeCatalog.metastore_driver",
    ),
    Variable(
        "MEDALLION_METASTORE_JARS",
        "The metastore database's JDBC driver jar(s).",
        "a jar file, a folder of .jar files, or a comma list of .jar files",
        "none",
        setting="metastore_jars",
        feeds="LakeCatalog.metastore_jars",
    ),
    Variable(
        "MEDALLION_METASTORE_URIS",
        "A Hive metastore service, instead of MEDALLION_METASTORE_URL.",
        "thrift://host:port[,thrift://host:port]",
        "none",
        setting="metastore_uris",
        feeds="LakeCatalog.metastore_uris",
    ),
    Variable(
        "MEDALLION_WAREHOUSE_DIR",
        "Spark's warehouse folder (managed tables; the lake's are all external).",
        "a folder or URI",
        "<lake root>/_warehouse",
        setting="warehouse_dir",
        feeds="LakeCatalog.warehouse_dir",
    ),
    Variable(
        "MEDALLION_ARROW_READ_MAX_ROWS",
        "Table checks hold a version of up to this many rows as Arrow, "
        "without Spark (larger ones are counted by DataFusion over delta-rs' read). 0: always Spark.",
        "a whole number of rows, 0 or more",
        "1000000",
        setting="arrow_read_max_rows",
        feeds="DeltaIOManager.arrow_read_max_rows",
    ),
    Variable(
        "MEDALLION_ARROW_WRITE_MAX_ROWS",
        "Overwrites, appends and MERGE sources of up to this many rows are "
        "committed by deltalake in the Dagster process instead of by Spark's jobs. 0: always Spark.",
        "a whole number of rows, 0 or more",
        "250000",
        setting="arrow_write_max_rows",
        feeds="DeltaIOManager.arrow_write_max_rows",
    ),
    Variable(
        "MEDALLION_ARROW_MERGE_MAX_TABLE_MB",
        "Such a small MERGE is run by deltalake only into a table of up "
        "to this many MiB of files: it rewrites them in the Dagster process, which grows with them. Larger "
        "tables are merged by Spark. 0: always Spark.",
        "a whole number of MiB, 0 or more",
        "1024",
        setting="arrow_merge_max_table_mb",
        feeds="DeltaIOManager.arrow_merge_max_table_mb",
    ),
    Variable(
        "MEDALLION_KAFKA_BOOTSTRAP_SERVERS",
        "The Kafka broker; unset leaves the Kafka feeds out of the definitions.",
        "host:port[,host:port]",
        "unset: no Kafka feeds",
        setting="kafka_bootstrap_servers",
        feeds="KafkaResource.bootstrap_servers",
    ),
    Variable(
        "MEDALLION_KAFKA_TOPIC",
        "The topic to read instead of the one the Kafka feed declares.",
        "a Kafka topic name (letters, digits, . _ -; at most 249)",
        "the feed's",
        setting="kafka_topic",
        feeds="KafkaResource.topic",
    ),
    Variable(
        "MEDALLION_KAFKA_SECURITY_PROTOCOL",
        "Kafka security.protocol.",
        "PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL",
        "PLAINTEXT",
        setting="kafka_security_protocol",
        feeds="KafkaResource.security_protocol",
    ),
    Variable(
        "MEDALLION_KAFKA_SASL_MECHANISM",
        "SASL mechanism, with SASL_PLAINTEXT or SASL_SSL.",
        "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512",
        "none",
        setting="kafka_sasl_mechanism",
        feeds="KafkaResource.sasl_mechanism",
    ),
    Variable(
        "MEDALLION_KAFKA_SASL_USERNAME",
        "SASL user name.",
        "any text",
        "none",
        feeds="KafkaResource.sasl_username",
        credential=True,
    ),
    Variable(
        "MEDALLION_KAFKA_SASL_PASSWORD",
        "SASL password (never logged or shown).",
        "any text",
        "none",
        feeds="KafkaResource.sasl_password",
        credential=True,
    ),
    Variable(
        "MEDALLION_KAFKA_SSL_CA_LOCATION",
        "The PEM file of the certificates that signed the broker's, with "
        "SSL or SASL_SSL: Spark's Kafka client trusts it as a PEM truststore, the Python client (lag, "
        "publishing) as ssl.ca.location.",
        "a readable PEM file of certificates",
        "none: the JVM's and the system's default trust",
        setting="kafka_ssl_ca_location",
        feeds="KafkaResource.ssl_ca_location",
    ),
    Variable(
        "MEDALLION_KAFKA_STARTING_OFFSETS",
        "Where a new Kafka checkpoint starts.",
        "earliest, latest, or Spark's per-partition JSON",
        "earliest",
        setting="kafka_starting_offsets",
        feeds="KafkaResource.starting_offsets",
    ),
)

#: The IO manager's size limits: whole numbers, each in this unit (``resources.IO_MANAGER_VARIABLES`` maps them).
SIZE_LIMITS = {
    "MEDALLION_ARROW_READ_MAX_ROWS": "rows",
    "MEDALLION_ARROW_WRITE_MAX_ROWS": "rows",
    "MEDALLION_ARROW_MERGE_MAX_TABLE_MB": "MiB",
}
_WHOLE_NUMBER = re.compile(r"^\s*\d+\s*$")

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: The project's own pipelines (TPC-H, the demo), read unless ``MEDALLION_DEMO=off``.
PROJECT_PIPELINES = "medallion_assets.pipelines"

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_SPELLINGS = ("true/false", "yes/no", "on/off", "1/0")
_SPARK_MASTER = re.compile(
    r"^(spark://[^/,:]+:\d+(,[^/,:]+:\d+)*|k8s://\S+|mesos://\S+|yarn|local(\[(\*|\d+)(,\d+)?\])?)$"
)
_SPARK_REMOTE = re.compile(r"^sc://[^/:;\s]+(:\d+)?/?(;\S*)?$")
_KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


@dataclass(frozen=True)
class LakeRoot:
    """The lake's root: a local folder (relative: to the working directory) or an object-store URI.

    Attributes:
        location: the folder or URI, as configured.
        variable: the environment variable it came from (``MEDALLION_LAKE_ROOT``), named in
            errors; ``None`` for the default, or a root given directly.
    """

    location: str = DEFAULT_LAKE_ROOT
    variable: str | None = None

    def problem(self) -> str | None:
        """Why the root cannot be written, naming where it came from (:func:`lake_root_problem`); ``None`` if it can."""
        return lake_root_problem(self.location, variable=self.variable)


@dataclass(frozen=True)
class Settings:
    """The environment's settings, checked and typed: what every resource and command takes its values from.

    Each field holds the value of the :data:`VARIABLES` row whose ``setting`` names it;
    ``None`` is an unset variable (the resource's default applies). Credentials are not
    held, only whether they are set (:attr:`credentials`).

    Attributes:
        deployment: where Spark runs.
        delta_engine: the Delta engine asked for.
        delta_spark_jars: ``DELTA_SPARK_JARS`` as given.
        delta_spark_maven: ``True`` fetch, ``False`` never, ``None`` probe Maven.
        kafka_connector_jars: ``KAFKA_SPARK_JARS`` as given.
        kafka_maven: fetch Spark's Kafka connector from Maven.
        lake_root: the lake's root, and whether ``MEDALLION_LAKE_ROOT`` set it.
        simulator: include the demo feed.
        pipelines: the packages ``MEDALLION_PIPELINES`` names.
        demo: include the project's own pipelines (:data:`PROJECT_PIPELINES`, TPC-H).
        catalog: where the lake's tables are registered by name.
        catalog_database_prefix, metastore_url, metastore_driver, metastore_jars,
            metastore_uris, warehouse_dir: the catalog's ``MEDALLION_*`` variables as given.
        arrow_read_max_rows, arrow_write_max_rows, arrow_merge_max_table_mb: the IO manager's size limits.
        kafka_bootstrap_servers, kafka_topic, kafka_security_protocol, kafka_sasl_mechanism,
            kafka_ssl_ca_location, kafka_starting_offsets: the Kafka source's
            ``MEDALLION_KAFKA_*`` variables as given.
        credentials: the names of the credential variables that are set (:attr:`Variable.credential`).
    """

    deployment: Deployment = "local"
    delta_engine: EngineSetting = "auto"
    delta_spark_jars: str | None = None
    delta_spark_maven: bool | None = None
    kafka_connector_jars: str | None = None
    kafka_maven: bool = False
    lake_root: LakeRoot = field(default_factory=LakeRoot)
    simulator: bool = True
    pipelines: tuple[str, ...] = ()
    demo: bool = True
    catalog: CatalogKind = "session"
    catalog_database_prefix: str | None = None
    metastore_url: str | None = None
    metastore_driver: str | None = None
    metastore_jars: str | None = None
    metastore_uris: str | None = None
    warehouse_dir: str | None = None
    arrow_read_max_rows: int | None = None
    arrow_write_max_rows: int | None = None
    arrow_merge_max_table_mb: int | None = None
    kafka_bootstrap_servers: str | None = None
    kafka_topic: str | None = None
    kafka_security_protocol: str | None = None
    kafka_sasl_mechanism: str | None = None
    kafka_ssl_ca_location: str | None = None
    kafka_starting_offsets: str | None = None
    credentials: frozenset[str] = frozenset()

    @property
    def kafka(self) -> bool:
        """A Kafka broker is configured: the Kafka feeds are in the definitions."""
        return self.kafka_bootstrap_servers is not None

    @property
    def pipeline_packages(self) -> tuple[str, ...]:
        """The packages whose modules declare the deployment's feeds and assets (:func:`pipeline_packages`)."""
        return ((PROJECT_PIPELINES,) if self.demo else ()) + tuple(p for p in self.pipelines if p != PROJECT_PIPELINES)

    def fields_of(self, resource: str) -> dict[str, Any]:
        """The fields of ``resource`` (``KafkaResource``) set by non-credential variables: field -> value."""
        fed: dict[str, Any] = {}  # each field its own type
        for variable in VARIABLES:
            if variable.setting and variable.feeds and variable.feeds.split(".")[0] == resource:
                value = getattr(self, variable.setting)
                if value is not None:
                    fed[variable.feeds.split(".", 1)[1]] = value
        return fed


def variables_feeding(resource: str) -> dict[str, str]:
    """The variables that configure ``resource`` (``KafkaResource``), credentials too: variable -> field."""
    return {
        variable.name: variable.feeds.split(".", 1)[1]
        for variable in VARIABLES
        if variable.feeds and variable.feeds.split(".")[0] == resource
    }


def switch(
    name: str,
    environ: Mapping[str, str] | None = None,
    *,
    unset: bool | None,
    meaning: str = "true or false",
    unset_means: str | None = None,
) -> bool | None:
    """The boolean an environment variable spells, ``unset`` when it is not set (or blank).

    Args:
        name: the variable.
        environ: the environment (default: the process's).
        unset: the value of an unset variable.
        meaning: the allowed values in words, for the error (e.g. ``on or off``).
        unset_means: what an unset variable does, for the error (default: ``unset``'s value).

    Raises:
        SettingsError: any other spelling (``ture``): never read silently as false.

    Example:
        >>> switch("X", {"X": "Yes"}, unset=False)
        True
    """
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return unset
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    default = unset_means or ("for true" if unset else "for false")
    also = ", ".join(pair for pair in _SPELLINGS if pair.split("/")[0] not in meaning.split())
    raise SettingsError(f"{name}={raw!r} is not a switch: use {meaning} (also {also}), or unset it {default}")


def lake_root_problem(root: str, *, variable: str | None) -> str | None:
    """Why the lake root cannot be written, in one line naming where it came from; ``None`` if it can.

    Looks only (``os.access``, ``stat``): creates nothing. A missing root is fine
    when its nearest existing parent is a writable folder (the writers create it).
    An object-store URI (``s3://...``) is not probed: its credentials and
    permissions are the store's, and asking would be a network call.

    Args:
        root: the lake root as configured.
        variable: the environment variable it came from (``MEDALLION_LAKE_ROOT``), or
            ``None`` for the default root.
    """
    if "://" in root:
        return None
    named = (
        f"{variable}={root!r}" if variable else f"the lake root {root!r} (the default: MEDALLION_LAKE_ROOT is not set)"
    )
    fix = f"set {variable or 'MEDALLION_LAKE_ROOT'} to a folder this user can write"
    path = Path(root).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            return f"{named} is a file, not a folder ({path}): {fix}"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{named} is not writable ({path}: {_why_not_writable(path)}): {fix}, or make it writable"
        return None
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{named} cannot be created ({path}): {parent} is a file, not a folder: {fix}"
    if not os.access(parent, os.W_OK | os.X_OK):
        return (
            f"{named} does not exist and cannot be created ({path}): {parent} is not writable "
            f"({_why_not_writable(parent)}): {fix}, or create it"
        )
    return None


def _why_not_writable(path: Path) -> str:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except (OSError, AttributeError):
        pass
    return "permission denied"


def read_settings(environ: Mapping[str, str] | None = None, *, overrides: Mapping[str, str] | None = None) -> Settings:
    """Every setting of the environment, checked: all wrong values reported together.

    The one place the project reads its variables: the definitions, the resources
    (:mod:`medallion_assets.resources`) and the commands take their values from the result.

    Args:
        environ: the environment (default: the process's).
        overrides: variables that take the place of the environment's, checked as they are
            (a command's option, such as ``medallion-assets check``'s lake).

    Raises:
        SettingsError: one line per wrong variable, naming it, its value, what it may be and the fix.
    """
    env: Mapping[str, str] = {**(os.environ if environ is None else environ), **(overrides or {})}
    problems: list[str] = []

    def choice(name: str, allowed: tuple[str, ...], default: str, what: str) -> str:
        raw = env.get(name)
        if raw is None or raw == "":
            return default
        if raw not in allowed:
            problems.append(
                f"{name}={raw!r} is not {what}: use {one_of(allowed)}"
                + (f" (or unset it for {default})" if default else "")
            )
        return raw

    def boolean(
        name: str, *, unset: bool | None, meaning: str = "true or false", unset_means: str | None = None
    ) -> bool | None:
        try:
            return switch(name, env, unset=unset, meaning=meaning, unset_means=unset_means)
        except SettingsError as error:
            problems.append(str(error))
            return unset

    deployment = choice("MEDALLION_DEPLOYMENT", DEPLOYMENTS, "local", "a deployment")
    engine = choice("MEDALLION_DELTA_ENGINE", DELTA_ENGINES, "auto", "a Delta engine")
    maven = boolean(
        "MEDALLION_DELTA_SPARK_MAVEN",
        unset=None,
        meaning="true (fetch delta-spark from Maven without probing) or false (never)",
        unset_means="to probe Maven under auto",
    )
    kafka_maven = boolean("MEDALLION_KAFKA_MAVEN", unset=False)
    demo = boolean("MEDALLION_DEMO", unset=True, meaning="on or off", unset_means="for on")
    # The simulator lands TPC-H's files: without the demo's feeds nothing would read them.
    simulator = boolean(
        "MEDALLION_SIMULATOR",
        unset=demo,
        meaning="on or off",
        unset_means="for on" if demo is not False else "for off (MEDALLION_DEMO=off)",
    )
    if simulator and not demo and env.get("MEDALLION_SIMULATOR", "").strip():
        problems.append(
            f"MEDALLION_SIMULATOR={env['MEDALLION_SIMULATOR']!r} lands TPC-H's demo files, and "
            "MEDALLION_DEMO=off leaves out the feeds that read them: unset MEDALLION_SIMULATOR, or "
            "unset MEDALLION_DEMO"
        )

    if deployment == "cluster":
        _check_endpoint(
            env,
            problems,
            "SPARK_MASTER_URL",
            _SPARK_MASTER,
            deployment,
            "the cluster's master: spark://host:7077, k8s://https://host:443, yarn or mesos://host:5050",
        )
    if deployment == "connect":
        _check_endpoint(
            env, problems, "SPARK_REMOTE", _SPARK_REMOTE, deployment, "a Spark Connect endpoint: sc://host:15002"
        )

    for name, holds in (
        ("DELTA_SPARK_JARS", "delta-spark, delta-storage, delta-kernel-*, unitycatalog-*"),
        ("KAFKA_SPARK_JARS", "spark-sql-kafka-0-10, spark-token-provider-kafka-0-10, kafka-clients, commons-pool2"),
    ):
        if env.get(name, "").strip():
            problem = jar_location_problem(name, env[name], holds=holds)
            if problem:
                problems.append(problem)

    lake_root = LakeRoot()
    root = env.get("MEDALLION_LAKE_ROOT")
    if root is not None and root != "":
        if not root.strip():
            problems.append(
                f"MEDALLION_LAKE_ROOT={root!r} is blank: set it to the lake's folder or URI, or unset it "
                f"for {DEFAULT_LAKE_ROOT}"
            )
        else:
            lake_root = LakeRoot(root, "MEDALLION_LAKE_ROOT")
            problem = lake_root.problem()
            if problem:
                problems.append(problem)

    pipelines = _named_pipelines(env)
    if demo is False and not pipelines:
        problems.append(
            f"MEDALLION_DEMO={env['MEDALLION_DEMO']!r} leaves out the project's own pipelines, and "
            "MEDALLION_PIPELINES names none of yours: set MEDALLION_PIPELINES to your pipeline packages "
            "(e.g. my_feeds), or unset MEDALLION_DEMO"
        )
    for package in pipelines:
        problem = _package_problem(package)
        if problem:
            problems.append(f"MEDALLION_PIPELINES={env['MEDALLION_PIPELINES']!r} names {package!r}, {problem}")

    defaults = {variable.name: variable.default for variable in VARIABLES}
    limits: dict[str, int] = {}
    for name, unit in SIZE_LIMITS.items():
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        if _WHOLE_NUMBER.match(raw):
            limits[name] = int(raw)
        else:
            problems.append(
                f"{name}={raw!r} is not a whole number of {unit}: use 0 or more (0: always Spark), "
                f"or unset it for {defaults[name]}"
            )

    catalog = choice("MEDALLION_CATALOG", CATALOGS, "session", "a catalog")
    problems.extend(_catalog_problems(env, catalog))

    problems.extend(_kafka_problems(env))
    problems.extend(_unknown_names(env))

    if problems:
        raise SettingsError("\n".join(problems))

    def given(name: str) -> str | None:
        # Set to an empty string: unset, as the resources have always read it.
        return env.get(name) or None

    return Settings(
        deployment=cast(Deployment, deployment),
        delta_engine=cast(EngineSetting, engine),
        delta_spark_jars=given("DELTA_SPARK_JARS"),
        delta_spark_maven=maven,
        kafka_connector_jars=given("KAFKA_SPARK_JARS"),
        kafka_maven=bool(kafka_maven),
        lake_root=lake_root,
        simulator=bool(simulator),
        pipelines=pipelines,
        demo=demo is not False,
        catalog=cast(CatalogKind, catalog),
        catalog_database_prefix=given("MEDALLION_CATALOG_DATABASE_PREFIX"),
        metastore_url=given("MEDALLION_METASTORE_URL"),
        metastore_driver=given("MEDALLION_METASTORE_DRIVER"),
        metastore_jars=given("MEDALLION_METASTORE_JARS"),
        metastore_uris=given("MEDALLION_METASTORE_URIS"),
        warehouse_dir=given("MEDALLION_WAREHOUSE_DIR"),
        arrow_read_max_rows=limits.get("MEDALLION_ARROW_READ_MAX_ROWS"),
        arrow_write_max_rows=limits.get("MEDALLION_ARROW_WRITE_MAX_ROWS"),
        arrow_merge_max_table_mb=limits.get("MEDALLION_ARROW_MERGE_MAX_TABLE_MB"),
        kafka_bootstrap_servers=env.get("MEDALLION_KAFKA_BOOTSTRAP_SERVERS", "").strip() or None,
        kafka_topic=given("MEDALLION_KAFKA_TOPIC"),
        kafka_security_protocol=given("MEDALLION_KAFKA_SECURITY_PROTOCOL"),
        kafka_sasl_mechanism=given("MEDALLION_KAFKA_SASL_MECHANISM"),
        kafka_ssl_ca_location=given("MEDALLION_KAFKA_SSL_CA_LOCATION"),
        kafka_starting_offsets=given("MEDALLION_KAFKA_STARTING_OFFSETS"),
        credentials=frozenset(v.name for v in VARIABLES if v.credential and given(v.name)),
    )


def _named_pipelines(env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name.strip() for name in env.get("MEDALLION_PIPELINES", "").split(",") if name.strip()))


def pipeline_packages(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The pipeline packages of the environment: :data:`PROJECT_PIPELINES` unless ``MEDALLION_DEMO=off``,
    then those ``MEDALLION_PIPELINES`` names, each once.

    Reads only these two variables (the feeds are looked up outside a definitions load too, by
    sensors and the command line); :func:`read_settings` checks them, and everything else, at load.

    Raises:
        SettingsError: ``MEDALLION_DEMO`` is not a switch.
    """
    env = os.environ if environ is None else environ
    demo = switch("MEDALLION_DEMO", env, unset=True, meaning="on or off", unset_means="for on")
    return Settings(demo=bool(demo), pipelines=_named_pipelines(env)).pipeline_packages


#: Variables of the project's own test harness, not settings of a deployment.
_TEST_HARNESS_PREFIX = "MEDALLION_TEST_"


def _unknown_names(env: Mapping[str, str]) -> list[str]:
    # A misspelt name would otherwise be ignored without a word, and its setting silently take its default.
    known = [variable.name for variable in VARIABLES]
    problems = []
    for name in sorted(env):
        if name.startswith("MEDALLION_") and name not in known and not name.startswith(_TEST_HARNESS_PREFIX):
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            problems.append(
                f"{name} is not a setting of this project: {hint}rename or unset it "
                "(docs/settings.md lists the settings)"
            )
    return problems


def jar_location_problem(name: str, value: str, *, holds: str) -> str | None:
    """Why a jars variable's value is unusable; ``None`` if it is fine.

    The value is a folder of jars, or a comma list of jar files.
    """
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if len(entries) == 1 and os.path.isdir(entries[0]):
        if not any(entry.endswith(".jar") for entry in os.listdir(entries[0])):
            return (
                f"{name}={value!r} is a folder that holds no .jar file: put the jars there ({holds}), or unset {name}"
            )
        return None
    missing = [entry for entry in entries if not os.path.isfile(entry)]
    if missing:
        return (
            f"{name}={value!r} names what is neither a folder of jars nor a jar file ({', '.join(missing)}): "
            f"give the folder of the jars ({holds}) or a comma list of .jar files, or unset {name}"
        )
    return None


def _check_endpoint(
    env: Mapping[str, str], problems: list[str], name: str, pattern: re.Pattern, deployment: str, what: str
) -> None:
    value = env.get(name, "")
    if not value.strip():
        problems.append(
            f"{name} is not set, and MEDALLION_DEPLOYMENT={deployment} needs it: set it to {what}, "
            "or use MEDALLION_DEPLOYMENT=local"
        )
    elif not pattern.match(value):
        problems.append(f"{name}={value!r} is not {what.split(':')[0]}: use {what.split(': ', 1)[1]}")


def _package_problem(package: str) -> str | None:
    if not all(part.isidentifier() for part in package.split(".")):
        return "which is not a Python package name: give a comma list of packages (e.g. my_feeds,team.pipelines)"
    try:
        found = importlib.util.find_spec(package)
    except (ImportError, ValueError) as error:
        found, reason = None, f" ({error})"
    else:
        reason = ""
    if found is None:
        return f"which cannot be imported{reason}: install it or put its folder on PYTHONPATH"
    return None


def _catalog_problems(env: Mapping[str, str], catalog: str) -> list[str]:
    problems = []
    prefix = env.get("MEDALLION_CATALOG_DATABASE_PREFIX", "")
    if prefix and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", prefix):
        problems.append(
            f"MEDALLION_CATALOG_DATABASE_PREFIX={prefix!r} cannot start a database name: use letters, "
            "digits and _ (e.g. team_), or unset it"
        )
    url, uris = env.get("MEDALLION_METASTORE_URL", ""), env.get("MEDALLION_METASTORE_URIS", "")
    if catalog == "hive" and not url.strip() and not uris.strip():
        problems.append(
            "MEDALLION_CATALOG=hive needs its metastore: set MEDALLION_METASTORE_URL to the JDBC URL of "
            "its database (jdbc:postgresql://host:5432/metastore) or MEDALLION_METASTORE_URIS to a "
            "metastore service (thrift://host:9083), or use MEDALLION_CATALOG=session"
        )
    if url and not url.startswith("jdbc:"):
        problems.append(f"MEDALLION_METASTORE_URL={url!r} is not a JDBC URL: use jdbc:postgresql://host:5432/metastore")
    if uris and not all(re.match(r"^thrift://[^/:,\s]+:\d+$", entry.strip()) for entry in uris.split(",")):
        problems.append(
            f"MEDALLION_METASTORE_URIS={uris!r} is not a list of metastore services: use "
            "thrift://host:9083[,thrift://host:9083]"
        )
    jars = env.get("MEDALLION_METASTORE_JARS", "")
    if jars.strip():
        problem = jar_location_problem("MEDALLION_METASTORE_JARS", jars, holds="the database's JDBC driver")
        if problem:
            problems.append(problem)
    if catalog != "hive":
        stray = [name for name in ("MEDALLION_METASTORE_URL", "MEDALLION_METASTORE_URIS") if env.get(name, "").strip()]
        if stray:
            problems.append(
                f"{' and '.join(stray)} {'is' if len(stray) == 1 else 'are'} set but MEDALLION_CATALOG is "
                f"{catalog}: set MEDALLION_CATALOG=hive to use the metastore, or unset {stray[0]}"
            )
    return problems


def _kafka_problems(env: Mapping[str, str]) -> list[str]:
    problems = []
    servers = env.get("MEDALLION_KAFKA_BOOTSTRAP_SERVERS", "")
    if servers.strip() and not all(_is_host_port(entry.strip()) for entry in servers.split(",")):
        problems.append(
            f"MEDALLION_KAFKA_BOOTSTRAP_SERVERS={servers!r} is not a list of brokers: use "
            "host:port[,host:port] (e.g. localhost:9092), or unset it to leave the Kafka feeds out"
        )
    topic = env.get("MEDALLION_KAFKA_TOPIC", "")
    if topic and not _KAFKA_TOPIC.match(topic):
        problems.append(
            f"MEDALLION_KAFKA_TOPIC={topic!r} is not a Kafka topic name: use letters, digits, '.', '_' "
            "and '-' (at most 249), or unset it for the topic the feed declares"
        )
    for name, allowed in (
        ("MEDALLION_KAFKA_SECURITY_PROTOCOL", SECURITY_PROTOCOLS),
        ("MEDALLION_KAFKA_SASL_MECHANISM", SASL_MECHANISMS),
    ):
        value = env.get(name, "")
        if value and value not in allowed:
            problems.append(f"{name}={value!r} is not one Kafka knows: use {one_of(allowed)} (upper case)")
    ca = env.get("MEDALLION_KAFKA_SSL_CA_LOCATION", "")
    if ca and not _is_pem_certificates(ca):
        problems.append(
            f"MEDALLION_KAFKA_SSL_CA_LOCATION={ca!r} is not a readable PEM file of certificates: point it "
            "at the CA certificate(s) of the broker's TLS listener (-----BEGIN CERTIFICATE-----), or "
            "unset it for the default trust"
        )
    offsets = env.get("MEDALLION_KAFKA_STARTING_OFFSETS", "")
    if offsets and offsets not in ("earliest", "latest") and not _is_json_object(offsets):
        problems.append(
            f"MEDALLION_KAFKA_STARTING_OFFSETS={offsets!r} is not a starting position: use earliest, "
            'latest or Spark\'s per-partition JSON ({"topic": {"0": 23}}), or unset it for earliest'
        )
    return problems


def _is_host_port(entry: str) -> bool:
    host, _, port = entry.rpartition(":")
    return bool(host.strip("[]")) and port.isdigit() and 0 < int(port) < 65536


def _is_pem_certificates(path: str) -> bool:
    try:
        with open(path, "rb") as handle:
            return b"-----BEGIN CERTIFICATE-----" in handle.read(1 << 20)
    except OSError:
        return False


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
