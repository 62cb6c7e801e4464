"""Delta tables on a Spark session, without Dagster: the engines, the session plan, the writers and changes.

* ``engines``: the Delta engines behind one interface (:class:`DeltaEngine`):
  delta-spark, delta-spark over Spark Connect, the delta-rs engine.
* ``session``: the session plan: which engine a session is built for, and its
  jars (local, platform, Maven).
* ``arrow_client``: :class:`ArrowDeltaClient`, deltalake reading and writing a
  table in this process, without Spark.
* ``writers``: :func:`choose_writer`, the one place that decides who commits a
  write (the session's engine or deltalake).
* ``client``: :class:`DeltaTableClient`, every read and write of a table by a
  Spark session; the road every write takes.
* ``changes``: applying changes: MERGE clauses, merge strategies, replaced
  groups, tombstones.
* ``write_spec``: :class:`WriteSpec`, what a write is asked to do.

Nothing here imports Dagster: the IO manager (:mod:`medallion_assets.io_manager`),
the bronze streams and the jobs use it alike.
"""

from medallion_assets.storage.arrow_client import ArrowDeltaClient
from medallion_assets.storage.changes import MergeClause, tombstone_path
from medallion_assets.storage.client import DeltaTableClient, TableDescription, WriteResult
from medallion_assets.storage.engines import CommitFacts, DeltaEngine, engine_for
from medallion_assets.storage.write_spec import WriteSpec
from medallion_assets.storage.writers import Writer, WriterLimits, choose_writer

__all__ = [
    "ArrowDeltaClient",
    "CommitFacts",
    "DeltaEngine",
    "DeltaTableClient",
    "MergeClause",
    "TableDescription",
    "WriteResult",
    "WriteSpec",
    "Writer",
    "WriterLimits",
    "choose_writer",
    "engine_for",
    "tombstone_path",
]
