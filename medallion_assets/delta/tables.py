"""``DeltaTable``: delta-spark's table API for PySpark, on delta-rs.

The class mirrors ``delta.tables.DeltaTable`` from delta-spark: the table
builder (``create``/``createIfNotExists``/``createOrReplace``/``replace``),
``forPath``, ``toDF``, ``history``, ``detail``, ``merge``, ``update``,
``delete``, ``optimize``, ``vacuum`` and ``restoreToVersion``. Table
maintenance and DML run in delta-rs **on the driver** (there is no JVM Delta
here); reads go through Spark.

Example:
    >>> from medallion_assets.delta import DeltaTable
    >>> dt = DeltaTable.forPath(spark, "/lake/silver/customers")  # doctest: +SKIP
    >>> (dt.alias("t").merge(updates.alias("s"), "t.id = s.id")
    ...    .whenMatchedUpdateAll("s.seq > t.seq")
    ...    .whenNotMatchedInsertAll()
    ...    .execute())  # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import deltalake
import pyarrow as pa
from deltalake import convert_to_deltalake
from deltalake.exceptions import DeltaError as _RsDeltaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from medallion_assets.delta._catalog import table_location
from medallion_assets.delta._cdf import read_change_feed_batches
from medallion_assets.delta._engine import PredicateError, check_predicate
from medallion_assets.delta._merge import DeltaMergeBuilder
from medallion_assets.delta._read import read_delta
from medallion_assets.delta._schema import delta_to_spark_schema, spark_to_arrow_schema, spark_to_delta_schema
from medallion_assets.delta._snapshot import normalize_path, open_table, parse_timestamp
from medallion_assets.delta._sql import to_sql
from medallion_assets.delta.errors import (
    ConstraintViolationError,
    DeltaError,
    DeltaOptionError,
    NotADeltaTableError,
    translated,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["DeltaOptimizeBuilder", "DeltaTable", "DeltaTableBuilder"]

_RETENTION_CHECK_CONF = "spark.databricks.delta.retentionDurationCheck.enabled"
_DEFAULT_RETENTION_HOURS = 168.0

# delta-spark feature names -> delta-rs TableFeatures members.
_FEATURES = {
    "appendonly": "AppendOnly",
    "invariants": "Invariants",
    "checkconstraints": "CheckConstraints",
    "changedatafeed": "ChangeDataFeed",
    "generatedcolumns": "GeneratedColumns",
    "identitycolumns": "IdentityColumns",
    "columnmapping": "ColumnMapping",
    "deletionvectors": "DeletionVectors",
    "timestampntz": "TimestampWithoutTimezone",
    "v2checkpoint": "V2Checkpoint",
    "rowtracking": "RowTracking",
    "domainmetadata": "DomainMetadata",
    "icebergcompatv1": "IcebergCompatV1",
    "varianttype": "VariantType",
    "varianttype-preview": "VariantTypePreview",
}

# Features implied by legacy protocol versions (writer version -> features).
_LEGACY_WRITER_FEATURES = [
    (2, ["appendOnly", "invariants"]),
    (3, ["checkConstraints"]),
    (4, ["changeDataFeed", "generatedColumns"]),
    (5, ["columnMapping"]),
    (6, ["identityColumns"]),
]


# --------------------------------------------------------------------------- helpers


def _normalize_path(path: str) -> str:
    return normalize_path(str(path))


def _open(path: str, storage_options: dict[str, str] | None = None) -> deltalake.DeltaTable:
    """Open the latest version with delta-rs (no reader-feature check: DML may still work)."""
    return open_table(path, storage_options=storage_options, check_features=False)


def _data_type(value: T.DataType | str, column: str) -> T.DataType:
    if isinstance(value, T.DataType):
        return value
    if isinstance(value, str):
        # Only Spark's own errors mean "not a type" (or "no session here"): a lost connection to
        # the JVM must surface as itself, not as the user's mistake.
        try:
            return T._parse_datatype_string(value)
        except PySparkException:
            pass
        try:
            active = SparkSession.getActiveSession()
            if active is not None:
                return active.createDataFrame([], f"`{column}` {value}").schema[column].dataType
        except PySparkException:
            pass
        raise DeltaOptionError(
            f"column '{column}': '{value}' is not a Spark SQL type (e.g. 'bigint', 'decimal(10,2)')."
        )
    raise DeltaOptionError(f"column '{column}': dataType must be a pyspark DataType or a DDL string, got {value!r}.")


def _retention_hours(config: dict[str, str]) -> float:
    """Hours in ``delta.deletedFileRetentionDuration`` (``interval 7 days`` form)."""
    text = config.get("delta.deletedFileRetentionDuration")
    if not text:
        return _DEFAULT_RETENTION_HOURS
    units = {
        "nanosecond": 1 / 3.6e12,
        "microsecond": 1 / 3.6e9,
        "millisecond": 1 / 3.6e6,
        "second": 1 / 3600,
        "minute": 1 / 60,
        "hour": 1.0,
        "day": 24.0,
        "week": 168.0,
    }
    total = 0.0
    found = False
    for amount, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text.lower()):
        unit = unit.rstrip("s")
        if unit in units:
            total += float(amount) * units[unit]
            found = True
    return total if found else _DEFAULT_RETENTION_HOURS


def _str_map(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return {"value": str(value)}
    return {
        str(k): (v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
        for k, v in value.items()
        if v is not None
    }


def _ms_to_datetime(ms: Any) -> _dt.datetime | None:
    if ms is None:
        return None
    return _dt.datetime.fromtimestamp(int(ms) / 1000, tz=_dt.UTC)


# --------------------------------------------------------------------------- DeltaTable


class DeltaTable:
    """A Delta table at a path, with delta-spark's ``DeltaTable`` methods.

    Get one with :meth:`forPath` or the builders (:meth:`create` and friends).
    Writes through this class (merge, update, delete, optimize, vacuum,
    restore, properties, constraints) run in delta-rs on the driver; each is
    one atomic commit, so a failure commits nothing.

    Attributes:
        lastOperationMetrics: the raw delta-rs metrics dict of the last write
            made through this object (``None`` before the first).

    Example:
        >>> dt = DeltaTable.forPath(spark, "/tmp/events")  # doctest: +SKIP
        >>> dt.delete("event_date < '2020-01-01'")  # doctest: +SKIP
        >>> dt.history(1).select("operation").first()[0]  # doctest: +SKIP
        'DELETE'
    """

    def __init__(
        self,
        spark: SparkSession | None,
        path: str,
        *,
        alias: str | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self._spark = spark
        self._path = _normalize_path(path)
        self._alias = alias
        self._storage_options = storage_options
        # Shared with aliases of this table, so dt.alias("t").merge(...) reports here too.
        self._state: dict[str, Any] = {"metrics": None}

    @property
    def lastOperationMetrics(self) -> dict[str, Any] | None:
        """delta-rs' raw metrics dict of the last write made through this table or its aliases."""
        return self._state["metrics"]

    @lastOperationMetrics.setter
    def lastOperationMetrics(self, value: dict[str, Any] | None) -> None:
        self._state["metrics"] = value

    # ----------------------------------------------------------------- construction

    @classmethod
    def forPath(
        cls,
        sparkSession: SparkSession,
        path: str,
        hadoopConf: dict[str, str] | None = None,
        *,
        storage_options: dict[str, str] | None = None,
    ) -> DeltaTable:
        """The Delta table at ``path``.

        Args:
            sparkSession: the session ``toDF``/``history`` build DataFrames in.
            path: the table's folder or URI.
            hadoopConf: accepted for delta-spark compatibility; its entries are
                passed to delta-rs as object-store options (use delta-rs keys,
                e.g. ``AWS_REGION``).
            storage_options: delta-rs object-store options (take precedence).

        Raises:
            NotADeltaTableError: there is no Delta table at ``path``.

        Example:
            >>> DeltaTable.forPath(spark, "/tmp/events").toDF().count()  # doctest: +SKIP
        """
        options = {**(hadoopConf or {}), **(storage_options or {})} or None
        table = cls(sparkSession, path, storage_options=options)
        table._table()  # raises NotADeltaTableError
        return table

    @classmethod
    def forName(cls, sparkSession: SparkSession, tableOrViewName: str) -> DeltaTable:
        """The Delta table registered in the session's catalog as ``tableOrViewName``.

        The catalog entry only points at the table: its location is looked up
        (``DESCRIBE FORMATTED``, or the delta-rs engine's mark in the stored schema) and the table opened as
        :meth:`forPath` does.

        Raises:
            DeltaError: the name is not in the catalog, or its entry has no location.

        Example:
            >>> DeltaTable.forName(spark, "gold.pricing_summary").toDF().count()  # doctest: +SKIP
            4
        """
        try:
            location = table_location(sparkSession, tableOrViewName)
        except LookupError as error:
            raise DeltaError(f"DeltaTable.forName('{tableOrViewName}'): {error}; or use DeltaTable.forPath") from None
        return cls.forPath(sparkSession, location)

    @classmethod
    def isDeltaTable(cls, sparkSession: SparkSession, identifier: str) -> bool:
        """Whether ``identifier`` (a path) holds a Delta table.

        Example:
            >>> DeltaTable.isDeltaTable(spark, "/tmp/not_a_table")  # doctest: +SKIP
            False
        """
        try:
            return deltalake.DeltaTable.is_deltatable(_normalize_path(identifier))
        except Exception:
            return False

    @classmethod
    def convertToDelta(
        cls,
        sparkSession: SparkSession,
        identifier: str,
        partitionSchema: T.StructType | str | None = None,
    ) -> DeltaTable:
        """Convert a folder of (Hive-partitioned) Parquet files into a Delta table in place.

        Args:
            sparkSession: the session the returned table uses.
            identifier: ``"parquet.`/path`"`` as in delta-spark, or a plain path.
            partitionSchema: the partition columns (StructType or DDL string
                such as ``"day date"``) for ``col=value`` folders.

        Raises:
            DeltaError: the folder is already a Delta table or holds no Parquet.

        Example:
            >>> DeltaTable.convertToDelta(spark, "parquet.`/tmp/raw`", "day date")  # doctest: +SKIP
        """
        m = re.fullmatch(r"\s*parquet\.`(.+)`\s*", identifier)
        path = _normalize_path(m.group(1) if m else identifier)
        if deltalake.DeltaTable.is_deltatable(path):
            raise DeltaError("already a Delta table; nothing to convert", table=path)
        partition_by = None
        if partitionSchema is not None:
            struct = (
                partitionSchema
                if isinstance(partitionSchema, T.StructType)
                else T._parse_datatype_string(partitionSchema)
            )
            if not isinstance(struct, T.StructType):
                raise DeltaOptionError(f"partitionSchema {partitionSchema!r} is not a list of columns", table=path)
            partition_by = spark_to_delta_schema(struct, table=path)
        with translated(path, "CONVERT TO DELTA"):
            convert_to_deltalake(
                path,
                partition_by=partition_by,
                partition_strategy="hive" if partition_by is not None else None,
            )
        return cls.forPath(sparkSession, path)

    @classmethod
    def create(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder that creates a new table; fails if one exists at the location.

        Example:
            >>> (DeltaTable.create(spark).location("/tmp/t")
            ...     .addColumn("id", "bigint", nullable=False)
            ...     .addColumn("day", "date")
            ...     .partitionedBy("day")
            ...     .execute())  # doctest: +SKIP
        """
        return DeltaTableBuilder(sparkSession, "error")

    @classmethod
    def createIfNotExists(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder that creates the table unless one exists at the location (then keeps it)."""
        return DeltaTableBuilder(sparkSession, "ignore")

    @classmethod
    def createOrReplace(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder that creates the table or replaces the existing one's schema and data."""
        return DeltaTableBuilder(sparkSession, "overwrite")

    @classmethod
    def replace(cls, sparkSession: SparkSession | None = None) -> DeltaTableBuilder:
        """A builder that replaces an existing table; fails if there is none."""
        return DeltaTableBuilder(sparkSession, "replace")

    # ----------------------------------------------------------------- basics

    @property
    def path(self) -> str:
        """The table's location."""
        return self._path

    def _session(self) -> SparkSession:
        """The Spark session of the table's DataFrames."""
        if self._spark is None:
            raise DeltaError("this DeltaTable has no Spark session: pass one where it was made", table=self._path)
        return self._spark

    def _table(self) -> deltalake.DeltaTable:
        return _open(self._path, self._storage_options)

    def alias(self, aliasName: str) -> DeltaTable:
        """This table under ``aliasName`` (used as the target alias by :meth:`merge`)."""
        if not isinstance(aliasName, str) or not aliasName:
            raise DeltaOptionError("alias must be a non-empty string", table=self._path)
        other = DeltaTable(self._spark, self._path, alias=aliasName, storage_options=self._storage_options)
        other._state = self._state
        return other

    def toDF(self) -> DataFrame:
        """The latest version of the table as a Spark DataFrame (aliased if :meth:`alias` was used)."""
        df = read_delta(self._session(), self._path)
        return df.alias(self._alias) if self._alias else df

    def __repr__(self) -> str:
        return f"DeltaTable({self._path!r})"

    # ----------------------------------------------------------------- history / detail

    _HISTORY_SCHEMA = T.StructType(
        [
            T.StructField("version", T.LongType()),
            T.StructField("timestamp", T.TimestampType()),
            T.StructField("userId", T.StringType()),
            T.StructField("userName", T.StringType()),
            T.StructField("operation", T.StringType()),
            T.StructField("operationParameters", T.MapType(T.StringType(), T.StringType())),
            T.StructField("readVersion", T.LongType()),
            T.StructField("isolationLevel", T.StringType()),
            T.StructField("isBlindAppend", T.BooleanType()),
            T.StructField("operationMetrics", T.MapType(T.StringType(), T.StringType())),
            T.StructField("userMetadata", T.StringType()),
            T.StructField("engineInfo", T.StringType()),
        ]
    )

    def history(self, limit: int | None = None) -> DataFrame:
        """The table's commits, newest first, with delta-spark's history columns.

        Columns delta-rs does not record (``job``, ``notebook``, ``clusterId``)
        are left out; ``userId``/``userName``/``readVersion``/... are null when
        the commit did not record them.

        Args:
            limit: how many of the newest commits to return; all when None.

        Example:
            >>> dt.history(1).select("version", "operation").first()  # doctest: +SKIP
            Row(version=3, operation='MERGE')
        """
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise DeltaOptionError(f"history limit must be a positive integer, got {limit!r}", table=self._path)
        with translated(self._path, "history"):
            commits = self._table().history(limit)
        rows = []
        for c in commits:
            rows.append(
                (
                    int(c["version"]),
                    _ms_to_datetime(c.get("timestamp")),
                    c.get("userId"),
                    c.get("userName"),
                    c.get("operation"),
                    _str_map(c.get("operationParameters")) or {},
                    int(c["readVersion"]) if c.get("readVersion") is not None else None,
                    c.get("isolationLevel"),
                    c.get("isBlindAppend"),
                    _str_map(c.get("operationMetrics")),
                    c.get("userMetadata"),
                    c.get("engineInfo"),
                )
            )
        return self._session().createDataFrame(rows, self._HISTORY_SCHEMA)

    _DETAIL_SCHEMA = T.StructType(
        [
            T.StructField("format", T.StringType()),
            T.StructField("id", T.StringType()),
            T.StructField("name", T.StringType()),
            T.StructField("description", T.StringType()),
            T.StructField("location", T.StringType()),
            T.StructField("createdAt", T.TimestampType()),
            T.StructField("lastModified", T.TimestampType()),
            T.StructField("partitionColumns", T.ArrayType(T.StringType())),
            T.StructField("clusteringColumns", T.ArrayType(T.StringType())),
            T.StructField("numFiles", T.LongType()),
            T.StructField("sizeInBytes", T.LongType()),
            T.StructField("properties", T.MapType(T.StringType(), T.StringType())),
            T.StructField("minReaderVersion", T.IntegerType()),
            T.StructField("minWriterVersion", T.IntegerType()),
            T.StructField("tableFeatures", T.ArrayType(T.StringType())),
        ]
    )

    def detail(self) -> DataFrame:
        """One row describing the table, with delta-spark's ``DESCRIBE DETAIL`` columns.

        ``tableFeatures`` lists the explicit features of a table-features
        protocol, or the features a legacy protocol version implies.

        Example:
            >>> dt.detail().select("numFiles", "partitionColumns").first()  # doctest: +SKIP
            Row(numFiles=2, partitionColumns=['day'])
        """
        with translated(self._path, "detail"):
            table = self._table()
            meta = table.metadata()
            protocol = table.protocol()
            actions = table.get_add_actions(flatten=True)
            sizes = list(actions.column("size_bytes").to_pylist()) if actions.num_rows else []
            last = table.history(1)
        features: set[str] = set(protocol.reader_features or []) | set(protocol.writer_features or [])
        if protocol.min_writer_version < 7:
            for version, names in _LEGACY_WRITER_FEATURES:
                if protocol.min_writer_version >= version:
                    features.update(names)
        row: tuple[Any, ...] = (
            "delta",
            str(meta.id),
            meta.name,
            meta.description,
            table.table_uri,
            _ms_to_datetime(meta.created_time),
            _ms_to_datetime(last[0].get("timestamp")) if last else None,
            list(meta.partition_columns),
            [],
            len(sizes),
            int(sum(sizes)),
            dict(meta.configuration),
            int(protocol.min_reader_version),
            int(protocol.min_writer_version),
            sorted(features),
        )
        return self._session().createDataFrame([row], self._DETAIL_SCHEMA)

    # ----------------------------------------------------------------- DML

    def delete(self, condition: str | Column | None = None) -> None:
        """Delete the rows matching ``condition`` (all rows when None).

        Runs in delta-rs on the driver; the raw metrics land in
        :attr:`lastOperationMetrics`.

        Args:
            condition: a SQL predicate string or a Column (DataFusion SQL).

        Example:
            >>> dt.delete("status = 'cancelled'")  # doctest: +SKIP
            >>> dt.delete(F.col("amount") < 0)  # doctest: +SKIP
        """
        predicate = None if condition is None else to_sql(condition, what="delete condition")
        with translated(self._path, "DELETE"):
            self.lastOperationMetrics = self._table().delete(predicate)

    def update(
        self,
        condition: str | Column | dict[str, str | Column] | None = None,
        set: dict[str, str | Column] | None = None,
    ) -> None:
        """Update the rows matching ``condition``, assigning ``set``.

        ``set`` maps target column names to SQL expressions (strings or
        Columns), like delta-spark's ``update``/``updateExpr``. As in
        delta-spark, ``update(set={...})`` without a condition updates every row.

        Example:
            >>> dt.update("id = 3", {"status": "'closed'", "amount": "amount * 2"})  # doctest: +SKIP
            >>> dt.update(set={"name": F.upper("name")})  # doctest: +SKIP
        """
        if set is None and isinstance(condition, dict):
            condition, set = None, condition
        if not set:
            raise DeltaOptionError("update needs a non-empty 'set' mapping of column to expression", table=self._path)
        updates = {self._strip_alias(k): to_sql(v, what=f"update expression for '{k}'") for k, v in set.items()}
        predicate = None if condition is None else to_sql(condition, what="update condition")
        with translated(self._path, "UPDATE"):
            self.lastOperationMetrics = self._table().update(updates=updates, predicate=predicate)

    def updateExpr(self, condition: str | None = None, set: dict[str, str] | None = None) -> None:
        """:meth:`update` with SQL-string expressions (delta-spark's Scala ``updateExpr``)."""
        self.update(condition, None if set is None else {column: value for column, value in set.items()})

    def _strip_alias(self, name: str) -> str:
        if self._alias and name.startswith(self._alias + "."):
            return name[len(self._alias) + 1 :]
        return name

    def merge(self, source: DataFrame, condition: str | Column) -> DeltaMergeBuilder:
        """Start a MERGE of ``source`` into this table on ``condition``.

        The MERGE runs in delta-rs **on the driver**: ``execute()`` collects the
        source with ``source.toArrow()`` and delta-rs joins it with the table,
        so the source must fit in the driver's memory.

        Aliases: the target's comes from :meth:`alias` (default ``target``),
        the source's from ``df.alias(...)`` (default ``source``).

        Example:
            >>> (dt.alias("t").merge(changes.alias("s"), "t.id = s.id")
            ...    .whenMatchedDelete("s.op = 'D'")
            ...    .whenMatchedUpdateAll("s.seq > t.seq")
            ...    .whenNotMatchedInsertAll("s.op != 'D'")
            ...    .execute())  # doctest: +SKIP
        """
        return DeltaMergeBuilder(self, source, condition)

    # ----------------------------------------------------------------- maintenance

    def optimize(self) -> DeltaOptimizeBuilder:
        """A builder for OPTIMIZE (compaction or Z-ordering), run by delta-rs on the driver.

        Example:
            >>> dt.optimize().where("day = '2024-01-01'").executeCompaction()  # doctest: +SKIP
            >>> dt.optimize().executeZOrderBy("customer_id")  # doctest: +SKIP
        """
        return DeltaOptimizeBuilder(self)

    def vacuum(
        self,
        retentionHours: float | None = None,
        *,
        enforceRetentionDuration: bool | None = None,
        dryRun: bool = False,
    ) -> DataFrame:
        """Delete files no longer referenced by versions within the retention period.

        A retention shorter than the table's ``delta.deletedFileRetentionDuration``
        (default 7 days = 168 hours) is refused unless the session sets
        ``spark.databricks.delta.retentionDurationCheck.enabled=false`` or
        ``enforceRetentionDuration=False`` is passed.

        Args:
            retentionHours: keep files needed by versions younger than this; the
                table's configured retention when None.
            enforceRetentionDuration: override the session conf for this call.
            dryRun: list what would be deleted without deleting it.

        Returns:
            A DataFrame with one ``path`` column: the files deleted (or, with
            ``dryRun``, the files that would be).

        Raises:
            DeltaError: the retention is below the table's minimum.

        Example:
            >>> dt.vacuum()  # doctest: +SKIP
            >>> dt.vacuum(0, enforceRetentionDuration=False)  # doctest: +SKIP
        """
        with translated(self._path, "VACUUM"):
            table = self._table()
        minimum = _retention_hours(table.metadata().configuration)
        if enforceRetentionDuration is None:
            conf = self._spark.conf.get(_RETENTION_CHECK_CONF, "true") if self._spark is not None else "true"
            enforce = str(conf).strip().lower() != "false"
        else:
            enforce = bool(enforceRetentionDuration)
        if retentionHours is not None:
            if retentionHours < 0:
                raise DeltaOptionError(f"retentionHours must be >= 0, got {retentionHours}", table=self._path)
            if enforce and retentionHours < minimum:
                raise DeltaError(
                    f"VACUUM refused: the requested retention of {retentionHours:g} hours is below the "
                    f"table's minimum of {minimum:g} hours (delta.deletedFileRetentionDuration); removing "
                    "files younger than that can break readers and time travel. Set "
                    f"{_RETENTION_CHECK_CONF}=false or pass enforceRetentionDuration=False if you are sure.",
                    table=self._path,
                )
            hours: int | None = int(math.ceil(retentionHours))
        else:
            hours = None
        with translated(self._path, "VACUUM"):
            deleted = table.vacuum(
                retention_hours=hours,
                dry_run=dryRun,
                enforce_retention_duration=False if hours is not None else enforce,
                # List the folder, as delta-spark does: files a failed job left
                # behind were never in the log, so only a full vacuum finds them.
                full=True,
            )
        self.lastOperationMetrics = {"numDeletedFiles": len(deleted), "filesDeleted": list(deleted)}
        return self._session().createDataFrame([(p,) for p in deleted], "path string")

    _RESTORE_SCHEMA = T.StructType(
        [
            T.StructField("table_size_after_restore", T.LongType()),
            T.StructField("num_of_files_after_restore", T.LongType()),
            T.StructField("num_removed_files", T.LongType()),
            T.StructField("num_restored_files", T.LongType()),
            T.StructField("removed_files_size", T.LongType()),
            T.StructField("restored_files_size", T.LongType()),
        ]
    )

    def restoreToVersion(self, version: int) -> DataFrame:
        """Restore the table to an earlier ``version`` (a new commit).

        Returns:
            delta-spark's restore metrics: ``table_size_after_restore``,
            ``num_of_files_after_restore``, ``num_removed_files``,
            ``num_restored_files`` (the two size columns are null: delta-rs
            does not report them).

        Example:
            >>> dt.restoreToVersion(2).first().num_restored_files  # doctest: +SKIP
        """
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise DeltaOptionError(f"version must be a non-negative integer, got {version!r}", table=self._path)
        return self._restore(version)

    def restoreToTimestamp(self, timestamp: str | _dt.datetime) -> DataFrame:
        """Restore the table to its version as of ``timestamp`` (ISO text or datetime; naive = UTC)."""
        return self._restore(parse_timestamp(timestamp, table=self._path))

    def _restore(self, target: int | _dt.datetime) -> DataFrame:
        with translated(self._path, "RESTORE"):
            table = self._table()
            if isinstance(target, int) and target > table.version():
                raise DeltaOptionError(
                    f"cannot restore to version {target}: the latest version is {table.version()}",
                    table=self._path,
                )
            metrics = table.restore(target)
            after = self._table().get_add_actions(flatten=True)
        self.lastOperationMetrics = metrics
        sizes = list(after.column("size_bytes").to_pylist()) if after.num_rows else []
        row = (
            int(sum(sizes)),
            len(sizes),
            int(metrics.get("numRemovedFile", 0)),
            int(metrics.get("numRestoredFile", 0)),
            None,
            None,
        )
        return self._session().createDataFrame([row], self._RESTORE_SCHEMA)

    # ----------------------------------------------------------------- properties / protocol

    def setProperties(self, properties: dict[str, str]) -> None:
        """Set table properties (delta-spark: ``ALTER TABLE ... SET TBLPROPERTIES``).

        ``delta.*`` keys are checked against the Delta keys delta-rs knows;
        other keys are stored as given.

        Example:
            >>> dt.setProperties({"delta.enableChangeDataFeed": "true", "owner": "data-eng"})  # doctest: +SKIP
        """
        if not properties:
            return
        props = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in properties.items()}
        custom = any(not k.startswith("delta.") for k in props)
        with translated(self._path, "SET TBLPROPERTIES"):
            self._table().alter.set_table_properties(props, raise_if_not_exists=not custom)

    def setProperty(self, key: str, value: str) -> None:
        """Set one table property; see :meth:`setProperties`."""
        self.setProperties({key: value})

    def unsetProperties(self, keys: Iterable[str], *, ifExists: bool = True) -> None:
        """Remove table properties (``ALTER TABLE ... UNSET TBLPROPERTIES``).

        delta-rs can only add or change properties, not remove them, so this
        supports: keys that are not set (a no-op, or an error when
        ``ifExists=False``) and ``delta.constraints.<name>`` keys (dropped as
        constraints). Any other set key raises :class:`DeltaError`; set it to
        its default value with :meth:`setProperty` instead.
        """
        keys = [keys] if isinstance(keys, str) else list(keys)
        config = self._table().metadata().configuration
        missing = [k for k in keys if k not in config]
        if missing and not ifExists:
            raise DeltaOptionError(f"cannot unset properties that are not set: {', '.join(missing)}", table=self._path)
        present = [k for k in keys if k in config]
        constraints = [k for k in present if k.startswith("delta.constraints.")]
        others = [k for k in present if k not in constraints]
        if others:
            raise DeltaError(
                f"cannot unset {', '.join(others)}: delta-rs has no operation that removes a table "
                "property (only constraints can be dropped); set the property to its default value "
                "with setProperty instead.",
                table=self._path,
            )
        for key in constraints:
            self.dropConstraint(key[len("delta.constraints.") :])

    def unsetProperty(self, key: str, *, ifExists: bool = True) -> None:
        """Remove one table property; see :meth:`unsetProperties`."""
        self.unsetProperties([key], ifExists=ifExists)

    def properties(self) -> dict[str, str]:
        """The table's properties (its metadata configuration)."""
        return dict(self._table().metadata().configuration)

    def addConstraint(self, name: str, expr: str | Column) -> None:
        """Add a CHECK constraint (``ALTER TABLE ... ADD CONSTRAINT name CHECK (expr)``).

        The expression is DataFusion SQL, as delta-rs reads it; the ``delta`` writer
        enforces it on every write with the same engine.

        Raises:
            ConstraintViolationError: existing rows violate it (nothing is committed).
            DeltaOptionError: the writer could not evaluate it on the table's columns
                (nothing is committed).

        Example:
            >>> dt.addConstraint("amount_positive", "amount > 0")  # doctest: +SKIP
        """
        sql = to_sql(expr, what=f"constraint '{name}'")
        with translated(self._path, f"ADD CONSTRAINT {name}"):
            table = self._table()
            try:
                # What every later write runs: refuse a constraint it could not evaluate.
                check_predicate(sql, spark_to_arrow_schema(delta_to_spark_schema(table.schema()), table=self._path))
            except PredicateError as exc:
                raise DeltaOptionError(
                    f"cannot add constraint {name} CHECK ({sql}): the writer cannot evaluate it on the "
                    f"table's columns ({exc.message})",
                    table=self._path,
                ) from exc
            try:
                table.alter.add_constraint({name: sql})
            except (_RsDeltaError, ValueError) as exc:
                low = str(exc).lower()
                if "violat" in low or "failed validation" in low or "invalid data" in low:
                    raise ConstraintViolationError(
                        f"cannot add constraint {name} CHECK ({sql}): existing rows violate it ({exc})",
                        table=self._path,
                    ) from exc
                raise

    def dropConstraint(self, name: str, *, ifExists: bool = True) -> None:
        """Drop a CHECK constraint (``ALTER TABLE ... DROP CONSTRAINT [IF EXISTS] name``)."""
        with translated(self._path, f"DROP CONSTRAINT {name}"):
            self._table().alter.drop_constraint(name, raise_if_not_exists=not ifExists)

    def upgradeTableProtocol(self, readerVersion: int, writerVersion: int) -> None:
        """Raise the table's protocol versions (never lowers them).

        Implemented by setting ``delta.minReaderVersion``/``delta.minWriterVersion``,
        which delta-rs turns into a protocol upgrade.
        """
        protocol = self._table().protocol()
        props = {}
        if int(readerVersion) > protocol.min_reader_version:
            props["delta.minReaderVersion"] = str(int(readerVersion))
        if int(writerVersion) > protocol.min_writer_version:
            props["delta.minWriterVersion"] = str(int(writerVersion))
        if props:
            with translated(self._path, "upgradeTableProtocol"):
                self._table().alter.set_table_properties(props, raise_if_not_exists=True)

    def addFeatureSupport(self, featureName: str) -> None:
        """Add a table feature by delta-spark's name (``deletionVectors``, ``changeDataFeed``...).

        The protocol is raised to reader 3 / writer 7 when the feature needs it.
        """
        member = _FEATURES.get(str(featureName).lower())
        if member is None:
            raise DeltaOptionError(
                f"unknown or unsupported table feature '{featureName}'; known: {', '.join(sorted(_FEATURES))}",
                table=self._path,
            )
        with translated(self._path, f"addFeatureSupport({featureName})"):
            self._table().alter.add_feature(
                getattr(deltalake.TableFeatures, member), allow_protocol_versions_increase=True
            )

    def generate(self, mode: str) -> None:
        """Generate a ``symlink_format_manifest`` (the only mode delta-spark has)."""
        if mode != "symlink_format_manifest":
            raise DeltaOptionError(f"unknown generate mode '{mode}'; use 'symlink_format_manifest'", table=self._path)
        with translated(self._path, "GENERATE"):
            self._table().generate()

    # ----------------------------------------------------------------- change data feed

    def changes(
        self,
        *,
        startingVersion: int | None = None,
        endingVersion: int | None = None,
        startingTimestamp: str | _dt.datetime | None = None,
        endingTimestamp: str | _dt.datetime | None = None,
    ) -> DataFrame:
        """The change data feed between two versions as a Spark DataFrame (built on the driver).

        Like ``spark.read.option("readChangeFeed", "true")``: the table's
        columns plus ``_change_type``, ``_commit_version``, ``_commit_timestamp``.

        Raises:
            DeltaError: ``delta.enableChangeDataFeed`` was off in the range.

        Example:
            >>> dt.changes(startingVersion=2).groupBy("_change_type").count()  # doctest: +SKIP
        """
        reader = read_change_feed_batches(
            self._path,
            starting_version=startingVersion,
            ending_version=endingVersion,
            starting_timestamp=startingTimestamp,
            ending_timestamp=endingTimestamp,
            storage_options=self._storage_options,
        )
        data = pa.Table.from_batches(list(reader), schema=reader.schema)
        schema = from_arrow_schema(data.schema)
        return self._session().createDataFrame(data, schema=schema)


# --------------------------------------------------------------------------- builders


class DeltaTableBuilder:
    """Builds a table: delta-spark's ``DeltaTableBuilder``. Get one from :meth:`DeltaTable.create`.

    Example:
        >>> (DeltaTable.createIfNotExists(spark)
        ...     .location("/lake/silver/orders")
        ...     .addColumns(df.schema)
        ...     .partitionedBy("order_date")
        ...     .property("delta.enableChangeDataFeed", "true")
        ...     .comment("orders, latest state")
        ...     .execute())  # doctest: +SKIP
    """

    def __init__(self, spark: SparkSession | None, mode: str) -> None:
        self._spark = spark
        self._mode = mode
        self._location: str | None = None
        self._fields: list[T.StructField] = []
        self._partitions: list[str] = []
        self._properties: dict[str, str] = {}
        self._comment: str | None = None

    def tableName(self, identifier: str) -> DeltaTableBuilder:
        """Not available: there is no catalog here. Use :meth:`location`."""
        raise DeltaError(
            f"tableName('{identifier}') needs a catalog of Delta tables, which this package does not "
            "have; give the table's path with .location(path) instead."
        )

    def location(self, location: str) -> DeltaTableBuilder:
        """The folder or URI of the table."""
        if not isinstance(location, str) or not location:
            raise DeltaOptionError("location must be a non-empty path string")
        self._location = location
        return self

    def comment(self, comment: str) -> DeltaTableBuilder:
        """The table's description."""
        self._comment = comment
        return self

    def addColumn(
        self,
        colName: str,
        dataType: T.DataType | str,
        nullable: bool = True,
        generatedAlwaysAs: str | None = None,
        generatedByDefaultAs: Any = None,
        comment: str | None = None,
    ) -> DeltaTableBuilder:
        """Add a column: a Spark ``DataType`` or a DDL type string (``'decimal(10,2)'``).

        Generated and identity columns are not supported by delta-rs' writers
        and are refused.
        """
        if generatedAlwaysAs is not None or generatedByDefaultAs is not None:
            raise DeltaOptionError(
                f"column '{colName}': generated and identity columns are not supported here",
                table=self._location,
            )
        if not isinstance(colName, str) or not colName:
            raise DeltaOptionError("column name must be a non-empty string", table=self._location)
        metadata = {"comment": comment} if comment else {}
        self._fields.append(T.StructField(colName, _data_type(dataType, colName), bool(nullable), metadata))
        return self

    def addColumns(self, cols: T.StructType | list[T.StructField]) -> DeltaTableBuilder:
        """Add every field of a ``StructType`` (e.g. ``df.schema``)."""
        fields = cols.fields if isinstance(cols, T.StructType) else list(cols)
        for f in fields:
            if not isinstance(f, T.StructField):
                raise DeltaOptionError(
                    f"addColumns takes a StructType or StructFields, got {f!r}", table=self._location
                )
            self._fields.append(f)
        return self

    def partitionedBy(self, *cols: str | list[str]) -> DeltaTableBuilder:
        """Partition the table by these columns."""
        names: list[str] = []
        for c in cols:
            names.extend([c] if isinstance(c, str) else list(c))
        self._partitions = names
        return self

    def clusterBy(self, *cols: str) -> DeltaTableBuilder:
        """Not available: delta-rs does not write liquid-clustered tables."""
        raise DeltaOptionError(
            "clusterBy (liquid clustering) is not supported; use partitionedBy or optimize().executeZOrderBy"
        )

    def property(self, key: str, value: str) -> DeltaTableBuilder:
        """Set a table property."""
        self._properties[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
        return self

    def execute(self) -> DeltaTable:
        """Create (or replace) the table and return it.

        Raises:
            DeltaError: no location; the table exists (``create``) or does not
                (``replace``).
            DeltaOptionError: no columns, duplicate or unknown partition columns.
            UnsupportedTypeError: a column has a type Delta cannot store.
        """
        if self._location is None:
            raise DeltaError("the table builder needs .location(path): there is no catalog to name tables in")
        path = _normalize_path(self._location)
        if not self._fields:
            raise DeltaOptionError("the table needs at least one column (addColumn / addColumns)", table=path)
        names = [f.name.lower() for f in self._fields]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise DeltaOptionError(f"duplicate columns: {', '.join(dupes)}", table=path)
        by_name = {f.name.lower(): f.name for f in self._fields}
        partitions = []
        for p in self._partitions:
            if p.lower() not in by_name:
                raise DeltaOptionError(f"partition column '{p}' is not one of the table's columns", table=path)
            partitions.append(by_name[p.lower()])
        schema = spark_to_delta_schema(T.StructType(self._fields), table=path)
        exists = deltalake.DeltaTable.is_deltatable(path)
        if self._mode == "error" and exists:
            raise DeltaError(
                "a Delta table already exists here; use DeltaTable.createIfNotExists or createOrReplace",
                table=path,
            )
        if self._mode == "replace" and not exists:
            raise NotADeltaTableError("cannot replace: there is no Delta table here; use createOrReplace", table=path)
        if self._mode == "ignore" and exists:
            return DeltaTable(self._spark, path)
        mode: Literal["overwrite", "error"] = "overwrite" if self._mode in ("overwrite", "replace") else "error"
        with translated(path, "CREATE TABLE"):
            deltalake.DeltaTable.create(
                path,
                schema,
                mode=mode,
                partition_by=partitions or None,
                description=self._comment,
                configuration=self._properties or None,
                raise_if_key_not_exists=False,
            )
        return DeltaTable(self._spark, path)


_OPTIMIZE_METRICS = T.StructType(
    [
        T.StructField("numFilesAdded", T.LongType()),
        T.StructField("numFilesRemoved", T.LongType()),
        T.StructField(
            "filesAdded",
            T.StructType(
                [T.StructField(n, T.LongType()) for n in ("min", "max")]
                + [T.StructField("avg", T.DoubleType())]
                + [T.StructField(n, T.LongType()) for n in ("totalFiles", "totalSize")]
            ),
        ),
        T.StructField(
            "filesRemoved",
            T.StructType(
                [T.StructField(n, T.LongType()) for n in ("min", "max")]
                + [T.StructField("avg", T.DoubleType())]
                + [T.StructField(n, T.LongType()) for n in ("totalFiles", "totalSize")]
            ),
        ),
        T.StructField("partitionsOptimized", T.LongType()),
        T.StructField("numBatches", T.LongType()),
        T.StructField("totalConsideredFiles", T.LongType()),
        T.StructField("totalFilesSkipped", T.LongType()),
    ]
)
_OPTIMIZE_SCHEMA = T.StructType([T.StructField("path", T.StringType()), T.StructField("metrics", _OPTIMIZE_METRICS)])

_FILTER_RE = re.compile(
    r"""^\s*`?(?P<col>[A-Za-z_][A-Za-z0-9_]*)`?\s*
        (?P<op>=|==|!=|<>|<=|>=|<|>|\bnot\s+in\b|\bin\b)\s*
        (?P<val>.+?)\s*$""",
    re.IGNORECASE | re.VERBOSE,
)


def _filter_value(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].replace(text[0] * 2, text[0])
    return text


def _parse_partition_filter(text: str, partitions: list[str], table: str) -> list[tuple[str, str, Any]]:
    """``a = 'x' AND b IN (1, 2)`` -> delta-rs partition filter tuples."""
    filters: list[tuple[str, str, Any]] = []
    for part in re.split(r"\s+and\s+", text.strip(), flags=re.IGNORECASE):
        m = _FILTER_RE.match(part)
        if not m:
            raise DeltaOptionError(
                f"optimize().where('{text}'): only conjunctions (AND) of comparisons of partition "
                "columns with literals are supported, e.g. \"day = '2024-01-01' AND region IN ('eu', 'us')\"",
                table=table,
            )
        col, op, val = m.group("col"), re.sub(r"\s+", " ", m.group("op").lower()), m.group("val")
        lookup = {p.lower(): p for p in partitions}
        if col.lower() not in lookup:
            raise DeltaOptionError(
                f"optimize().where('{text}'): '{col}' is not a partition column "
                f"(partition columns: {', '.join(partitions) or 'none'})",
                table=table,
            )
        op = {"==": "=", "<>": "!="}.get(op, op)
        if op in ("in", "not in"):
            inner = val.strip()
            if not (inner.startswith("(") and inner.endswith(")")):
                raise DeltaOptionError(f"optimize().where('{text}'): IN needs a parenthesised list", table=table)
            values = [_filter_value(v) for v in inner[1:-1].split(",") if v.strip()]
            filters.append((lookup[col.lower()], op, values))
        else:
            filters.append((lookup[col.lower()], op, _filter_value(val)))
    return filters


class DeltaOptimizeBuilder:
    """delta-spark's ``DeltaOptimizeBuilder``; runs OPTIMIZE in delta-rs on the driver.

    Example:
        >>> compaction = dt.optimize().where("day >= '2024-01-01'").executeCompaction()  # doctest: +SKIP
        >>> compaction.first().metrics.numFilesAdded  # doctest: +SKIP
    """

    def __init__(self, table: DeltaTable) -> None:
        self._delta = table
        self._where: str | None = None

    def where(self, partitionFilter: str) -> DeltaOptimizeBuilder:
        """Only optimize the partitions matching ``partitionFilter`` (partition columns only)."""
        self._where = partitionFilter
        return self

    def _filters(self, table: deltalake.DeltaTable):
        if not self._where:
            return None
        return _parse_partition_filter(self._where, list(table.metadata().partition_columns), self._delta.path)

    def executeCompaction(self) -> DataFrame:
        """Compact small files; returns delta-spark's ``path``/``metrics`` DataFrame."""
        with translated(self._delta.path, "OPTIMIZE"):
            table = self._delta._table()
            metrics = table.optimize.compact(partition_filters=self._filters(table))
        return self._result(metrics)

    def executeZOrderBy(self, *cols: str | list[str]) -> DataFrame:
        """Rewrite files Z-ordered by ``cols``; returns the ``path``/``metrics`` DataFrame."""
        names: list[str] = []
        for c in cols:
            names.extend([c] if isinstance(c, str) else list(c))
        if not names:
            raise DeltaOptionError("executeZOrderBy needs at least one column", table=self._delta.path)
        with translated(self._delta.path, "OPTIMIZE ZORDER"):
            table = self._delta._table()
            partitions = {p.lower() for p in table.metadata().partition_columns}
            bad = [c for c in names if c.lower() in partitions]
            if bad:
                raise DeltaOptionError(f"cannot Z-order by partition columns: {', '.join(bad)}", table=self._delta.path)
            metrics = table.optimize.z_order(names, partition_filters=self._filters(table))
        return self._result(metrics)

    def _result(self, metrics: dict[str, Any]) -> DataFrame:
        self._delta.lastOperationMetrics = metrics

        def stats(raw):
            if isinstance(raw, str):
                raw = json.loads(raw)
            raw = raw or {}
            return (
                raw.get("min"),
                raw.get("max"),
                float(raw["avg"]) if raw.get("avg") is not None else None,
                raw.get("totalFiles"),
                raw.get("totalSize"),
            )

        row = (
            self._delta.path,
            (
                metrics.get("numFilesAdded"),
                metrics.get("numFilesRemoved"),
                stats(metrics.get("filesAdded")),
                stats(metrics.get("filesRemoved")),
                metrics.get("partitionsOptimized"),
                metrics.get("numBatches"),
                metrics.get("totalConsideredFiles"),
                metrics.get("totalFilesSkipped"),
            ),
        )
        return self._delta._session().createDataFrame([row], _OPTIMIZE_SCHEMA)
