"""Delta tables on a Spark session, without Dagster: the engines, the session plan, the writers and changes.

Invariants: :func:`~medallion_assets.storage.writers.choose_writer` is the one
place that decides who commits a write (the session's engine or deltalake), and
:class:`DeltaTableClient` is the road every write of a Spark DataFrame takes.
The modules are listed in the module map (docs/architecture.md, "Where each
concern lives").

Nothing here imports Dagster: the IO manager (:mod:`medallion_assets.io_manager`),
the bronze streams and the jobs use it alike.
"""

from medallion_assets.storage.arrow_client import ArrowDeltaClient
from medallion_assets.storage.changes import tombstone_path
from medallion_assets.storage.client import DeltaTableClient, TableDescription, WriteResult
from medallion_assets.storage.engines import CommitFacts, DeltaEngine, engine_for
from medallion_assets.storage.merge_clauses import MergeClause
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
