"""The landing simulator: a noisy, batched delivery of a TPC-H data set.

It generates TPC-H with ``tpchgen-cli`` and lands it under ``<landing>/``
exactly as docs/landing-contract.md describes, one batch per call:

- ``orders/batch-<NNNNN>-<PPP>.json``: NDJSON order events with their line
  items, delivered at least once, out of order, with orders that are inserted
  and later deleted, with bad lines, and with orders that parse but that
  TPC-H's drop expectations reject (an unknown status, quantities of zero).
- ``customers/batch-<NNNNN>.csv``: I/U/D customer changes, with late older
  updates, inserted-then-deleted customers, bad lines, and customers of an
  unknown market segment, which a drop expectation rejects.
- ``reference/<table>/batch-<NNNNN>.parquet``: full snapshots; a later batch
  may land a newer snapshot, and the newest one is always the TPC-H table.

Once every batch is landed, the state the contract defines, after the drop
expectations of TPC-H's feeds, equals the TPC-H tables the simulator started
from; after batch 1 alone it is a consistent partial state (every customer
exists, every landed order is complete).

The delivery is planned in chunks of :data:`.delivery.CHUNK_ROWS` source rows (orders,
with their line items, or customers), each from its own random stream derived
from the seed, and a batch is written while the source tables are streamed:
only one chunk's rows and lines are in memory at a time, whatever the scale
factor. A chunk's plan depends on nothing but the plan and the chunk, so a
batch is the same, byte for byte, whichever process lands it; which batch
comes next is kept in ``<landing>/_simulator_state.json`` (Spark's file
sources ignore names that start with ``_``). Within an order file, lines come
chunk by chunk (in order key ranges) and shuffled within a chunk. Files appear
atomically: they are written under a dot-name in their folder and renamed
into place.

The package is split along those seams: :mod:`.plan` (what determines a
delivery), :mod:`.source` (the TPC-H tables, generated and streamed),
:mod:`.noise` (planning every line of a chunk), :mod:`.render` (the lines as
text), :mod:`.delivery` (landing a batch and the delivery's state) and
:mod:`.cli` (the ``simulate`` command). What other code uses is imported here.
"""

from medallion_assets.pipelines.tpch.simulator.cli import add_simulate_parser, main, simulate_command
from medallion_assets.pipelines.tpch.simulator.delivery import (
    PUBLISHED_FOLDER,
    STATE_FILE_NAME,
    AllBatchesLandedError,
    LandedBatch,
    OrderEventsTo,
    land_all,
    land_next_batch,
)
from medallion_assets.pipelines.tpch.simulator.noise import DROPPED_CUSTOMER_SEGMENT, DROPPED_ORDER_STATUS
from medallion_assets.pipelines.tpch.simulator.plan import NoiseRates, SimulationPlan
from medallion_assets.pipelines.tpch.simulator.render import CUSTOMER_CSV_HEADER
from medallion_assets.pipelines.tpch.simulator.source import (
    default_work_dir,
    tpch_folder,
    tpch_tables,
    tpchgen_executable,
)

__all__ = [
    "CUSTOMER_CSV_HEADER",
    "DROPPED_CUSTOMER_SEGMENT",
    "DROPPED_ORDER_STATUS",
    "PUBLISHED_FOLDER",
    "STATE_FILE_NAME",
    "AllBatchesLandedError",
    "LandedBatch",
    "NoiseRates",
    "OrderEventsTo",
    "SimulationPlan",
    "add_simulate_parser",
    "default_work_dir",
    "land_all",
    "land_next_batch",
    "main",
    "simulate_command",
    "tpch_folder",
    "tpch_tables",
    "tpchgen_executable",
]
