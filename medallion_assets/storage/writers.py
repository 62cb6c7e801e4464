"""Which writer commits a write: :func:`choose_writer`, the one place that decides.

Two writers commit a Spark DataFrame's rows:

* ``engine``: the session's Delta engine (delta-spark, or the delta-rs engine),
  chosen once per session by :mod:`.session`. It writes anything: any size,
  partitions, declared properties, new columns, any lake and any driver.
* ``deltalake``: :class:`~.arrow_client.ArrowDeltaClient`, which commits rows
  collected as Arrow from this process, without the jobs a Spark write runs
  whatever its rows. Only small writes, only to a lake on this machine's file
  system from a driver in this process (not Spark Connect), and only a table
  both writers would write alike.

pandas, polars and Arrow outputs have no Spark rows: deltalake writes them all,
by their type, with no choice to make.

When deltalake cannot commit a write it was given (a table feature it does not
write, another writer's commit in between), it has committed nothing and the
engine writes instead; that fallback is the caller's (:class:`~.client.DeltaTableClient`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from pyspark.sql import SparkSession

from medallion_assets.storage.arrow_client import DELTA_RS_CANNOT_READ, ArrowDeltaClient

log = logging.getLogger(__name__)

Writer = Literal["engine", "deltalake"]
#: What a write does to the table. ``empty_commit``: a commit without rows that records what a write consumed.
Operation = Literal["overwrite", "append", "merge", "empty_commit"]

#: Rows up to which a write of a Spark DataFrame is committed by deltalake (``WriterLimits.max_rows``,
#: the IO manager's ``arrow_write_max_rows``); the collected rows are what the driver holds meanwhile.
#: Why this size: docs/decisions/0001-small-writes-by-deltalake.md.
ARROW_WRITE_MAX_ROWS = 250_000

#: Files of a table's current version (bytes) up to which a small MERGE into it is run by deltalake
#: (``WriterLimits.max_merge_table_bytes``). deltalake rewrites the files holding matched keys in this
#: process, with no memory bound (a bound can deadlock it, see
#: :meth:`.ArrowDeltaClient.merge_into_existing`), so the process grows with them. Past this, the
#: session's engine merges, spilling in the JVM or spread over a cluster
#: (docs/decisions/0005-driver-memory-bounds.md).
ARROW_MERGE_MAX_TABLE_BYTES = 1024 * 1024 * 1024


@dataclass(frozen=True)
class WriterLimits:
    """How large a write deltalake may commit.

    Attributes:
        max_rows: rows of a write (an overwrite's output, an append, a MERGE's
            source), and rows of the table an overwrite replaces; 0: the engine
            commits every write.
        max_merge_table_bytes: bytes of files of a table deltalake may MERGE into.
    """

    max_rows: int = 0
    max_merge_table_bytes: int = ARROW_MERGE_MAX_TABLE_BYTES


@dataclass(frozen=True)
class Deployment:
    """Where a write runs, as far as deltalake can commit it.

    Attributes:
        local_lake: the table is on this machine's file system (deltalake writes from this process).
        driver_here: the session's driver runs in this process (a classic session, not Spark Connect),
            so collected rows need not cross a network.
    """

    local_lake: bool
    driver_here: bool

    @classmethod
    def of(cls, spark: SparkSession, path: str) -> Deployment:
        """The deployment of a write by ``spark`` to the table at ``path``."""
        return cls(local_lake="://" not in path, driver_here=hasattr(spark, "_jsparkSession"))


@dataclass(frozen=True)
class TableShape:
    """What of a write's declaration decides its writer.

    Attributes:
        partitioned: the table is declared with partition columns.
        declares_properties: the declaration names table properties (set when the table is created).
        replaces_partition: an overwrite of one partition (``replaceWhere``).
        adds_columns: the write grows the table's schema (a MERGE with schema evolution).
    """

    partitioned: bool = False
    declares_properties: bool = False
    replaces_partition: bool = False
    adds_columns: bool = False


class StoredTable:
    """The table a write goes to, measured only as far as :func:`choose_writer` asks.

    Args:
        path: the table's location.
        exists: whether a table is there (the session's engine answers).
    """

    def __init__(self, path: str, *, exists: Callable[[], bool]) -> None:
        self.path = path
        self._exists = exists

    @cached_property
    def exists(self) -> bool:
        """Whether a table is there."""
        return self._exists()

    @cached_property
    def rows(self) -> int | None:
        """Rows of the current version by its log's statistics.

        None when a file has none, or deltalake cannot read the table.
        """
        try:
            return ArrowDeltaClient().readable_rows(self.path)[1]
        except DELTA_RS_CANNOT_READ:
            return None

    @cached_property
    def files_bytes(self) -> int | None:
        """Bytes of the current version's files, from its log; None when deltalake cannot read it."""
        try:
            return ArrowDeltaClient().files_bytes(self.path)
        except DELTA_RS_CANNOT_READ as error:
            log.info("deltalake cannot read %s (%s); the session's engine writes it", self.path, error)
            return None


def choose_writer(
    operation: Operation,
    *,
    rows: int | None,
    table: StoredTable,
    shape: TableShape,
    deployment: Deployment,
    limits: WriterLimits,
) -> Writer:
    """Who commits a write of a Spark DataFrame's rows: the session's engine or deltalake.

    deltalake commits a write of at most ``limits.max_rows`` rows to an
    unpartitioned table, from a driver in this process to a local lake:

    * an overwrite of the whole table without declared properties, new or
      existing; an existing table must be one deltalake reads, of at most
      ``limits.max_rows`` rows (its size predicts the output's, so a large
      table is not computed once to find that out);
    * an append, or an empty commit, to an existing table (the engine creates
      a table, with its declaration's partitions and properties);
    * a MERGE that adds no column into an existing table of at most
      ``limits.max_merge_table_bytes`` of files (deltalake rewrites the
      matched files in this process).

    The engine commits everything else. The table is measured lazily, in that
    order, so a write the engine takes anyway reads nothing of it.

    Args:
        operation: what the write does.
        rows: the rows to write (a MERGE: an upper bound of its source's). An
            overwrite's rows are not known before it is computed: ask with
            ``None`` first, then, if the answer is deltalake, collect at most
            ``limits.max_rows + 1`` rows and ask again with their count.
        table: the table written to.
        shape: what of the declaration matters.
        deployment: where the write runs.
        limits: how large a write deltalake may commit.

    Example:
        >>> here = Deployment(local_lake=True, driver_here=True)
        >>> new = StoredTable("lake/t", exists=lambda: False)
        >>> choose_writer("overwrite", rows=10, table=new, shape=TableShape(), deployment=here,
        ...               limits=WriterLimits(max_rows=100))
        'deltalake'
        >>> choose_writer("append", rows=10, table=new, shape=TableShape(), deployment=here,
        ...               limits=WriterLimits(max_rows=100))
        'engine'
    """
    if (
        not limits.max_rows
        or not (deployment.local_lake and deployment.driver_here)
        or shape.partitioned
        or (rows is not None and rows > limits.max_rows)
    ):
        return "engine"
    if operation == "overwrite":
        if shape.declares_properties or shape.replaces_partition:
            return "engine"
        if table.exists and (table.rows is None or table.rows > limits.max_rows):
            return "engine"
        return "deltalake"
    if rows is None or shape.adds_columns or not table.exists:
        return "engine"
    if operation == "merge":
        size = table.files_bytes
        if size is None:
            return "engine"
        if size > limits.max_merge_table_bytes:
            log.info(
                "%s has %d bytes of files, more than the %d deltalake may rewrite in this process (the IO "
                "manager's arrow_merge_max_table_mb, MEDALLION_ARROW_MERGE_MAX_TABLE_MB); the session's "
                "engine merges",
                table.path,
                size,
                limits.max_merge_table_bytes,
            )
            return "engine"
    return "deltalake"
