"""Tables by name: the lake's Delta tables registered in the Spark session's catalog.

Every table of the lake is an external Delta table at its lake path, named
``<database>.<table>`` where the database is the asset key's layer
(``bronze``, ``silver``, ``gold``, ``quarantine``), optionally prefixed
(``team_`` gives ``team_gold.pricing_summary``). The path stays the truth:
delta-rs and DuckDB read the same tables by path, and a catalog entry only
points at it.

Three kinds of catalog (:class:`LakeCatalog.kind`):

``session`` (the default)
    Spark's in-memory catalog, filled from the lake each time a session
    starts: every folder ``<root>/<layer>/<table>`` holding a Delta log is
    registered. Nothing to run, nothing to lock: Spark's embedded Hive
    metastore (Derby) allows one process at a time, so a sensor's run and a
    schedule's run at once would fail on it, where each process here has its
    own catalog, rebuilt from the lake it shares.
``hive``
    A Hive metastore shared by every Spark session of a team: a database
    (PostgreSQL, MySQL) reached by JDBC with Spark's own Hive client, or a
    metastore service (``thrift://``). Tables registered by one session are
    found by every other, by the Spark Thrift server and by Trino.
``none``
    Tables by path only.

Writers keep the entries true (:meth:`LakeCatalog.register`): the IO manager
after each write (and its tombstones table) and the bronze streams after each
run register a new table. On delta-spark an entry is created once and then
kept: one whose location moved is re-pointed in place (``ALTER TABLE ... SET
LOCATION``), so its id, comment and properties stay, and a change of columns
needs nothing (delta-spark reads a table's columns from its log). On the
delta-rs engine, whose session-catalog entries hold no properties, an entry
whose location or columns changed is registered again (a Python data source's
columns are the ones the catalog stored). Each entry created or changed is
logged once, in the run's log.

The metastore password is never a Spark setting: those reach the driver's
command line (pyspark hands them to ``spark-submit`` as ``--conf``). It is set
on the JVM's Hadoop configuration once the JVM runs and before the session's
Hive client is built (:meth:`LakeCatalog.hadoop_secrets`), where Hive's
metastore client reads it, and Spark's UI and event logs redact it by name.

Spark 4.2 hands a Python data source the options of a table read by name only
when the table is created, not when it is read: the delta-rs engine keeps the
location in the catalog's copy of the schema (metadata of the first column,
:data:`LOCATION_METADATA`), where its reader finds it.

Nothing here runs at import.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from dagster import Config, get_dagster_logger
from pydantic import Field, field_validator
from pyspark.sql import types as T

from medallion_assets.delta import LOCATION_METADATA, normalize_path, quoted, resolve_snapshot, stored_location
from medallion_assets.settings import refuse_unknown
from medallion_assets.storage.session import jar_files

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from medallion_assets.storage.engines import DeltaEngine

# A Dagster logger: what it says inside a step goes to the run's log.
log = get_dagster_logger("medallion_assets.catalog")

CATALOG_KINDS = ("session", "hive", "none")
#: The default warehouse folder under the lake root (the lake's attach skips it: it holds no table).
WAREHOUSE_FOLDER = "_warehouse"
#: The metastore database's password, a Hadoop/Hive setting (never a Spark one: see hadoop_secrets).
METASTORE_PASSWORD_KEY = "javax.jdo.option.ConnectionPassword"
#: Tables a starting session registers at once.
ATTACH_THREADS = 4
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: The per-session registry's mark that a lake was attached (names in use), before its prefix and root.
_LAKE_ATTACHED = "__lake_attached__"


class CatalogError(RuntimeError):
    """A table cannot be registered or found by name (the message names the table and the fix)."""


class LakeCatalog(Config):
    """Where the lake's tables are registered by name: the session's catalog, a shared Hive metastore, or nowhere.

    Example:
        >>> LakeCatalog(kind="hive", metastore_url="jdbc:postgresql://db:5432/metastore",
        ...             metastore_user="hive").spark_config()["spark.sql.catalogImplementation"]
        'hive'
    """

    kind: str = Field(
        default="session",
        description="session (each Spark session registers the lake's tables in its in-memory catalog), hive "
        "(a shared Hive metastore: metastore_url or metastore_uris) or none (tables by path only).",
    )
    lake_root: str | None = Field(
        default=None,
        description="The lake whose tables the Spark resource registers (kind session: when its spark_session is "
        "first asked for; hive: when it starts a session), and under which a hive catalog's default warehouse "
        "folder lies. Unset: a session registers only what it writes.",
    )
    database_prefix: str = Field(
        default="",
        description="Prefix of the layer databases: 'team_' names gold's tables team_gold.<table>.",
    )
    metastore_url: str | None = Field(
        default=None,
        description="JDBC URL of the Hive metastore's database (kind hive), e.g. jdbc:postgresql://host:5432/metastore.",
    )
    metastore_user: str | None = Field(default=None, description="User of the metastore database.")
    metastore_password: str | None = Field(
        default=None, description="Password of the metastore database (read through EnvVar; never logged)."
    )
    metastore_driver: str = Field(
        default="org.postgresql.Driver",
        description="JDBC driver class of the metastore database (com.mysql.cj.jdbc.Driver for MySQL).",
    )
    metastore_jars: str | None = Field(
        default=None,
        description="The JDBC driver's jar(s): a jar file, a folder of jars or a comma list (Debian's "
        "libpostgresql-jdbc-java installs /usr/share/java/postgresql.jar).",
    )
    metastore_uris: str | None = Field(
        default=None,
        description="A Hive metastore service to use instead of a JDBC database (kind hive), e.g. thrift://host:9083.",
    )
    warehouse_dir: str | None = Field(
        default=None,
        description="Spark's warehouse folder: the databases' own folders and managed tables (the lake's tables "
        "are all external). Default: <lake_root>/_warehouse; with neither set, Spark's ./spark-warehouse.",
    )

    @field_validator("kind", mode="before")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        return refuse_unknown(
            value, CATALOG_KINDS, field="LakeCatalog.kind", what="a catalog", variable="MEDALLION_CATALOG"
        )

    @field_validator("database_prefix", mode="before")
    @classmethod
    def _database_prefix(cls, value: str) -> str:
        if type(value) is str and value and not _NAME.match(value):
            raise ValueError(
                f"LakeCatalog.database_prefix={value!r} cannot start a database name: use letters, "
                "digits and _ (MEDALLION_CATALOG_DATABASE_PREFIX sets it in the deployed definitions)"
            )
        return value

    # ------------------------------------------------------------ names

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def database(self, layer: str) -> str:
        """The database of a layer: ``gold`` or, with a prefix, ``<prefix>gold``."""
        return f"{self.database_prefix}{layer}"

    def table_name(self, key: Sequence[str]) -> str:
        """The name of an asset key's table: ``silver.orders`` for ``["silver", "orders"]``."""
        layer, table = _layer_and_table(key)
        return f"{self.database(layer)}.{table}"

    def qualified_name(self, key: Sequence[str]) -> str:
        """The fully qualified name, catalog first: ``spark_catalog.silver.orders``."""
        return f"spark_catalog.{self.table_name(key)}"

    # ------------------------------------------------------------ session

    def spark_config(self) -> dict[str, str]:
        """The Spark settings of this catalog, applied when the session is built: never the password
        (:meth:`hadoop_secrets`).

        The warehouse folder is set for the session catalog too: its databases
        get folders there, which Spark would otherwise make in the working
        directory (``./spark-warehouse`` in the project a user runs
        ``dagster dev`` from).

        Raises:
            CatalogError: kind hive without metastore_url or metastore_uris.
        """
        if self.kind == "none":
            return {}
        if self.kind == "hive" and not self.metastore_url and not self.metastore_uris:
            raise CatalogError(
                "MEDALLION_CATALOG=hive needs the metastore: set MEDALLION_METASTORE_URL (a JDBC URL "
                "of its database) or MEDALLION_METASTORE_URIS (thrift://host:9083)"
            )
        config = {}
        warehouse = self.warehouse_dir or (_join(self.lake_root, WAREHOUSE_FOLDER) if self.lake_root else None)
        if warehouse:
            config["spark.sql.warehouse.dir"] = warehouse
        if self.kind != "hive":
            return config
        config["spark.sql.catalogImplementation"] = "hive"
        if self.metastore_uris:
            config["spark.hadoop.hive.metastore.uris"] = self.metastore_uris
            return config
        config.update(
            {
                "spark.hadoop.javax.jdo.option.ConnectionURL": str(self.metastore_url),
                "spark.hadoop.javax.jdo.option.ConnectionDriverName": self.metastore_driver,
                # The first session on an empty database creates the metastore's tables; Spark's
                # Hive 2.3 client then skips its schema-version check (no schematool needed).
                # Tables and columns, not foreign keys: DataNucleus adds a table's keys on another
                # connection while the first still holds its insert into TBLS, and on PostgreSQL
                # the two wait on each other for ever (the first CREATE TABLE hangs). A schema made
                # by Hive's schematool has them. (autoCreateAll would switch the keys back on.)
                "spark.hadoop.datanucleus.schema.autoCreateSchema": "true",
                "spark.hadoop.datanucleus.schema.autoCreateTables": "true",
                "spark.hadoop.datanucleus.schema.autoCreateColumns": "true",
                "spark.hadoop.datanucleus.schema.autoCreateConstraints": "false",
                "spark.hadoop.hive.metastore.schema.verification": "false",
            }
        )
        if self.metastore_user:
            config["spark.hadoop.javax.jdo.option.ConnectionUserName"] = self.metastore_user
        if self.metastore_jars:
            jars = jar_files(
                self.metastore_jars, variable="MEDALLION_METASTORE_JARS", holds="the database's JDBC driver"
            )
            # Hive's client loads the JDBC driver through the JVM's class path, not spark.jars.
            config["spark.driver.extraClassPath"] = os.pathsep.join(jars)
        return config

    def hadoop_secrets(self) -> dict[str, str]:
        """The secrets of this catalog, set on the JVM's Hadoop configuration after the JVM starts.

        Not Spark settings: pyspark starts the JVM with ``spark-submit --conf key=value``
        per setting, which any local user reads with ``ps``. Set on
        ``SparkContext.hadoopConfiguration`` before the session's shared state is
        built, the password reaches the Hive client that state builds, as
        ``javax.jdo.option.ConnectionPassword`` (Hive's metastore reads it through
        Hadoop's ``Configuration.getPassword``). Spark's UI and event logs redact
        Hadoop properties whose names match ``spark.redaction.regex``, which
        matches ``password`` by default.
        """
        if self.kind != "hive" or self.metastore_uris or not self.metastore_password:
            return {}
        return {METASTORE_PASSWORD_KEY: str(self.metastore_password)}

    def attach(self, spark: SparkSession, engine: DeltaEngine, tables: Iterable[tuple[str, str, str]]) -> list[str]:
        """Register, in a session that just started, the lake's tables its catalog lacks.

        Kind ``session``: every table given. Kind ``hive``: those the shared
        metastore does not list yet (a table written without Spark, by a pandas
        asset, is registered by the next session).

        Args:
            spark: the session.
            engine: its Delta engine.
            tables: ``(layer, table, path)`` of each Delta table of the lake
                (:meth:`medallion_assets.resources.LakeResource.delta_tables`).

        Returns:
            The names registered.
        """
        if not self.enabled:
            return []
        started = time.monotonic()
        missing, known = [], {}
        # Dagster builds a run's resources more than once, on one session: what this session
        # registered already is known without listing the catalog again.
        registered_here = _registered(spark)
        for layer, table, path in tables:
            if not (_NAME.match(layer) and _NAME.match(table)):
                continue
            if registered_here.get(self.table_name([layer, table]), ("",))[0] == _location_uri(path):
                continue
            if layer not in known:
                known[layer] = _tables_of(spark, self.database(layer))
            if table.lower() not in known[layer]:
                missing.append(([layer, table], path))
        # delta-spark reads each table's log to register it (a small Spark job): a few at
        # once keep both the driver and the executors busy instead of waiting in turn.
        with ThreadPoolExecutor(max_workers=ATTACH_THREADS) as pool:
            registered = list(pool.map(lambda entry: self.register(spark, engine, *entry), missing))
        # From now on the session uses names: what is written next is registered as it is written.
        _registered(spark)[self._attached_mark()] = True
        if registered:
            log.info(
                "catalog: registered %d tables in the %s catalog in %.1f s",
                len(registered),
                self.kind,
                time.monotonic() - started,
            )
        return registered

    def register_written(self, spark: SparkSession, engine: DeltaEngine, key: Sequence[str], path: str) -> str:
        """After a write: register the table where its name may be asked for now; returns its name either way.

        A shared metastore, and a session catalog without ``lake_root`` (it knows only what it
        writes), register at once (:meth:`register`). A session catalog over ``lake_root``
        registers once the session has attached the lake (:meth:`attach`, when something asks
        for names): before that the in-memory catalog is read by nobody, and each entry costs a
        catalog round trip (a Python worker's schema on the delta-rs engine), so a run working by
        path registers nothing, and the first request for names registers the whole lake, what
        the run wrote included.
        """
        if self.kind == "session" and self.lake_root and not _names_in_use(spark, self._attached_mark()):
            return self.table_name(key)
        return self.register(spark, engine, key, path)

    def _attached_mark(self) -> str:
        # Per lake and prefix: one session may serve several catalogs (tests, notebooks).
        return f"{_LAKE_ATTACHED}:{self.database_prefix}:{self.lake_root}"

    def register(self, spark: SparkSession, engine: DeltaEngine, key: Sequence[str], path: str) -> str:
        """Keep ``key``'s catalog entry true to the Delta table at ``path``; returns the table's name.

        Creates the database and the entry when missing. An existing entry is
        kept: on delta-spark one that points elsewhere is re-pointed in place
        (``ALTER TABLE ... SET LOCATION``), keeping its id, comment and
        properties; on the delta-rs engine an entry that points elsewhere or
        whose columns are not the table's is registered again (Spark keeps no
        properties on such an entry). Logs, once per table and process, an entry
        created or changed. A race with another session creating the same entry
        is won by either (the entry is the same).

        Raises:
            CatalogError: the catalog refused the entry (message names the table, the path and the fix).
        """
        name = self.table_name(key)
        if self.kind == "hive" and engine.name == "delta-rs":
            _say_once(
                f"catalog: the delta-rs engine does not register tables in a shared Hive metastore "
                f"({name} and the rest stay as they are): Spark 4.2 keeps no location for a Python "
                "data source's table, so its entry would mislead delta-spark readers; run delta-spark to "
                "register them"
            )
            return name
        database = name.split(".", 1)[0]
        location = _location_uri(path)
        # delta-spark reads a table's columns from its log at query time; only delta-rs entries hold them.
        columns = _delta_rs_schema(path) if engine.name == "delta-rs" else None
        state = (location, engine.name, columns.json() if columns is not None else "")
        known = _registered(spark)
        if known.get(name) == state:
            return name
        try:
            if database not in known.get("__databases__", ()):
                spark.sql(f"CREATE DATABASE IF NOT EXISTS `{database}`")
                known.setdefault("__databases__", set()).add(database)
            stored = _entry_location(spark, name)
            if stored is None:
                _create(spark, name, location)
                log.info(f"catalog: registered {name} at {location}")
            elif columns is not None:
                if not same_location(stored, location) or not _columns_match(spark, name, columns):
                    spark.sql(f"DROP TABLE IF EXISTS {quoted(name)}")  # external: the data stays
                    _create(spark, name, location)
                    log.info(f"catalog: registered {name} again at {location} (its location or columns changed)")
            elif not same_location(stored, location):
                _set_location(spark, name, location)
                log.info(f"catalog: updated {name}: its location moved from {stored} to {location}")
        except Exception as error:
            raise CatalogError(
                f"table {name} (Delta table {path}) could not be registered in the {self.kind} catalog: "
                f"{str(error).splitlines()[0]} — check MEDALLION_CATALOG and the metastore settings, or set "
                "MEDALLION_CATALOG=none to use tables by path only"
            ) from error
        known[name] = state
        return name


# ---------------------------------------------------------------- helpers


_said: set[str] = set()


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        log.warning(line)


def _layer_and_table(key: Sequence[str]) -> tuple[str, str]:
    parts = list(key)
    if len(parts) != 2 or not all(_NAME.match(part) for part in parts):
        raise CatalogError(
            f"asset key {parts} has no table name: lake tables are [layer, table] of letters, digits and _"
        )
    return parts[0], parts[1]


def _join(root: str, *parts: str) -> str:
    if "://" in root:
        return "/".join([root.rstrip("/"), *parts])
    return os.path.join(os.path.abspath(os.path.expanduser(root)), *parts)


def _location_uri(path: str) -> str:
    """A location as Spark's catalog stores it (``file:/abs/path`` for a local folder)."""
    if "://" in path:
        return path.rstrip("/")
    if path.startswith("file:"):
        return "file:" + _local_path(path)
    return "file:" + os.path.abspath(path)


def _local_path(location: str) -> str:
    # file:/a, file:///a and file://localhost/a are one folder; the catalog stores the path URI-encoded.
    parsed = urlparse(location)
    return os.path.normpath(unquote(parsed.path)) if parsed.path else ""


def same_location(a: str, b: str) -> bool:
    """Whether two locations, as given or as a catalog stores them, name one folder.

    ``/lake/gold/x``, ``file:/lake/gold/x``, ``file:///lake/gold/x/`` and
    ``file:/lake/gold%20x`` against ``/lake/gold x`` are each the same; URIs of
    other schemes compare without a trailing slash.
    """

    def normal(location: str) -> str:
        if "://" not in location and not location.startswith("file:"):
            return os.path.normpath(os.path.abspath(location))
        if location.startswith("file:"):
            return _local_path(location)
        return location.rstrip("/")

    return normal(a) == normal(b)


def _registered(spark: SparkSession) -> dict[str, Any]:
    # What this process registered, per session: each write then costs a dict look-up,
    # not a catalog round trip, unless the table moved or (delta-rs) its columns changed.
    cache = getattr(spark, "_medallion_catalog", None)
    if cache is None:
        cache = {}
        try:
            spark._medallion_catalog = cache  # type: ignore[attr-defined]
        except AttributeError:
            return cache
    return cache


def _names_in_use(spark: SparkSession, mark: str) -> bool:
    """Whether the session attached the lake ``mark`` names (a session that keeps no registry counts as using names)."""
    registry = _registered(spark)
    if getattr(spark, "_medallion_catalog", None) is not registry:
        return True
    return bool(registry.get(mark))


def _delta_rs_schema(path: str):
    # Straight from the log with delta-rs: the engine's own schema() plans a Spark read (a Python worker).

    return resolve_snapshot(normalize_path(path)).schema


def _tables_of(spark: SparkSession, database: str) -> set[str]:
    try:
        return {row.name.lower() for row in spark.catalog.listTables(database)}
    except Exception:  # the database does not exist yet
        return set()


def _entry_location(spark: SparkSession, name: str) -> str | None:
    """The location the catalog's entry of ``name`` points at, as stored, or ``None`` without an entry."""
    if not spark.catalog.tableExists(name):
        return None
    return stored_location(spark, name)


def _set_location(spark: SparkSession, name: str, location: str) -> None:
    """Re-point a delta-spark entry in place: its id, comment and properties stay."""
    escaped = location.replace("\\", "\\\\").replace("'", "\\'")
    # delta-spark refuses a new location whose columns differ from the old one's unless told the
    # schema check is not wanted: the entry's columns are read from the new log anyway.
    bypass = "spark.databricks.delta.alterLocation.bypassSchemaCheck"
    before = spark.conf.get(bypass, None)
    spark.conf.set(bypass, "true")
    try:
        spark.sql(f"ALTER TABLE {quoted(name)} SET LOCATION '{escaped}'")
    finally:
        if before is None:
            spark.conf.unset(bypass)
        else:
            spark.conf.set(bypass, before)


def _columns_match(spark: SparkSession, name: str, columns) -> bool:
    """Whether a delta-rs entry holds ``columns`` (names, types, nullability) and its location mark."""
    fields = spark.table(name).schema.fields
    if not fields or LOCATION_METADATA not in (fields[0].metadata or {}):
        return False

    def plain(of) -> T.StructType:
        return T.StructType([T.StructField(f.name, f.dataType, f.nullable) for f in of])

    return plain(fields) == plain(columns.fields)


def _create(spark: SparkSession, name: str, location: str) -> None:
    escaped = location.replace("\\", "\\\\").replace("'", "\\'")
    try:
        spark.sql(f"CREATE TABLE IF NOT EXISTS {quoted(name)} USING delta LOCATION '{escaped}'")
    except Exception as error:
        # Another session created it between our look and our create: the entry is the same.
        if "TABLE_OR_VIEW_ALREADY_EXISTS" not in str(error) and "AlreadyExists" not in str(error):
            raise
