"""The Delta IO manager: asset key ``[layer, table]`` <-> ``<lake root>/<layer>/<table>``.

Split the way dagster-deltalake splits its IO manager:

* ``spec``: how an asset declares its storage (:func:`delta_table`, :class:`WriteSpec`).
* ``client``: :class:`DeltaTableClient` reads and writes the tables and
  describes a version; it knows nothing of Dagster.
* ``merges``: the merge strategies and the tombstone tables.
* ``metadata``: a table's description as Dagster output metadata.
* ``manager``: :class:`DeltaIOManager` (the configuration and the Dagster
  side) and :class:`SparkDataFrameTypeHandler`.
* ``arrow_handlers``: pandas, polars and Arrow in and out through delta-rs
  (:class:`ArrowDeltaClient`, one handler per library), without Spark.
* ``table_read``: :class:`TableRead`, an input computed on in Arrow while
  the version read is small, else with Spark; :class:`ChangesWithTable`, an
  input's new rows and its whole table.
"""

from medallion_assets.io_manager.arrow_handlers import ArrowDeltaClient
from medallion_assets.io_manager.client import DeltaTableClient, TableDescription, WriteResult
from medallion_assets.io_manager.manager import DeltaIOManager, SparkDataFrameTypeHandler, check_once_per_version
from medallion_assets.io_manager.metadata import (
    latest_materialization_metadata,
    markdown_preview,
    spark_table_schema,
    table_metadata,
)
from medallion_assets.io_manager.spec import (
    APPEND_KEYS,
    COLUMN_DESCRIPTIONS,
    COLUMNS,
    DELETE_COLUMN,
    DELETION_VECTORS,
    DELTA_KINDS,
    FILTERED_BY,
    MERGE_KEYS,
    PARTITION_COLUMNS,
    PARTITION_EXPR,
    READ,
    REPLACE_GROUP,
    SCHEMA_MODE,
    SEQUENCE_COLUMN,
    SOURCE,
    TABLE_PROPERTIES,
    VERSION,
    WRITE_MODE,
    WriteSpec,
    delta_table,
)
from medallion_assets.io_manager.table_read import ChangesWithTable, TableRead

__all__ = [
    "APPEND_KEYS",
    "DELTA_KINDS",
    "DELETION_VECTORS",
    "COLUMN_DESCRIPTIONS",
    "COLUMNS",
    "DELETE_COLUMN",
    "FILTERED_BY",
    "MERGE_KEYS",
    "PARTITION_COLUMNS",
    "PARTITION_EXPR",
    "READ",
    "REPLACE_GROUP",
    "SCHEMA_MODE",
    "SEQUENCE_COLUMN",
    "SOURCE",
    "TABLE_PROPERTIES",
    "VERSION",
    "WRITE_MODE",
    "ArrowDeltaClient",
    "ChangesWithTable",
    "DeltaIOManager",
    "DeltaTableClient",
    "SparkDataFrameTypeHandler",
    "TableDescription",
    "TableRead",
    "WriteResult",
    "WriteSpec",
    "check_once_per_version",
    "delta_table",
    "latest_materialization_metadata",
    "markdown_preview",
    "spark_table_schema",
    "table_metadata",
]
