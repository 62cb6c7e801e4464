"""Inputs other than a plain DataFrame: :class:`TableRead` and :class:`ChangesWithTable`.

:class:`TableRead` is an input a step computes on with Spark, or without Spark
when delta-rs reads the version: as delta-rs' table at that version, whatever
its size (for DataFusion, which plans on it and streams what it reads), or as
Arrow in hand while it is small.

A check of a table of a few thousand rows (a key, a reference) through Spark
waits on the new version's Delta snapshot and a job of its own, for little
work on its rows; the same count over the version's key columns, read by
delta-rs, does not (docs/decisions/0002-checks-counted-by-datafusion.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import DataFrame

from medallion_assets.storage.arrow_client import ArrowDeltaClient

if TYPE_CHECKING:
    import deltalake

#: Rows up to which a :class:`TableRead` hands out Arrow (the IO manager's ``arrow_read_max_rows``): a
#: few columns of a million rows are tens of MB in the driver, whatever the lake's size.
ARROW_READ_MAX_ROWS = 1_000_000


@dataclass
class TableRead:
    """The version of an upstream table a step read, as Spark or, when delta-rs reads it, as delta-rs' table.

    Annotate an input (of an asset or an asset check) as ``TableRead`` and the
    Delta IO manager hands this instead of a DataFrame. It records the version
    read as it does for a DataFrame input, so :func:`check_once_per_version`
    sees the same reads either way.

    Attributes:
        path: the table's location.
        version: the version read; None when delta-rs cannot open the table
            (Spark read it, and the step's input metadata names the version).
        rows: rows of that version by its log's statistics; None when a file
            has none, or delta-rs cannot open the table (then only
            :attr:`frame` is offered).
        max_arrow_rows: :meth:`arrow` answers up to this many rows.

    Example:
        >>> def _unique(stored: TableRead):                      # doctest: +SKIP
        ...     keys = stored.arrow(["k"])
        ...     if keys is None:  # large, or not readable by delta-rs
        ...         return stored.frame.groupBy("k").count().where("count > 1").count()
        ...     return keys.group_by("k").aggregate([([], "count_all")]).num_rows
    """

    path: str
    version: int | None
    rows: int | None
    max_arrow_rows: int
    _spark_frame: Callable[[], DataFrame] = field(repr=False)
    _delta_table: deltalake.DeltaTable | None = field(default=None, repr=False)

    @cached_property
    def frame(self) -> DataFrame:
        """The version as a Spark DataFrame (lazy: nothing runs until an action)."""
        return self._spark_frame()

    @property
    def small(self) -> bool:
        """Whether :meth:`arrow` answers: delta-rs reads the table and it has at most :attr:`max_arrow_rows` rows."""
        return self._delta_table is not None and self.rows is not None and self.rows <= self.max_arrow_rows

    def arrow(self, columns: Sequence[str]) -> pa.Table | None:
        """``columns`` of the version as an Arrow table, read by delta-rs; None unless :attr:`small`."""
        if not self.small or self._delta_table is None:  # small: a table delta-rs opened
            return None
        return ArrowDeltaClient.pruned_dataset(self._delta_table, self.path, columns=columns).to_table()

    def delta_table(self) -> deltalake.DeltaTable | None:
        """The version as delta-rs opens it, whatever its size; nothing of its data is read yet.

        For an engine that plans on it and streams what it reads: DataFusion's
        ``register_table`` takes it. None when delta-rs cannot read the table,
        or the IO manager's ``arrow_read_max_rows`` is 0 (always Spark).
        """
        return None if self.max_arrow_rows == 0 else self._delta_table


@dataclass(frozen=True)
class ChangesWithTable:
    """What an upstream table gained since this step last consumed it, and the whole table.

    Annotate an input as ``ChangesWithTable`` and the Delta IO manager hands
    both, read at one version: :attr:`changes` as a ``delta/read: changes``
    input reads them (and the step's writes record what they consumed), and
    :attr:`table` at the version the changes end at. For a step that
    recomputes what the changes touch from everything stored about it, e.g.
    a history rebuilt for the keys that changed.

    Attributes:
        changes: rows inserted by the versions this step has not consumed (all
            of them the first time).
        table: every row of the table at the newest of those versions.

    Example:
        >>> def _history(bronze: ChangesWithTable):            # doctest: +SKIP
        ...     changed = bronze.changes.select("key").distinct()
        ...     return bronze.table.join(changed, "key", "left_semi")
    """

    changes: DataFrame
    table: DataFrame
