"""pandas, polars and Arrow objects in and out of the Delta IO manager, without Spark.

The IO manager's second family of type handlers, next to
:class:`~medallion_assets.io_manager.manager.SparkDataFrameTypeHandler`, split
as dagster-deltalake splits its own:
:class:`~medallion_assets.storage.arrow_client.ArrowDeltaClient` reads and
writes a table with ``deltalake``; one handler per library converts between
its objects and Arrow. An asset input annotated ``pandas.DataFrame``,
``polars.DataFrame``, ``polars.LazyFrame``, ``pyarrow.Table`` or
``pyarrow.dataset.Dataset`` is loaded by these, and such an output is stored
by them, without a SparkSession.

pandas and polars are imported only when an asset uses them.
"""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds

# ---- one handler per DataFrame library ------------------------------------------------------


class ArrowTypeHandler:
    """``pyarrow.Table`` and ``pyarrow.dataset.Dataset`` (lazy: the asset decides what it scans)."""

    def handles(self, kind: Any) -> bool:
        """Whether an input annotated ``kind`` is loaded by this handler."""
        return isinstance(kind, type) and issubclass(kind, (pa.Table, ds.Dataset))

    def handles_object(self, obj: Any) -> bool:
        """Whether an output value is stored by this handler."""
        return isinstance(obj, (pa.Table, pa.RecordBatchReader, ds.Dataset))

    def from_dataset(self, dataset: ds.Dataset, kind: type) -> Any:
        """The loaded input as ``kind``."""
        return dataset if issubclass(kind, ds.Dataset) else dataset.to_table()

    def to_arrow(self, obj: Any) -> pa.Table:
        """The output as an Arrow table."""
        return (
            obj.to_table()
            if isinstance(obj, ds.Dataset)
            else obj.read_all()
            if isinstance(obj, pa.RecordBatchReader)
            else obj
        )


class PandasTypeHandler:
    """``pandas.DataFrame`` (the index is not stored)."""

    def handles(self, kind: Any) -> bool:
        """Whether an input annotated ``kind`` is loaded by this handler."""
        import pandas as pd  # deferred: a heavy import, paid only where an asset asks for pandas

        return isinstance(kind, type) and issubclass(kind, pd.DataFrame)

    def handles_object(self, obj: Any) -> bool:
        """Whether an output value is stored by this handler."""
        import pandas as pd  # deferred: a heavy import, paid only where an asset asks for pandas

        return isinstance(obj, pd.DataFrame)

    def from_dataset(self, dataset: ds.Dataset, kind: type) -> Any:
        """The loaded input as a pandas DataFrame."""
        return dataset.to_table().to_pandas()

    def to_arrow(self, obj: Any) -> pa.Table:
        """The output as an Arrow table."""
        return pa.Table.from_pandas(obj, preserve_index=False)


class PolarsTypeHandler:
    """``polars.DataFrame`` and ``polars.LazyFrame`` (scans the dataset lazily)."""

    @staticmethod
    def _polars() -> Any:
        # Only an asset that uses polars has imported it: no import here for the others.
        return sys.modules.get("polars")

    def handles(self, kind: Any) -> bool:
        """Whether an input annotated ``kind`` is loaded by this handler."""
        pl = self._polars()
        return pl is not None and isinstance(kind, type) and issubclass(kind, (pl.DataFrame, pl.LazyFrame))

    def handles_object(self, obj: Any) -> bool:
        """Whether an output value is stored by this handler."""
        pl = self._polars()
        return pl is not None and isinstance(obj, (pl.DataFrame, pl.LazyFrame))

    def from_dataset(self, dataset: ds.Dataset, kind: type) -> Any:
        """The loaded input as a polars DataFrame or LazyFrame."""
        pl = self._polars()
        frame = pl.scan_pyarrow_dataset(dataset)
        return frame if issubclass(kind, pl.LazyFrame) else frame.collect()

    def to_arrow(self, obj: Any) -> pa.Table:
        """The output as an Arrow table."""
        pl = self._polars()
        return (obj.collect() if isinstance(obj, pl.LazyFrame) else obj).to_arrow()


HANDLERS = (PandasTypeHandler(), PolarsTypeHandler(), ArrowTypeHandler())


def handler_for_type(kind: Any) -> PandasTypeHandler | PolarsTypeHandler | ArrowTypeHandler | None:
    """The handler loading inputs annotated ``kind``, or ``None`` (the Spark path's)."""
    return next((handler for handler in HANDLERS if handler.handles(kind)), None)


def handler_for_object(obj: Any) -> PandasTypeHandler | PolarsTypeHandler | ArrowTypeHandler | None:
    """The handler storing output ``obj``, or ``None`` (the Spark path's)."""
    return next((handler for handler in HANDLERS if handler.handles_object(obj)), None)
