"""Delta Lake for PySpark on Spark's Python Data Source API and delta-rs.

The surface copies delta-spark's: ``spark.read.format("delta")``,
``df.write.format("delta")``, ``readStream``/``writeStream`` and
:class:`DeltaTable`. See docs/delta-engines.md for the idioms that differ.
"""

from medallion_assets.delta._merge import DeltaMergeBuilder
from medallion_assets.delta._read import read_delta
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
)
from medallion_assets.delta.session import enable_delta, has_native_delta
from medallion_assets.delta.tables import DeltaOptimizeBuilder, DeltaTable, DeltaTableBuilder

__all__ = [
    "DeltaMergeBuilder",
    "append_micro_batches",
    "DeltaOptimizeBuilder",
    "DeltaTable",
    "DeltaTableBuilder",
    "ConcurrentWriteError",
    "ConstraintViolationError",
    "DeltaError",
    "DeltaOptionError",
    "NotADeltaTableError",
    "SchemaMismatchError",
    "UnsupportedFeatureError",
    "UnsupportedTypeError",
    "enable_delta",
    "has_native_delta",
    "read_delta",
    "write_delta",
]
