"""The ``delta`` format: a Spark Python data source over delta-rs.

``spark.read.format("delta")`` resolves the snapshot with delta-rs on the
driver, lets delta-rs skip files by partition values and statistics for pushed
filters, and reads the rest in input partitions sized by bytes (big files split
by row group; the stream source reads the same partitions). ``df.write.format("delta")``
writes Parquet files in the tasks and commits them in one transaction on the
driver. Streaming reads and writes live in :mod:`._streaming`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from deltalake.exceptions import DeltaError as DeltaRsError
from pyspark.sql import datasource as ds
from pyspark.sql import types as T
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)

from medallion_assets.delta._catalog import LOCATION_METADATA
from medallion_assets.delta._cdf import read_change_feed_batches
from medallion_assets.delta._commit import (
    DeltaCommitMessage,
    WritePlan,
    commit_write,
    delete_uncommitted_files,
    plan_write,
    task_id,
)
from medallion_assets.delta._options import ReadOptions
from medallion_assets.delta._read import (
    BATCH_ROWS,
    DeltaInputPartition,
    plan_input_partitions,
    read_slices,
    split_budget,
)
from medallion_assets.delta._schema import conform_table, spark_to_arrow_schema
from medallion_assets.delta._snapshot import (
    DataFile,
    Snapshot,
    file_key,
    open_table,
    resolve_snapshot,
    table_path,
    table_schema,
)
from medallion_assets.delta._sql import pruning_literal, quote_identifier
from medallion_assets.delta._streaming import DeltaStreamReader, DeltaStreamWriter
from medallion_assets.delta.errors import DeltaOptionError

# Columns a change data feed read adds, as delta-spark names them.
CHANGE_FEED_COLUMNS = [
    T.StructField("_change_type", T.StringType(), True),
    T.StructField("_commit_version", T.LongType(), True),
    T.StructField("_commit_timestamp", T.TimestampType(), True),
]


class DeltaDataSource(DataSource):
    """Spark's ``delta`` format, backed by delta-rs."""

    @classmethod
    def name(cls) -> str:
        return "delta"

    def _read_options(self) -> ReadOptions:
        return ReadOptions.parse(
            {k: v for k, v in self.options.items() if k.lower() != "path"}, table=table_path(self.options)
        )

    def _registering(self) -> bool:
        # CREATE TABLE ... USING delta LOCATION hands over the catalog's own properties too.
        return "provider" in {key.lower() for key in self.options}

    def _locate(self, schema: T.StructType) -> None:
        """A table read by name: Spark 4.2 gives the reader no options, only the catalog's schema."""
        if self.options.get("path"):
            return
        location = (schema.fields[0].metadata or {}).get(LOCATION_METADATA) if schema.fields else None
        if not location:
            raise DeltaOptionError(
                "a table read by name whose catalog entry holds no location for the delta-rs engine (it was "
                "registered by a delta-spark session): re-register it from a delta-rs session (the project's "
                "SparkResource does at start), read it by path, or use delta-spark"
            )
        self.options["path"] = location

    def schema(self) -> T.StructType:
        location = table_path(self.options)
        if self._registering():
            schema = table_schema(location)
            fields = schema.fields
            if not fields:
                return schema
            first = fields[0]
            # The catalog keeps this schema and hands it back on every read by name (see _locate).
            marked = T.StructField(
                first.name, first.dataType, first.nullable, {**(first.metadata or {}), LOCATION_METADATA: location}
            )
            return T.StructType([marked, *fields[1:]])
        opts = self._read_options()
        schema = table_schema(
            location,
            version=None if opts.read_change_feed else opts.version_as_of,
            timestamp=None if opts.read_change_feed else opts.timestamp_as_of,
        )
        if opts.read_change_feed:
            return T.StructType([*schema.fields, *CHANGE_FEED_COLUMNS])
        return schema

    def reader(self, schema: T.StructType) -> DataSourceReader:
        self._locate(schema)
        location = table_path(self.options)
        opts = self._read_options()
        if opts.read_change_feed:
            return ChangeFeedReader(location, opts, schema)
        snapshot = resolve_snapshot(location, version=opts.version_as_of, timestamp=opts.timestamp_as_of)
        return DeltaBatchReader(snapshot, opts)

    def writer(self, schema: T.StructType, overwrite: bool) -> DeltaBatchWriter:
        self._locate(schema)
        schema = _without_location(schema)
        location = table_path(self.options)
        options = {k: v for k, v in self.options.items() if k.lower() != "path"}
        plan = plan_write(location, schema, mode="overwrite" if overwrite else "append", options=options)
        return DeltaBatchWriter(plan)

    def streamWriter(self, schema: T.StructType, overwrite: bool):
        return DeltaStreamWriter.create(self.options, schema, overwrite)

    def streamReader(self, schema: T.StructType):
        return DeltaStreamReader.create(self.options, schema)


def _without_location(schema: T.StructType) -> T.StructType:
    """The schema without the catalog's location mark, so a write by name does not store it in the log."""
    if not schema.fields or LOCATION_METADATA not in (schema.fields[0].metadata or {}):
        return schema
    first = schema.fields[0]
    metadata = {k: v for k, v in first.metadata.items() if k != LOCATION_METADATA}
    return T.StructType([T.StructField(first.name, first.dataType, first.nullable, metadata), *schema.fields[1:]])


# ---------------------------------------------------------------- batch read


def pushed_filter_sql(f) -> str | None:
    """One of Spark's pushed filters as a SQL predicate for delta-rs's file pruning (None: no such form)."""
    if isinstance(f, ds.Not):
        inner = pushed_filter_sql(f.child)
        return None if inner is None else f"NOT ({inner})"
    attribute = getattr(f, "attribute", None)
    if not attribute or len(attribute) != 1:
        return None  # nested fields: no statistics to prune with
    column = quote_identifier(attribute[0])
    if isinstance(f, ds.IsNull):
        return f"{column} IS NULL"
    if isinstance(f, ds.IsNotNull):
        return f"{column} IS NOT NULL"
    if isinstance(f, ds.In):
        literals = [pruning_literal(v) for v in f.value if v is not None]
        values = [v for v in literals if v is not None]
        return None if not values or len(values) != len(literals) else f"{column} IN ({', '.join(values)})"
    operators = {
        ds.EqualTo: "=",
        ds.EqualNullSafe: "IS NOT DISTINCT FROM",
        ds.GreaterThan: ">",
        ds.GreaterThanOrEqual: ">=",
        ds.LessThan: "<",
        ds.LessThanOrEqual: "<=",
    }
    operator = operators.get(type(f))
    if operator is None:
        return None  # StringStartsWith and friends: delta-rs prunes with comparisons only
    if f.value is None:
        return f"{column} IS NULL" if isinstance(f, ds.EqualNullSafe) else None
    literal = pruning_literal(f.value)
    return None if literal is None else f"{column} {operator} {literal}"


class DeltaBatchReader(DataSourceReader):
    """Reads one snapshot; delta-rs skips the files that pushed filters rule out."""

    def __init__(self, snapshot: Snapshot, options: ReadOptions) -> None:
        self.snapshot = snapshot
        self.options = options
        self.filters: list[str] = []

    def pushFilters(self, filters):
        for f in filters:
            predicate = pushed_filter_sql(f)
            if predicate is not None:
                self.filters.append(predicate)
        # Spark still applies every filter to the rows; we only skip files.
        yield from filters

    def live_files(self) -> list[DataFile]:
        """The snapshot's files that delta-rs's pruning (partition values, statistics) keeps."""
        if not self.filters:
            return list(self.snapshot.files)
        table = open_table(self.snapshot.location, version=self.snapshot.version, check_features=False)
        kept: set[str] | None = None
        for predicate in self.filters:
            try:
                uris = table.file_uris(file_pruning_predicate=predicate)
            except DeltaRsError:
                continue  # delta-rs cannot prune with this filter: it keeps every file
            found = {file_key(u) for u in uris}
            kept = found if kept is None else kept & found
        if kept is None:
            return list(self.snapshot.files)
        return [f for f in self.snapshot.files if file_key(f.path) in kept]

    def partitions(self) -> Sequence[InputPartition]:
        files = self.live_files()
        if not files:
            return [DeltaInputPartition([])]
        return plan_input_partitions(files, split_budget(files, self.options.max_partition_bytes))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, DeltaInputPartition), "the partitions are this reader's own"
        yield from read_slices(
            partition, self.snapshot.arrow_schema, self.snapshot.partition_columns, table=self.snapshot.location
        )


class ChangeFeedReader(DataSourceReader):
    """Reads the change data feed between two versions (one task; delta-rs does the work)."""

    def __init__(self, location: str, options: ReadOptions, schema: T.StructType) -> None:
        if options.starting_version is None and options.starting_timestamp is None:
            raise DeltaOptionError("readChangeFeed needs startingVersion or startingTimestamp", table=location)
        self.location = location
        self.options = options
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(0)]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        target = spark_to_arrow_schema(self.schema, table=self.location)
        starting = self.options.starting_version
        changes = read_change_feed_batches(
            self.location,
            starting_version=starting if isinstance(starting, int) else None,  # None: "latest" or not set
            ending_version=self.options.ending_version,
            starting_timestamp=self.options.starting_timestamp,
            ending_timestamp=self.options.ending_timestamp,
        )
        table = changes.read_all() if hasattr(changes, "read_all") else changes
        for batch in pa.table(table).to_batches(max_chunksize=BATCH_ROWS):
            yield conform_table(batch, target, table=self.location)


# ---------------------------------------------------------------- batch write


class DeltaBatchWriter(DataSourceArrowWriter):
    """Tasks write Parquet files; the driver commits them in one Delta transaction."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        writer = self.plan.file_writer(task_id())
        return DeltaCommitMessage(writer.write_batches(iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [f for m in messages if isinstance(m, DeltaCommitMessage) for f in m.files]
        commit_write(self.plan, files)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        files = [f for m in messages if isinstance(m, DeltaCommitMessage) for f in m.files]
        delete_uncommitted_files(self.plan.location, files)
