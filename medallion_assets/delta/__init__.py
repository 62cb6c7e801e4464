"""Delta Lake for PySpark on Spark's Python Data Source API and delta-rs: the delta-rs engine.

This module is the package's public API: the rest of the project imports
these names from ``medallion_assets.delta`` and nothing from its ``_``
modules, which may change without notice. See docs/delta-engines.md,
"The delta-rs engine's public API".

For Spark code (the surface copies delta-spark's):

* :func:`enable_delta` registers the ``delta`` format on a session;
  :func:`has_native_delta` tells whether the session has delta-spark instead.
* ``spark.read.format("delta")``, ``df.write.format("delta")``,
  ``readStream``/``writeStream``, :func:`read_delta` and :func:`write_delta`.
* :class:`DeltaTable` with its builders (:class:`DeltaMergeBuilder`,
  :class:`DeltaOptimizeBuilder`, :class:`DeltaTableBuilder`).
* :func:`append_micro_batches`: a streaming query's micro-batches appended
  through :func:`write_delta`, one commit each.
* The errors, all :class:`DeltaError`.

For the project's storage layer, which reads the log and writes with deltalake
beside Spark:

* snapshots: :func:`resolve_snapshot`, :func:`snapshot_dataframe`,
  :func:`read_added_rows`, :func:`latest_log_version`, :func:`normalize_path`,
  :func:`check_read_support`;
* deltalake's MERGE fed as the engine feeds it: :func:`conform_source`,
  :func:`add_assigned_fields`, :func:`grown_type`, :func:`map_values_grown_error`;
* options and SQL: :func:`parse_bytes`, :func:`load_datafusion`;
* the metastore: :data:`LOCATION_METADATA`, :func:`quoted`, :func:`stored_location`.
"""

from medallion_assets.delta._catalog import LOCATION_METADATA, quoted, stored_location
from medallion_assets.delta._engine import load_datafusion
from medallion_assets.delta._merge import DeltaMergeBuilder, add_assigned_fields, conform_source
from medallion_assets.delta._options import parse_bytes
from medallion_assets.delta._read import read_added_rows, read_delta, snapshot_dataframe
from medallion_assets.delta._schema import grown_type
from medallion_assets.delta._snapshot import check_read_support, normalize_path, resolve_snapshot
from medallion_assets.delta._streaming import latest_log_version
from medallion_assets.delta._write import append_micro_batches, write_delta
from medallion_assets.delta.errors import (
    ConcurrentWriteError,
    ConstraintViolationError,
    DeltaError,
    DeltaOptionError,
    NotADeltaTableError,
    SchemaMismatchError,
    UnsupportedFeatureError,
    UnsupportedTypeError,
    map_values_grown_error,
)
from medallion_assets.delta.session import enable_delta, has_native_delta
from medallion_assets.delta.tables import DeltaOptimizeBuilder, DeltaTable, DeltaTableBuilder

__all__ = [
    "LOCATION_METADATA",
    "ConcurrentWriteError",
    "ConstraintViolationError",
    "DeltaError",
    "DeltaMergeBuilder",
    "DeltaOptimizeBuilder",
    "DeltaOptionError",
    "DeltaTable",
    "DeltaTableBuilder",
    "NotADeltaTableError",
    "SchemaMismatchError",
    "UnsupportedFeatureError",
    "UnsupportedTypeError",
    "add_assigned_fields",
    "append_micro_batches",
    "check_read_support",
    "conform_source",
    "enable_delta",
    "grown_type",
    "has_native_delta",
    "latest_log_version",
    "load_datafusion",
    "map_values_grown_error",
    "normalize_path",
    "parse_bytes",
    "quoted",
    "read_added_rows",
    "read_delta",
    "resolve_snapshot",
    "snapshot_dataframe",
    "stored_location",
    "write_delta",
]
