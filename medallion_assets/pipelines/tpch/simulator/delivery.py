"""Landing a batch: the files of each stream written while the source is streamed, and the state of the delivery."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from medallion_assets.pipelines.tpch.contract import (
    LANDING_STREAMS,
    REFERENCE_TABLES,
    TPCH_SCHEMAS,
)
from medallion_assets.pipelines.tpch.simulator.noise import (
    extra_keys_per_chunk,
    in_file_order,
    plan_customer_chunk,
    plan_order_chunk,
)
from medallion_assets.pipelines.tpch.simulator.plan import NoiseRates, SimulationPlan
from medallion_assets.pipelines.tpch.simulator.render import (
    CUSTOMER_CSV_HEADER,
    OLDER_SNAPSHOTS,
    customer_lines,
    older_snapshot,
    order_lines,
)
from medallion_assets.pipelines.tpch.simulator.source import (
    item_ranges,
    max_key,
    orders_with_lineitems,
    table_chunks,
    tpch_folder,
)

STATE_FILE_NAME = "_simulator_state.json"

#: Where order event files go when they are published to Kafka only: a record of what
#: was published, out of the file stream's folder (Spark skips names starting with ``_``).
PUBLISHED_FOLDER = "_published"

#: Where a batch's order events go: landed files, Kafka messages (one per line), or both.
OrderEventsTo = Literal["files", "kafka", "both"]

#: Source rows (orders or customers) planned together from one random stream.
#: Part of what a seed means: changing it changes every delivery.
CHUNK_ROWS = 1 << 16

# Lines rendered per call: bounds the memory of the text, not the output.
_RENDER_LINES = 1 << 14


class AllBatchesLandedError(RuntimeError):
    """Raised by :func:`land_next_batch` when the plan has no batch left."""


@dataclass(frozen=True)
class LandedBatch:
    """What one call of :func:`land_next_batch` landed.

    Attributes:
        batch: The batch number, from 1.
        batches: How many batches the plan has.
        files: The files written, in the order they were made visible.
    """

    batch: int
    batches: int
    files: tuple[Path, ...]

    @property
    def is_last(self) -> bool:
        """Whether this was the plan's last batch."""
        return self.batch == self.batches


def _snapshots_of_batch(plan: SimulationPlan, batch_index: int) -> list[tuple[str, bool]]:
    """(table, older?) of each snapshot a batch lands, in landing order."""
    if plan.batches == 1:
        return [(name, False) for name in sorted(REFERENCE_TABLES)] if batch_index == 0 else []
    # Batch 1 lands an older snapshot of part and supplier; the last batch
    # replaces it with the TPC-H one.
    if batch_index == 0:
        return [(name, name in OLDER_SNAPSHOTS) for name in sorted(REFERENCE_TABLES)]
    if batch_index == plan.batches - 1:
        return [(name, False) for name in sorted(OLDER_SNAPSHOTS)]
    return []


@contextlib.contextmanager
def _staged(targets: Sequence[Path]) -> Iterator[list[Path]]:
    """Dot-named staging paths for ``targets``, renamed into place in order when the block succeeds."""
    stagings = []
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        stagings.append(target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield stagings
        for staging, target in zip(stagings, targets, strict=False):
            os.replace(staging, target)
    finally:
        for staging in stagings:
            if staging.exists():
                staging.unlink()


def _write_strings(handle: BinaryIO, strings: pa.Array) -> None:
    """Write the UTF-8 bytes of every string back to back, straight from Arrow's buffers."""
    if len(strings) == 0:
        return
    if strings.type != pa.string():
        raise TypeError(f"expected a string array, got {strings.type}")
    _, offsets_buffer, data = strings.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32, count=len(strings) + 1, offset=strings.offset * 4)
    handle.write(memoryview(data)[offsets[0] : offsets[-1]])


def _land_snapshot(target: Path, folder: Path, name: str, older: bool) -> Path:
    """Land a reference snapshot (the TPC-H table, or its older version) at ``target``."""
    schema = TPCH_SCHEMAS[name]
    with _staged([target]) as (staging,), pq.ParquetWriter(staging, schema) as writer:
        for chunk in table_chunks(folder / f"{name}.parquet", schema, CHUNK_ROWS):
            writer.write_table(older_snapshot(name, chunk) if older else chunk)
    return target


def _slices(count: int) -> Iterator[slice]:
    """Slices of at most :data:`_RENDER_LINES` that cover ``range(count)``."""
    for start in range(0, count, _RENDER_LINES):
        yield slice(start, min(start + _RENDER_LINES, count))


def _land_customers(target: Path, folder: Path, plan: SimulationPlan, batch_index: int) -> Path:
    """Land a batch's customer change file at ``target``, one chunk of customers at a time."""
    path = folder / "customer.parquet"
    phantom_base = max_key(path, "c_custkey") + 1
    per_chunk = extra_keys_per_chunk(plan.noise, plan.noise.customer_phantom, CHUNK_ROWS)
    with _staged([target]) as (staging,), staging.open("wb") as handle:
        handle.write((",".join(CUSTOMER_CSV_HEADER) + "\n").encode("utf-8"))
        for chunk, customers in enumerate(table_chunks(path, TPCH_SCHEMAS["customer"], CHUNK_ROWS)):
            keys = customers["c_custkey"].to_numpy()
            planned = plan_customer_chunk(plan, chunk, keys, phantom_base + chunk * per_chunk)
            lines = in_file_order(planned, range(batch_index, batch_index + 1))
            for rows in _slices(len(lines)):
                _write_strings(handle, customer_lines(lines.take(rows), customers))
    return target


def _land_orders(targets: Sequence[Path], folder: Path, plan: SimulationPlan, batch_index: int) -> list[Path]:
    """Land a batch's order event files at ``targets``, one chunk of orders at a time.

    Every file of the batch is written in the same pass over the source, so
    the tables are read once per batch.
    """
    parts = plan.files_per_batch
    slots = range(batch_index * parts, (batch_index + 1) * parts)
    phantom_base = max_key(folder / "orders.parquet", "o_orderkey") + 1
    per_chunk = extra_keys_per_chunk(plan.noise, plan.noise.phantom, CHUNK_ROWS)
    with _staged(targets) as stagings, contextlib.ExitStack() as stack:
        handles = [stack.enter_context(staging.open("wb")) for staging in stagings]
        for chunk, (orders, lineitem) in enumerate(orders_with_lineitems(folder, CHUNK_ROWS)):
            item_starts, item_counts = item_ranges(orders, lineitem)
            keys = orders["o_orderkey"].to_numpy()
            days = orders["o_orderdate"].cast(pa.int32()).to_numpy()
            planned = plan_order_chunk(plan, chunk, keys, days, phantom_base + chunk * per_chunk)
            lines = in_file_order(planned, slots)
            bounds = np.searchsorted(lines.slot, np.arange(slots.start, slots.stop + 1))
            for part, handle in enumerate(handles):
                in_file = lines.take(slice(bounds[part], bounds[part + 1]))
                for rows in _slices(len(in_file)):
                    text = order_lines(in_file.take(rows), orders, lineitem, item_starts, item_counts)
                    _write_strings(handle, text)
            # Free this chunk before the next one is read, not after.
            del orders, lineitem
    return list(targets)


def _land_batch(
    landing: Path,
    plan: SimulationPlan,
    folder: Path,
    batch_index: int,
    order_events_to: OrderEventsTo = "files",
    publish: Callable[[Sequence[Path]], Any] | None = None,
) -> list[Path]:
    """Write one batch's files; references, then customers, then orders become visible.

    With ``order_events_to`` ``kafka`` the order files are written under
    ``_published/`` and every line is published by ``publish``; with ``both``
    they land and are published.
    """
    number = batch_index + 1
    written = [
        _land_snapshot(landing / "reference" / name / f"batch-{number:05d}.parquet", folder, name, older)
        for name, older in _snapshots_of_batch(plan, batch_index)
    ]
    customers, orders = LANDING_STREAMS["customers_cdc"], LANDING_STREAMS["orders_raw"]
    written.append(
        _land_customers(landing / customers.folder / f"batch-{number:05d}{customers.suffix}", folder, plan, batch_index)
    )
    order_folder = landing / (PUBLISHED_FOLDER if order_events_to == "kafka" else "") / orders.folder
    order_folder.mkdir(parents=True, exist_ok=True)
    targets = [
        order_folder / f"batch-{number:05d}-{part + 1:03d}{orders.suffix}" for part in range(plan.files_per_batch)
    ]
    order_files = _land_orders(targets, folder, plan, batch_index)
    if order_events_to != "files":
        if publish is None:
            raise ValueError(f"order events to {order_events_to!r} needs a Kafka publisher")
        # Before the state moves on: a failed publish lands the batch again next time
        # (a redelivery, which silver deduplicates), never skips it.
        publish(order_files)
    return written + order_files


def _read_state(landing: Path, plan: SimulationPlan) -> int:
    state_path = landing / STATE_FILE_NAME
    if not state_path.exists():
        return 0
    state = json.loads(state_path.read_text(encoding="utf-8"))
    if state["plan"] != plan.to_json():
        raise ValueError(
            f"{state_path} was written for plan {state['plan']}, not {plan.to_json()}; "
            "use a fresh landing folder for a different plan"
        )
    return int(state["landed_batches"])


def _write_state(landing: Path, plan: SimulationPlan, landed_batches: int) -> None:
    state = {"plan": plan.to_json(), "landed_batches": landed_batches}
    with _staged([landing / STATE_FILE_NAME]) as (staging,):
        staging.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8", newline="")


def _make_plan(
    scale_factor: float, batches: int, seed: int, noise: NoiseRates | None, files_per_batch: int
) -> SimulationPlan:
    return SimulationPlan(
        scale_factor=scale_factor,
        batches=batches,
        seed=seed,
        files_per_batch=files_per_batch,
        noise=noise or NoiseRates(),
    )


def land_next_batch(
    landing_dir: Path | str,
    *,
    scale_factor: float = 0.01,
    batches: int = 2,
    seed: int = 7,
    work_dir: Path | str | None = None,
    noise: NoiseRates | None = None,
    files_per_batch: int = 2,
    order_events_to: OrderEventsTo = "files",
    publish: Callable[[Sequence[Path]], Any] | None = None,
) -> LandedBatch:
    """Land the next batch of the delivery into ``landing_dir``.

    Args:
        landing_dir: The landing folder (``<lake root>/landing``).
        scale_factor: TPC-H scale factor.
        batches: Number of batches in the delivery.
        seed: Seed of the noise.
        work_dir: Cache folder of the generated TPC-H data.
        noise: Noise rates; the defaults of :class:`NoiseRates` if None.
        files_per_batch: Order event files per batch.
        order_events_to: ``files`` (landed), ``kafka`` (published by ``publish``,
            the files kept under ``_published/``) or ``both``.
        publish: Publishes the lines of order event files, e.g.
            ``functools.partial(medallion_assets.kafka.publish_files, kafka)``.

    Returns:
        The batch number and the files written.

    Raises:
        AllBatchesLandedError: When every batch of the plan is landed.
        ValueError: When the folder holds a delivery of a different plan.
    """
    landing = Path(landing_dir)
    plan = _make_plan(scale_factor, batches, seed, noise, files_per_batch)
    landed = _read_state(landing, plan)
    if landed >= plan.batches:
        raise AllBatchesLandedError(f"all {plan.batches} batches are already landed in {landing}")
    files = _land_batch(landing, plan, tpch_folder(work_dir, plan.scale_factor), landed, order_events_to, publish)
    _write_state(landing, plan, landed + 1)
    return LandedBatch(batch=landed + 1, batches=plan.batches, files=tuple(files))


def land_all(landing_dir: Path | str, **options: Any) -> list[LandedBatch]:
    """Land every batch not landed yet (none if all are).

    Args:
        landing_dir: The landing folder (``<lake root>/landing``).
        **options: The keyword arguments of :func:`land_next_batch`.

    Returns:
        The batches landed, in order.
    """
    landed: list[LandedBatch] = []
    while True:
        try:
            landed.append(land_next_batch(landing_dir, **options))
        except AllBatchesLandedError:
            return landed
