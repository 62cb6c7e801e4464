"""The Delta IO manager: asset key ``[layer, table]`` <-> ``<lake root>/<layer>/<table>``.

What faces Dagster, and nothing else; reading and writing tables is
:mod:`medallion_assets.storage`'s. Its modules are listed in the module map
(docs/architecture.md, "Where each concern lives").
"""

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
    delta_table,
    write_spec_from_metadata,
)
from medallion_assets.io_manager.table_read import ChangesWithTable, TableRead
from medallion_assets.storage.write_spec import DELETION_VECTORS, WriteSpec

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
    "ChangesWithTable",
    "DeltaIOManager",
    "SparkDataFrameTypeHandler",
    "TableRead",
    "WriteSpec",
    "check_once_per_version",
    "delta_table",
    "write_spec_from_metadata",
    "latest_materialization_metadata",
    "markdown_preview",
    "spark_table_schema",
    "table_metadata",
]
