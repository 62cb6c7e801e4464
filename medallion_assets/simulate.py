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
expectations of TPC-H's feeds, equals the TPC-H tables the simulator started from; after batch 1 alone it is a consistent
partial state (every customer exists, every landed order is complete).

The delivery is planned in chunks of :data:`CHUNK_ROWS` source rows (orders,
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
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Literal, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medallion_assets.contract import CUSTOMER_CSV_COLUMNS, LANDING_STREAMS, REFERENCE_TABLES, TPCH_SCHEMAS
from medallion_assets.settings import SettingsError, read_settings

#: Header of the customer change files, in contract order.
CUSTOMER_CSV_HEADER: tuple[str, ...] = CUSTOMER_CSV_COLUMNS

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

_DAY = 86_400


def _epoch_seconds(moment: datetime) -> int:
    return int(moment.timestamp())


# Bad lines carry an event time / update time later than any good one, so a
# pipeline that wrongly accepts one ends with a visibly wrong state.
_BAD_LINE_TIME = _epoch_seconds(datetime(2001, 1, 1, tzinfo=UTC))
# Phantom orders live in the last month of TPC-H order dates.
_PHANTOM_ORDER_EPOCH = _epoch_seconds(datetime(1998, 8, 1, tzinfo=UTC))
# Customer versions are timed after every order event; only their order matters.
_CUSTOMER_EPOCH = _epoch_seconds(datetime(1998, 9, 1, tzinfo=UTC))


class AllBatchesLandedError(RuntimeError):
    """Raised by :func:`land_next_batch` when the plan has no batch left."""


@dataclass(frozen=True)
class NoiseRates:
    """How noisy the delivery is; each rate is a share of the relevant rows.

    Attributes:
        duplicate: Share of events and customer changes delivered twice.
        earlier_version: Share of orders with an older version (sometimes a
            delete) delivered no later than their final version.
        stale_version: Share of orders with an older version (sometimes a
            delete) delivered in a later file than their final version.
        phantom: Extra orders, as a share of TPC-H orders, that are inserted
            and deleted again; some deletes arrive before their insert.
        bad_line: Share of lines that are malformed.
        customer_update: Share of customers inserted with older values and
            updated to their TPC-H values later.
        customer_stale: Share of customers with an older change (sometimes a
            delete) that arrives after the newer one.
        customer_phantom: Extra customers, as a share of TPC-H customers,
            inserted and deleted again.
        dropped: Extra orders and customers, as a share of the TPC-H ones,
            that parse but fail a drop expectation of TPC-H's feeds, each
            delivered once: an order with an unknown status whose line items
            all have a quantity of 0, a customer of an unknown market segment.
            Silver quarantines them, so the final state never holds them.
    """

    duplicate: float = 0.03
    earlier_version: float = 0.05
    stale_version: float = 0.03
    phantom: float = 0.01
    bad_line: float = 0.003
    customer_update: float = 0.05
    customer_stale: float = 0.03
    customer_phantom: float = 0.01
    dropped: float = 0.002


@dataclass(frozen=True)
class SimulationPlan:
    """Everything that determines a delivery: same plan, same files.

    Attributes:
        scale_factor: TPC-H scale factor (0.01 for tests).
        batches: Number of batches the delivery is split into.
        seed: Seed of every random choice.
        files_per_batch: Order event files per batch.
        noise: The noise rates.
    """

    scale_factor: float = 0.01
    batches: int = 2
    seed: int = 7
    files_per_batch: int = 2
    noise: NoiseRates = field(default_factory=NoiseRates)

    def __post_init__(self) -> None:
        if self.scale_factor <= 0:
            raise ValueError(f"scale_factor must be positive, got {self.scale_factor}")
        if self.batches < 1:
            raise ValueError(f"batches must be at least 1, got {self.batches}")
        if self.files_per_batch < 1:
            raise ValueError(f"files_per_batch must be at least 1, got {self.files_per_batch}")

    def to_json(self) -> dict[str, Any]:
        """The plan as a JSON-ready dict (stored in the state file)."""
        return dataclasses.asdict(self)


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


# --------------------------------------------------------------------------
# TPC-H source tables
# --------------------------------------------------------------------------


def tpchgen_executable() -> str:
    """The path of ``tpchgen-cli``: next to the interpreter, else on PATH.

    Raises:
        FileNotFoundError: When the generator is not installed.
    """
    beside_python = Path(sys.executable).parent / "tpchgen-cli"
    if beside_python.exists():
        return str(beside_python)
    on_path = shutil.which("tpchgen-cli")
    if on_path is None:
        raise FileNotFoundError("tpchgen-cli not found; install the tpchgen-cli package")
    return on_path


def default_work_dir() -> Path:
    """Where generated TPC-H data is cached when no work dir is given."""
    return Path(tempfile.gettempdir()) / "medallion_assets_tpch"


def _scale_factor_text(scale_factor: float) -> str:
    return format(Decimal(str(scale_factor)).normalize(), "f")


def tpch_folder(work_dir: Path | str | None = None, scale_factor: float = 0.01) -> Path:
    """The folder of the generated TPC-H Parquet files, generating them if needed.

    The generator runs once per scale factor and work dir; later calls find
    the cached files.

    Args:
        work_dir: Cache folder; defaults to :func:`default_work_dir`.
        scale_factor: TPC-H scale factor.

    Returns:
        A folder with ``<table>.parquet`` for every TPC-H table.
    """
    folder = Path(work_dir or default_work_dir()) / f"tpch-sf{_scale_factor_text(scale_factor)}"
    if not (folder / "_SUCCESS").exists():
        _generate_tpch(folder, scale_factor)
    return folder


def tpch_tables(work_dir: Path | str | None = None, scale_factor: float = 0.01) -> dict[str, pa.Table]:
    """The TPC-H tables at ``scale_factor``, with the contract's column types.

    This loads every table whole; the simulator itself streams them.

    Args:
        work_dir: Cache folder; defaults to :func:`default_work_dir`.
        scale_factor: TPC-H scale factor.

    Returns:
        Table name -> Arrow table cast to :data:`TPCH_SCHEMAS`.
    """
    folder = tpch_folder(work_dir, scale_factor)
    return {name: pq.read_table(folder / f"{name}.parquet").cast(schema) for name, schema in TPCH_SCHEMAS.items()}


def _generate_tpch(folder: Path, scale_factor: float) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Generate into a private folder and rename it into place, so concurrent
    # callers never read a half-written data set.
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        subprocess.run(
            [
                tpchgen_executable(),
                "parquet",
                "--scale-factor",
                _scale_factor_text(scale_factor),
                "--output-dir",
                str(staging),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        (staging / "_SUCCESS").touch()
        try:
            os.rename(staging, folder)
        except OSError:
            if not (folder / "_SUCCESS").exists():
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _table_chunks(path: Path, schema: pa.Schema, rows: int) -> Iterator[pa.Table]:
    """Stream a Parquet file in slices of exactly ``rows`` rows (the last one shorter).

    Slicing by row count, not by the file's row groups, keeps the plan (and so
    the output) independent of how the generator laid out its files.

    Args:
        path: The Parquet file.
        schema: The contract schema to cast to.
        rows: Rows per slice.

    Yields:
        Tables with one chunk per column.
    """
    pending: list[pa.RecordBatch] = []
    count = 0
    # Without pre-buffering the reader holds one column chunk at a time, not a row group.
    for batch in pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=rows):
        pending.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(pending)
            chunk = table.slice(0, rows).cast(schema).combine_chunks()
            rest = table.slice(rows)
            pending, count = rest.to_batches(), rest.num_rows
            # Hold nothing but the rest while the consumer works on the chunk.
            del table, rest
            yield chunk
    if count:
        yield pa.Table.from_batches(pending).cast(schema).combine_chunks()


def _orders_with_lineitems(folder: Path) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Stream orders in chunks of :data:`CHUNK_ROWS`, each with its line items.

    Both tables are sorted by order key (``tpchgen-cli`` writes them so), which
    lets one pass over each file pair them up.

    Yields:
        ``(orders, lineitem)``: the line items are those of the chunk's orders,
        in file order.

    Raises:
        ValueError: When the files are not sorted by order key.
    """
    lineitem_schema = TPCH_SCHEMAS["lineitem"]
    lineitem_chunks = _table_chunks(folder / "lineitem.parquet", lineitem_schema, CHUNK_ROWS)
    pending = lineitem_schema.empty_table()
    for orders in _table_chunks(folder / "orders.parquet", TPCH_SCHEMAS["orders"], CHUNK_ROWS):
        last_key = orders["o_orderkey"][-1].as_py()
        while pending.num_rows == 0 or pending["l_orderkey"][-1].as_py() <= last_key:
            more = next(lineitem_chunks, None)
            if more is None:
                break
            pending = pa.concat_tables([pending, more])
        split = int(np.searchsorted(pending["l_orderkey"].to_numpy(), last_key, side="right"))
        lineitem = pending.slice(0, split).combine_chunks()
        pending = pending.slice(split)
        yield orders, lineitem
    if pending.num_rows or next(lineitem_chunks, None) is not None:
        raise ValueError(f"{folder}: line items after the last order; expected files sorted by order key")


def _item_ranges(orders: pa.Table, lineitem: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Where each order's line items are in ``lineitem``: (first row, count).

    Raises:
        ValueError: When the rows are not sorted by order key or some line item
            has no order in the chunk.
    """
    order_keys = orders["o_orderkey"].to_numpy()
    item_keys = lineitem["l_orderkey"].to_numpy()
    if np.any(np.diff(order_keys) <= 0) or np.any(np.diff(item_keys) < 0):
        raise ValueError("TPC-H orders and lineitem must be sorted by order key")
    starts = np.searchsorted(item_keys, order_keys, side="left")
    counts = np.searchsorted(item_keys, order_keys, side="right") - starts
    if counts.sum() != len(item_keys):
        raise ValueError("a line item's order is missing from TPC-H orders")
    return starts, counts


def _max_key(path: Path, column: str) -> int:
    """The largest value of an integer column, read one column at a time."""
    largest = None
    for batch in pq.ParquetFile(path).iter_batches(columns=[column]):
        chunk_max = pc.max(batch.column(0)).as_py()
        if chunk_max is not None and (largest is None or chunk_max > largest):
            largest = chunk_max
    return 0 if largest is None else int(largest)


# --------------------------------------------------------------------------
# Planning the delivery, one chunk at a time
# --------------------------------------------------------------------------


class _OrderLine(enum.IntEnum):
    """What an order line carries."""

    FINAL = 0  # the TPC-H order
    OLDER = 1  # an older version of it
    DELETE = 2
    PHANTOM = 3  # an order that is no TPC-H order
    DROPPED = 4  # an order that is no TPC-H order, which TPC-H's drop expectations reject
    # Bad lines, one kind after the other: each way the contract names.
    CUT_SHORT = 8
    NO_KEY = 9
    KEY_TEXT = 10
    KEY_FRACTION = 11
    BAD_TOTALPRICE = 12
    BAD_EXTENDEDPRICE = 13
    BAD_SHIPPRIORITY = 14
    BAD_ORDERDATE = 15


class _CustomerLine(enum.IntEnum):
    """What a customer CSV row carries."""

    INSERT = 0  # I with the TPC-H values
    UPDATE = 1  # U with the TPC-H values
    OLDER_INSERT = 2  # I with older values
    OLDER_UPDATE = 3  # U with older values
    DELETE = 4
    PHANTOM_INSERT = 5  # a customer that is no TPC-H customer
    DROPPED_INSERT = 6  # a customer that is no TPC-H customer, of a market segment a drop expectation rejects
    # Bad lines, one kind after the other.
    CUT_SHORT = 8
    KEY_TEXT = 9
    BAD_ACCTBAL = 10
    BAD_OP = 11
    BAD_UPDATED_AT = 12


_BAD_ORDER_KINDS = np.arange(_OrderLine.CUT_SHORT, _OrderLine.BAD_ORDERDATE + 1)
_BAD_CUSTOMER_KINDS = np.arange(_CustomerLine.CUT_SHORT, _CustomerLine.BAD_UPDATED_AT + 1)


@dataclass(frozen=True)
class _Lines:
    """Planned lines of one chunk; every field has one entry per line.

    Attributes:
        kind: An :class:`_OrderLine` or :class:`_CustomerLine` value.
        slot: Orders: file position ``batch * files_per_batch + part``;
            customers: the batch (both from 0).
        source: Row of the chunk the line's values come from.
        key: The order key / customer key the line carries.
        time: Event time / update time, seconds since the epoch.
        cents: What an older version adds to the price / account balance.
        uid: Random bytes of the event id, shape (lines, 16); (lines, 0) for
            customers, which have none.
        shuffle: Sort key of the line within its file.
    """

    kind: np.ndarray
    slot: np.ndarray
    source: np.ndarray
    key: np.ndarray
    time: np.ndarray
    cents: np.ndarray
    uid: np.ndarray
    shuffle: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)

    def take(self, rows: np.ndarray | slice) -> _Lines:
        """The lines at ``rows`` (indices, a boolean mask or a slice)."""
        return _Lines(**{name: values[rows] for name, values in self._columns().items()})

    def replace(self, **columns: np.ndarray) -> _Lines:
        """A copy with some columns replaced."""
        return _Lines(**{**self._columns(), **columns})

    def _columns(self) -> dict[str, np.ndarray]:
        return {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}

    @staticmethod
    def concat(parts: Sequence[_Lines]) -> _Lines:
        """The lines of every part, in order."""
        names = [item.name for item in dataclasses.fields(_Lines)]
        return _Lines(**{name: np.concatenate([getattr(part, name) for part in parts]) for name in names})


def _new_lines(
    rng: np.random.Generator,
    *,
    kind: np.ndarray | int,
    slot: np.ndarray,
    source: np.ndarray,
    key: np.ndarray,
    time: np.ndarray,
    cents: np.ndarray | int = 0,
    uid_bytes: int = 16,
) -> _Lines:
    """Lines with the given columns (a single kind or cents for all), each with a random event id."""
    count = len(slot)
    uid = np.frombuffer(rng.bytes(count * uid_bytes), dtype=np.uint8).reshape(count, uid_bytes)
    return _Lines(
        kind=np.broadcast_to(np.asarray(kind, dtype=np.int8), (count,)).copy(),
        slot=slot.astype(np.int64),
        source=source.astype(np.int64),
        key=key.astype(np.int64),
        time=time.astype(np.int64),
        cents=np.broadcast_to(np.asarray(cents, dtype=np.int64), (count,)).copy(),
        uid=uid,
        shuffle=np.zeros(count),
    )


def _plan_phantoms(
    rng: np.random.Generator, phantoms: int, *, first_key: int, count: int, epoch: int, slots: int
) -> tuple[np.ndarray, ...]:
    """Rows that are inserted and later deleted, so the final state never holds them.

    Returns their keys (from ``first_key`` on), the source rows they copy, the
    insert and delete times, and the slots (files or batches) of the insert and
    of the delete. Mostly the delete comes later; sometimes it overtakes its insert.
    """
    keys = first_key + np.arange(phantoms)
    cloned = rng.integers(0, count, phantoms)
    insert_time = epoch + rng.integers(0, 30 * _DAY, phantoms)
    delete_time = insert_time + rng.integers(60, _DAY, phantoms)
    insert_slot = rng.integers(0, slots, phantoms)
    overtakes = (insert_slot > 0) & (rng.random(phantoms) < 0.3)
    delete_slot = np.where(overtakes, rng.integers(0, np.maximum(insert_slot, 1)), rng.integers(insert_slot, slots))
    return keys, cloned, insert_time, delete_time, insert_slot, delete_slot


#: The status of a dropped order (TPC-H's are O, F and P) and the market segment of a dropped customer.
DROPPED_ORDER_STATUS = "X"
DROPPED_CUSTOMER_SEGMENT = "UNKNOWN"


def _extra_keys_per_chunk(noise: NoiseRates, phantom_rate: float) -> int:
    """Keys past TPC-H's that one chunk may use: its phantoms', then its dropped rows'."""
    return _count(phantom_rate, CHUNK_ROWS, 2) + _count(noise.dropped, CHUNK_ROWS, 2)


def _plan_dropped(
    plan: SimulationPlan, stream: int, chunk: int, *, kind: int, first_key: int, count: int, epoch: int, slots: int
) -> _Lines:
    """Rows no TPC-H row, one line each, that a drop expectation rejects; keys from ``first_key`` on.

    From a random stream of their own, so the rest of the delivery is the same
    bytes with or without them.
    """
    rng = _rng(plan, stream, chunk)
    dropped = _count(plan.noise.dropped, count, 2)
    lines = _new_lines(
        rng,
        kind=kind,
        slot=rng.integers(0, slots, dropped),
        source=rng.integers(0, count, dropped),
        key=first_key + np.arange(dropped),
        time=epoch + rng.integers(0, 30 * _DAY, dropped),
        uid_bytes=16 if kind == _OrderLine.DROPPED else 0,
    )
    return lines.replace(shuffle=rng.random(dropped))


def _count(rate: float, rows: int, minimum: int) -> int:
    # A minimum keeps every kind of noise present even at tiny scale factors.
    return max(minimum, round(rate * rows))


def _rng(plan: SimulationPlan, stream: int, chunk: int) -> np.random.Generator:
    # Seed sequences take non-negative entropy: the sign goes in a word of its own.
    return np.random.default_rng([abs(plan.seed), int(plan.seed < 0), stream, chunk])


def _with_noise(
    rng: np.random.Generator,
    lines: _Lines,
    noise: NoiseRates,
    redelivery_slot: np.ndarray,
    *,
    bad_kinds: np.ndarray,
    slots: int,
    keys: np.ndarray,
    uid_bytes: int = 16,
) -> _Lines:
    """Add at-least-once duplicates and bad lines, and draw the in-file order.

    Args:
        rng: The chunk's random stream.
        lines: The good lines.
        noise: The rates of duplicates and bad lines.
        redelivery_slot: Per line of ``lines``, where its duplicate goes when
            it does not go to the same slot.
        bad_kinds: The kinds of bad line, used in turn (bad lines are never duplicated).
        slots: Files or batches a bad line can land in.
        keys: The chunk's keys; a bad line carries the key of the row it spoils.
        uid_bytes: Bytes of a bad line's random event id.
    """
    duplicates = _count(noise.duplicate, len(lines), 2)
    bad_count = _count(noise.bad_line, len(lines) + duplicates, len(bad_kinds))
    bad_source = rng.integers(0, len(keys), bad_count)
    bad = _new_lines(
        rng,
        kind=bad_kinds[np.arange(bad_count) % len(bad_kinds)],
        slot=rng.integers(0, slots, bad_count),
        source=bad_source,
        key=keys[bad_source],
        time=_BAD_LINE_TIME + np.arange(bad_count),
        uid_bytes=uid_bytes,
    )
    copies = rng.choice(len(lines), duplicates, replace=False)
    same_slot = rng.random(len(copies)) < 0.5
    again = lines.take(copies)
    again = again.replace(slot=np.where(same_slot, again.slot, redelivery_slot[copies]))
    every = _Lines.concat([lines, again, bad])
    return every.replace(shuffle=rng.random(len(every)))


def _plan_order_chunk(
    plan: SimulationPlan, chunk: int, order_keys: np.ndarray, order_days: np.ndarray, phantom_key: int
) -> _Lines:
    """Every order line made from one chunk of orders, for the whole delivery.

    Args:
        plan: The plan.
        chunk: The chunk's number, from 0.
        order_keys: The chunk's ``o_orderkey``.
        order_days: The chunk's ``o_orderdate`` in days since the epoch.
        phantom_key: The first key of the chunk's phantom orders.

    Returns:
        The lines, ``slot`` being the file position.
    """
    noise = plan.noise
    rng = _rng(plan, 0, chunk)
    count = len(order_keys)
    slots = plan.batches * plan.files_per_batch
    last = slots - 1
    rows = np.arange(count)

    final_time = (order_days.astype(np.int64) + 30) * _DAY + rng.integers(0, _DAY, count)
    final_slot = rng.integers(0, slots, count)
    stale = rng.random(count) < noise.stale_version if last > 0 else np.zeros(count, dtype=bool)
    # A stale version needs a later file than the final version.
    moved = stale & (final_slot == last)
    final_slot[moved] = rng.integers(0, max(last, 1), int(moved.sum()))
    final = _new_lines(rng, kind=_OrderLine.FINAL, slot=final_slot, source=rows, key=order_keys, time=final_time)

    earlier = np.flatnonzero(rng.random(count) < noise.earlier_version)
    earlier_time = final_time[earlier] - rng.integers(3_600, 20 * _DAY, len(earlier))
    earlier_kind = np.where(rng.random(len(earlier)) < 0.2, _OrderLine.DELETE, _OrderLine.OLDER)
    earlier_slot = rng.integers(0, final_slot[earlier] + 1)
    earlier_cents = rng.integers(1, 100_000, len(earlier))
    older = _new_lines(
        rng,
        kind=earlier_kind,
        slot=earlier_slot,
        source=earlier,
        key=order_keys[earlier],
        time=earlier_time,
        cents=earlier_cents,
    )

    late = np.flatnonzero(stale)
    late_time = final_time[late] - rng.integers(1, 20 * _DAY, len(late))
    late_kind = np.where(rng.random(len(late)) < 0.25, _OrderLine.DELETE, _OrderLine.OLDER)
    late_slot = rng.integers(final_slot[late] + 1, slots)
    late_cents = rng.integers(1, 100_000, len(late))
    stale_lines = _new_lines(
        rng, kind=late_kind, slot=late_slot, source=late, key=order_keys[late], time=late_time, cents=late_cents
    )

    phantoms = _count(noise.phantom, count, 2)
    keys, cloned, insert_time, delete_time, insert_slot, delete_slot = _plan_phantoms(
        rng, phantoms, first_key=phantom_key, count=count, epoch=_PHANTOM_ORDER_EPOCH, slots=slots
    )
    inserts = _new_lines(rng, kind=_OrderLine.PHANTOM, slot=insert_slot, source=cloned, key=keys, time=insert_time)
    deletes = _new_lines(rng, kind=_OrderLine.DELETE, slot=delete_slot, source=cloned, key=keys, time=delete_time)

    good = _Lines.concat([final, older, stale_lines, inserts, deletes])
    redelivery = rng.integers(0, slots, len(good))
    noisy = _with_noise(rng, good, noise, redelivery, bad_kinds=_BAD_ORDER_KINDS, slots=slots, keys=order_keys)
    dropped = _plan_dropped(
        plan,
        2,
        chunk,
        kind=_OrderLine.DROPPED,
        first_key=phantom_key + phantoms,
        count=count,
        epoch=_PHANTOM_ORDER_EPOCH,
        slots=slots,
    )
    return _Lines.concat([noisy, dropped])


def _plan_customer_chunk(plan: SimulationPlan, chunk: int, customer_keys: np.ndarray, phantom_key: int) -> _Lines:
    """Every customer row made from one chunk of customers, for the whole delivery.

    Every row that can make a TPC-H customer absent (a stale delete, or a
    duplicate of one) lands no earlier than the customer's final version, so
    that every customer exists after batch 1.

    Args:
        plan: The plan.
        chunk: The chunk's number, from 0.
        customer_keys: The chunk's ``c_custkey``.
        phantom_key: The first key of the chunk's phantom customers.

    Returns:
        The rows, ``slot`` being the batch.
    """
    noise = plan.noise
    rng = _rng(plan, 1, chunk)
    count = len(customer_keys)
    batches = plan.batches
    rows = np.arange(count)
    no_uid = 0

    final_time = _CUSTOMER_EPOCH + rng.integers(0, 30 * _DAY, count)
    updated = rng.random(count) < noise.customer_update
    final_batch = np.where(updated, rng.integers(0, batches, count), 0)
    final_kind = np.where(updated, _CustomerLine.UPDATE, _CustomerLine.INSERT)
    final = _new_lines(
        rng, kind=final_kind, slot=final_batch, source=rows, key=customer_keys, time=final_time, uid_bytes=no_uid
    )

    first = np.flatnonzero(updated)
    first_time = final_time[first] - rng.integers(60, 10 * _DAY, len(first))
    first_cents = rng.integers(1, 50_000, len(first))
    inserts = _new_lines(
        rng,
        kind=_CustomerLine.OLDER_INSERT,
        slot=np.zeros(len(first), dtype=np.int64),
        source=first,
        key=customer_keys[first],
        time=first_time,
        cents=first_cents,
        uid_bytes=no_uid,
    )

    late = np.flatnonzero(rng.random(count) < noise.customer_stale)
    late_time = final_time[late] - rng.integers(1, 10 * _DAY, len(late))
    late_kind = np.where(rng.random(len(late)) < 0.25, _CustomerLine.DELETE, _CustomerLine.OLDER_UPDATE)
    late_batch = rng.integers(final_batch[late], batches)
    late_cents = rng.integers(1, 50_000, len(late))
    stale = _new_lines(
        rng,
        kind=late_kind,
        slot=late_batch,
        source=late,
        key=customer_keys[late],
        time=late_time,
        cents=late_cents,
        uid_bytes=no_uid,
    )

    phantoms = _count(noise.customer_phantom, count, 2)
    keys, cloned, insert_time, delete_time, insert_batch, delete_batch = _plan_phantoms(
        rng, phantoms, first_key=phantom_key, count=count, epoch=_CUSTOMER_EPOCH, slots=batches
    )
    phantom_inserts = _new_lines(
        rng,
        kind=_CustomerLine.PHANTOM_INSERT,
        slot=insert_batch,
        source=cloned,
        key=keys,
        time=insert_time,
        uid_bytes=no_uid,
    )
    phantom_deletes = _new_lines(
        rng, kind=_CustomerLine.DELETE, slot=delete_batch, source=cloned, key=keys, time=delete_time, uid_bytes=no_uid
    )

    good = _Lines.concat([final, inserts, stale, phantom_inserts, phantom_deletes])
    # Redelivered, never earlier: an early copy of a stale delete would remove
    # a customer that batch 1's orders need.
    redelivery = rng.integers(good.slot, batches)
    noisy = _with_noise(
        rng, good, noise, redelivery, bad_kinds=_BAD_CUSTOMER_KINDS, slots=batches, keys=customer_keys, uid_bytes=no_uid
    )
    dropped = _plan_dropped(
        plan,
        3,
        chunk,
        kind=_CustomerLine.DROPPED_INSERT,
        first_key=phantom_key + phantoms,
        count=count,
        epoch=_CUSTOMER_EPOCH,
        slots=batches,
    )
    return _Lines.concat([noisy, dropped])


def _in_file_order(lines: _Lines, slots: range) -> _Lines:
    """The lines of ``slots``, grouped by slot and shuffled within each."""
    chosen = lines.take((lines.slot >= slots.start) & (lines.slot < slots.stop))
    return chosen.take(np.lexsort((chosen.shuffle, chosen.slot)))


# --------------------------------------------------------------------------
# Rendering lines (vectorized text)
# --------------------------------------------------------------------------

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_UUID_DIGIT_COLUMNS = np.array([column for column in range(36) if column not in (8, 13, 18, 23)])
_JSON_ESCAPES = {"\\": "\\\\", '"': '\\"', **{chr(code): f"\\u{code:04x}" for code in range(32)}}


def _uuid4_texts(random_bytes: np.ndarray) -> pa.Array:
    """Version 4 UUIDs in their canonical text form, from 16 random bytes each."""
    raw = random_bytes.copy()
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    digits = np.empty((len(raw), 32), dtype=np.uint8)
    digits[:, 0::2] = _HEX_DIGITS[raw >> 4]
    digits[:, 1::2] = _HEX_DIGITS[raw & 0x0F]
    text = np.full((len(raw), 36), ord("-"), dtype=np.uint8)
    text[:, _UUID_DIGIT_COLUMNS] = digits
    offsets = np.arange(len(raw) + 1, dtype=np.int32) * 36
    return pa.StringArray.from_buffers(len(raw), pa.py_buffer(offsets), pa.py_buffer(text))


def _timestamp_texts(seconds: np.ndarray) -> pa.Array:
    """Seconds since the epoch as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return pc.strftime(pa.array(seconds, pa.timestamp("s")), format="%Y-%m-%dT%H:%M:%SZ")


def _key_texts(keys: np.ndarray) -> pa.Array:
    return pa.array(keys).cast(pa.string())


def _json_escaped(values: pa.Array) -> pa.Array:
    """String values as they go between the quotes of a JSON string."""
    if not pc.any(pc.match_substring_regex(values, r'[\x00-\x1f"\\]')).as_py():
        return values  # TPC-H text never needs escaping: skip the passes
    for character, escape in _JSON_ESCAPES.items():
        values = pc.replace_substring(values, character, escape)
    return values


def _csv_field(values: pa.Array) -> pa.Array:
    """Values as RFC 4180 fields, quoted only when they must be (like Python's csv)."""
    needs_quotes = pc.match_substring_regex(values, r'[",\r\n]')
    if not pc.any(needs_quotes).as_py():
        return values
    quoted = pc.binary_join_element_wise('"', pc.replace_substring(values, '"', '""'), '"', "")
    return pc.if_else(needs_quotes, quoted, values)


def _value_texts(table: pa.Table) -> dict[str, pa.Array]:
    """Each column's values as JSON text: strings escaped (quotes not included), others cast."""
    texts = {}
    for column in table.schema:
        values = table[column.name].combine_chunks()
        texts[column.name] = _json_escaped(values) if pa.types.is_string(column.type) else values.cast(pa.string())
    return texts


def _rows(values: pa.Array | pa.ChunkedArray, mask: np.ndarray) -> pa.Array:
    """The values under ``mask``, as one array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    # take is several times faster than a boolean filter on long string arrays.
    return values.take(np.flatnonzero(mask))


def _merged(count: int, parts: Sequence[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """Gather ``count`` rows from parts, in one copy.

    Args:
        count: Rows of the result.
        parts: ``(rows, values)``: ``values[i]`` goes to row ``rows[i]``, or a
            single value goes to every row of ``rows``; a later part wins.
    """
    index = np.zeros(count, dtype=np.int64)
    arrays = []
    start = 0
    for rows, values in parts:
        if len(rows) == 0:
            continue
        index[rows] = start + (np.arange(len(rows)) if len(values) == len(rows) else 0)
        arrays.append(values)
        start += len(values)
    if not arrays:
        return pa.array([], pa.string())
    return pa.concat_arrays(arrays).take(index)


def _patched(values: pa.Array, *patches: tuple[np.ndarray, pa.Array | str | None]) -> pa.Array:
    """``values`` with the rows under each mask replaced, in one copy.

    Args:
        values: The text array.
        patches: ``(mask, replacement)``: one value per masked row, or one
            text (None for null) for all of them; a later patch wins.
    """
    parts = [(np.arange(len(values)), values)]
    for mask, replacement in patches:
        if isinstance(replacement, str) or replacement is None:
            replacement = pa.array([replacement], pa.string())
        parts.append((np.flatnonzero(mask), replacement))
    if all(len(rows) == 0 for rows, _ in parts[1:]):
        return values
    return _merged(len(values), parts)


def _plus_cents(amounts: pa.Array, cents: np.ndarray | int) -> pa.Array:
    """decimal(15,2) amounts plus some cents, as decimal(15,2)."""
    cents = np.broadcast_to(np.asarray(cents, dtype=np.int32), (len(amounts),))
    # int32 -> decimal(10,0) is exact; times 0.01 gives the cents as decimal(13,2).
    delta = pc.multiply(pa.array(cents).cast(pa.decimal128(10, 0)), pa.scalar(Decimal("0.01")))
    return pc.add(amounts, delta).cast(amounts.type)


@dataclass(frozen=True)
class _Member:
    """A member of a JSON object rendered from text arrays.

    Attributes:
        name: Its name, and the key of its value text.
        open: Text before the value text (a quote, a bracket, or nothing).
        close: Text after it.
        members: For an object value, its members (rendered in its place).
    """

    name: str
    open: str = ""
    close: str = ""
    members: tuple[_Member, ...] = ()


def _members(schema: pa.Schema, skip: Sequence[str] = ()) -> tuple[_Member, ...]:
    # Integers are JSON numbers; amounts, dates and text are JSON strings.
    return tuple(
        _Member(column.name) if pa.types.is_integer(column.type) else _Member(column.name, '"', '"')
        for column in schema
        if column.name not in skip
    )


def _object_pieces(members: Sequence[_Member], texts: Mapping[str, pa.Array | str]) -> list[pa.Array | str]:
    """Constant texts and value texts that, concatenated, make the object."""
    pieces: list[pa.Array | str] = ["{"]
    for index, member in enumerate(members):
        pieces.append(f'{"," if index else ""}"{member.name}":{member.open}')
        pieces += _object_pieces(member.members, texts) if member.members else [texts[member.name]]
        pieces.append(member.close)
    pieces.append("}")
    return pieces


def _render(
    members: Sequence[_Member],
    texts: Mapping[str, pa.Array | str],
    prefix: pa.Array | str = "",
    suffix: str = "",
) -> pa.Array:
    """One JSON object per row, written in a single concatenation pass.

    Args:
        members: The object's members, in order.
        texts: Value text of each member, as an array or one text for all rows.
        prefix: Text before each object.
        suffix: Text after each object.
    """
    pieces: list[pa.Array | str] = []
    for piece in [prefix, *_object_pieces(members, texts), suffix]:
        # Each piece costs a pass over the rows: merge neighbouring constants.
        if isinstance(piece, str) and pieces and isinstance(pieces[-1], str):
            pieces[-1] += piece
        elif not (isinstance(piece, str) and piece == ""):
            pieces.append(piece)
    return pc.binary_join_element_wise(*pieces, "")


def _concatenated_runs(strings: pa.Array, runs: np.ndarray) -> pa.Array:
    """Row ``i``: ``strings[runs[i]:runs[i + 1]]`` back to back, as a view of the same bytes."""
    if len(strings) == 0:
        return pa.array([""] * (len(runs) - 1), pa.string())
    _, offsets, data = strings.buffers()
    value_offsets = np.frombuffer(offsets, dtype=np.int32, count=len(strings) + 1, offset=strings.offset * 4)
    return pa.StringArray.from_buffers(len(runs) - 1, pa.py_buffer(value_offsets[runs].astype(np.int32)), data)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``range(start, start + count)`` and where each range begins in it."""
    offsets = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1]), offsets


_ENVELOPE = (_Member("event_id", '"', '"'), _Member("event_time", '"', '"'), _Member("op", '"', '"'))
_LINEITEM = _members(TPCH_SCHEMAS["lineitem"], skip=("l_orderkey",))
_UPSERT_EVENT = _ENVELOPE + (
    _Member("order", members=_members(TPCH_SCHEMAS["orders"]) + (_Member("lineitems", "[", "]"),)),
)
_DELETE_EVENT = _ENVELOPE + (_Member("order", members=(_Member("o_orderkey"),)),)


def _lineitem_arrays(lines: _Lines, lineitem: pa.Table, item_starts: np.ndarray, item_counts: np.ndarray) -> pa.Array:
    """The text inside each upsert line's ``lineitems`` array."""
    kind = lines.kind
    older = kind == _OrderLine.OLDER
    counts = item_counts[lines.source]
    # An older version lacks the last line item, when there is more than one.
    kept = counts - (older & (counts > 1))
    item_rows, runs = _ranges(item_starts[lines.source], kept)
    items = lineitem.take(item_rows)
    texts = _value_texts(items)
    first = np.zeros(len(item_rows), dtype=bool)
    first[runs[:-1][kept > 0]] = True
    older_first = first & np.repeat(older, kept)
    quantity = _plus_cents(_rows(items["l_quantity"], older_first), 100)
    texts["l_quantity"] = _patched(texts["l_quantity"], (older_first, quantity.cast(pa.string())))
    bad_price = first & np.repeat(kind == _OrderLine.BAD_EXTENDEDPRICE, kept)
    texts["l_extendedprice"] = _patched(texts["l_extendedprice"], (bad_price, "N/A"))
    # Every line item of a dropped order fails lineitem_quantity_positive, so none outlives its order.
    texts["l_quantity"] = _patched(texts["l_quantity"], (np.repeat(kind == _OrderLine.DROPPED, kept), "0.00"))
    # Every item but an order's first brings its separating comma, so an
    # order's items are one contiguous run of bytes: no join per order needed.
    separators = pc.if_else(pa.array(first), "", ",")
    return _concatenated_runs(_render(_LINEITEM, texts, prefix=separators), runs)


def _upsert_lines(
    lines: _Lines, orders: pa.Table, lineitem: pa.Table, item_starts: np.ndarray, item_counts: np.ndarray
) -> pa.Array:
    """The NDJSON text of upsert lines (good or bad, not cut short yet)."""
    kind = lines.kind
    older = kind == _OrderLine.OLDER
    chosen = orders.take(lines.source)
    texts: dict[str, pa.Array | str] = dict(_value_texts(chosen))
    key_text = _key_texts(lines.key)
    key_as_text, key_as_fraction = kind == _OrderLine.KEY_TEXT, kind == _OrderLine.KEY_FRACTION
    texts["o_orderkey"] = _patched(
        key_text,
        # A JSON number: a text value brings its own quotes.
        (key_as_text, pc.binary_join_element_wise('"', _rows(key_text, key_as_text), 'x"', "")),
        (key_as_fraction, pc.binary_join_element_wise(_rows(key_text, key_as_fraction), ".5", "")),
    )
    status = _rows(chosen["o_orderstatus"], older)
    price = _plus_cents(_rows(chosen["o_totalprice"], older), lines.cents[older])
    texts["o_orderstatus"] = _patched(
        texts["o_orderstatus"],
        (older, pc.if_else(pc.not_equal(status, "P"), "P", "O")),
        (kind == _OrderLine.DROPPED, DROPPED_ORDER_STATUS),
    )
    texts["o_totalprice"] = _patched(
        texts["o_totalprice"], (older, price.cast(pa.string())), (kind == _OrderLine.BAD_TOTALPRICE, "12,50")
    )
    texts["o_comment"] = _patched(
        texts["o_comment"],
        (kind == _OrderLine.PHANTOM, "phantom order, deleted later"),
        (kind == _OrderLine.DROPPED, "unknown status, silver drops it"),
    )
    texts["o_shippriority"] = _patched(texts["o_shippriority"], (kind == _OrderLine.BAD_SHIPPRIORITY, '"high"'))
    texts["o_orderdate"] = _patched(texts["o_orderdate"], (kind == _OrderLine.BAD_ORDERDATE, "1996-13-45"))
    texts["lineitems"] = _lineitem_arrays(lines, lineitem, item_starts, item_counts)
    texts.update(event_id=_uuid4_texts(lines.uid), event_time=_timestamp_texts(lines.time), op="upsert")
    return _render(_UPSERT_EVENT, texts, suffix="\n")


def _order_lines(
    lines: _Lines, orders: pa.Table, lineitem: pa.Table, item_starts: np.ndarray, item_counts: np.ndarray
) -> pa.Array:
    """The NDJSON text of ``lines`` (each with its newline), in their order."""
    delete = lines.kind == _OrderLine.DELETE
    delete_rows, upsert_rows = np.flatnonzero(delete), np.flatnonzero(~delete)
    deleted = lines.take(delete_rows)
    deletes = _render(
        _DELETE_EVENT,
        {
            "event_id": _uuid4_texts(deleted.uid),
            "event_time": _timestamp_texts(deleted.time),
            "op": "delete",
            "o_orderkey": _key_texts(deleted.key),
        },
        suffix="\n",
    )
    upserted = lines.take(upsert_rows)
    upserts = _upsert_lines(upserted, orders, lineitem, item_starts, item_counts)
    no_key = upserted.kind == _OrderLine.NO_KEY
    # o_orderkey is the order's first member: drop it up to its comma.
    keyless = pc.replace_substring_regex(_rows(upserts, no_key), r'"order":\{"o_orderkey":[^,]*,', '"order":{')
    cut = upserted.kind == _OrderLine.CUT_SHORT
    # Cut inside the order, so that the line is no JSON at all.
    short = pc.replace_substring_regex(_rows(upserts, cut), r',"lineitems":\[.*', ',"lineitems":[')
    return _merged(
        len(lines),
        [(delete_rows, deletes), (upsert_rows, upserts), (upsert_rows[no_key], keyless), (upsert_rows[cut], short)],
    )


def _customer_lines(lines: _Lines, customers: pa.Table) -> pa.Array:
    """The CSV records of ``lines`` (each with its newline), in their order."""
    kind = lines.kind
    chosen = customers.take(lines.source)
    texts = {name: chosen[name].combine_chunks().cast(pa.string()) for name in chosen.column_names}
    older = (kind == _CustomerLine.OLDER_INSERT) | (kind == _CustomerLine.OLDER_UPDATE)
    balance = _plus_cents(_rows(chosen["c_acctbal"], older), lines.cents[older])
    phone = pc.utf8_slice_codeunits(_rows(texts["c_phone"], older), 0, 3)
    segment = _rows(texts["c_mktsegment"], older)
    delete = kind == _CustomerLine.DELETE
    key_text = _key_texts(lines.key)
    key_as_text = kind == _CustomerLine.KEY_TEXT
    patches = {
        "c_acctbal": [(older, balance.cast(pa.string())), (kind == _CustomerLine.BAD_ACCTBAL, "12.3.4")],
        "c_address": [(older, pc.utf8_reverse(_rows(texts["c_address"], older)))],
        "c_phone": [(older, pc.binary_join_element_wise(phone, "000-000-0000", ""))],
        "c_mktsegment": [
            (older, pc.if_else(pc.not_equal(segment, "HOUSEHOLD"), "HOUSEHOLD", "MACHINERY")),
            (kind == _CustomerLine.DROPPED_INSERT, DROPPED_CUSTOMER_SEGMENT),
        ],
        "c_comment": [
            (kind == _CustomerLine.PHANTOM_INSERT, "phantom customer, deleted later"),
            (kind == _CustomerLine.DROPPED_INSERT, "unknown segment, silver drops it"),
        ],
    }
    for name in CUSTOMER_CSV_HEADER[2:-1]:
        # A delete carries its key only: the other fields stay empty.
        texts[name] = _patched(texts[name], *patches.get(name, []), (delete, None))
    texts["c_custkey"] = _patched(
        key_text, (key_as_text, pc.binary_join_element_wise(_rows(key_text, key_as_text), "x", ""))
    )
    inserts = np.isin(
        kind,
        [_CustomerLine.INSERT, _CustomerLine.OLDER_INSERT, _CustomerLine.PHANTOM_INSERT, _CustomerLine.DROPPED_INSERT],
    )
    texts["op"] = pa.array(np.select([inserts, delete, kind == _CustomerLine.BAD_OP], ["I", "D", "X"], "U"))
    texts["updated_at"] = _patched(_timestamp_texts(lines.time), (kind == _CustomerLine.BAD_UPDATED_AT, "yesterday"))
    fields = [_csv_field(texts[name]) for name in CUSTOMER_CSV_HEADER]
    records = pc.binary_join_element_wise(*fields, ",", null_handling="replace", null_replacement="")
    cut = kind == _CustomerLine.CUT_SHORT
    short = pc.binary_join_element_wise(_rows(texts["op"], cut), _rows(key_text, cut), "a line cut short", ",")
    return pc.binary_join_element_wise(_patched(records, (cut, short)), "\n", "")


def _older_snapshot(name: str, snapshot: pa.Table) -> pa.Table:
    """An older version of a reference snapshot, for the tables that have one."""
    if name == "part":
        price = snapshot["p_retailprice"].combine_chunks()
        older = _plus_cents(price, 100)
        return snapshot.set_column(snapshot.schema.get_field_index("p_retailprice"), "p_retailprice", older)
    if name == "supplier":
        comment = pc.binary_join_element_wise("old: ", snapshot["s_comment"].combine_chunks(), "")
        return snapshot.set_column(snapshot.schema.get_field_index("s_comment"), "s_comment", comment)
    return snapshot


_OLDER_SNAPSHOTS = ("part", "supplier")


def _snapshots_of_batch(plan: SimulationPlan, batch_index: int) -> list[tuple[str, bool]]:
    """(table, older?) of each snapshot a batch lands, in landing order."""
    if plan.batches == 1:
        return [(name, False) for name in sorted(REFERENCE_TABLES)] if batch_index == 0 else []
    # Batch 1 lands an older snapshot of part and supplier; the last batch
    # replaces it with the TPC-H one.
    if batch_index == 0:
        return [(name, name in _OLDER_SNAPSHOTS) for name in sorted(REFERENCE_TABLES)]
    if batch_index == plan.batches - 1:
        return [(name, False) for name in sorted(_OLDER_SNAPSHOTS)]
    return []


# --------------------------------------------------------------------------
# Writing files
# --------------------------------------------------------------------------


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
        for chunk in _table_chunks(folder / f"{name}.parquet", schema, CHUNK_ROWS):
            writer.write_table(_older_snapshot(name, chunk) if older else chunk)
    return target


def _slices(count: int) -> Iterator[slice]:
    """Slices of at most :data:`_RENDER_LINES` that cover ``range(count)``."""
    for start in range(0, count, _RENDER_LINES):
        yield slice(start, min(start + _RENDER_LINES, count))


def _land_customers(target: Path, folder: Path, plan: SimulationPlan, batch_index: int) -> Path:
    """Land a batch's customer change file at ``target``, one chunk of customers at a time."""
    path = folder / "customer.parquet"
    phantom_base = _max_key(path, "c_custkey") + 1
    per_chunk = _extra_keys_per_chunk(plan.noise, plan.noise.customer_phantom)
    with _staged([target]) as (staging,), staging.open("wb") as handle:
        handle.write((",".join(CUSTOMER_CSV_HEADER) + "\n").encode("utf-8"))
        for chunk, customers in enumerate(_table_chunks(path, TPCH_SCHEMAS["customer"], CHUNK_ROWS)):
            keys = customers["c_custkey"].to_numpy()
            planned = _plan_customer_chunk(plan, chunk, keys, phantom_base + chunk * per_chunk)
            lines = _in_file_order(planned, range(batch_index, batch_index + 1))
            for rows in _slices(len(lines)):
                _write_strings(handle, _customer_lines(lines.take(rows), customers))
    return target


def _land_orders(targets: Sequence[Path], folder: Path, plan: SimulationPlan, batch_index: int) -> list[Path]:
    """Land a batch's order event files at ``targets``, one chunk of orders at a time.

    Every file of the batch is written in the same pass over the source, so
    the tables are read once per batch.
    """
    parts = plan.files_per_batch
    slots = range(batch_index * parts, (batch_index + 1) * parts)
    phantom_base = _max_key(folder / "orders.parquet", "o_orderkey") + 1
    per_chunk = _extra_keys_per_chunk(plan.noise, plan.noise.phantom)
    with _staged(targets) as stagings, contextlib.ExitStack() as stack:
        handles = [stack.enter_context(staging.open("wb")) for staging in stagings]
        for chunk, (orders, lineitem) in enumerate(_orders_with_lineitems(folder)):
            item_starts, item_counts = _item_ranges(orders, lineitem)
            keys = orders["o_orderkey"].to_numpy()
            days = orders["o_orderdate"].cast(pa.int32()).to_numpy()
            planned = _plan_order_chunk(plan, chunk, keys, days, phantom_base + chunk * per_chunk)
            lines = _in_file_order(planned, slots)
            bounds = np.searchsorted(lines.slot, np.arange(slots.start, slots.stop + 1))
            for part, handle in enumerate(handles):
                in_file = lines.take(slice(bounds[part], bounds[part + 1]))
                for rows in _slices(len(in_file)):
                    text = _order_lines(in_file.take(rows), orders, lineitem, item_starts, item_counts)
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


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def add_simulate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``simulate`` command to an argparse sub-parser collection.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The new parser; its ``func`` default is :func:`simulate_command`.
    """
    parser = subparsers.add_parser("simulate", help="land the next batch of a noisy TPC-H delivery")
    parser.add_argument("--lake-root", default=None, help="lake root (default: $MEDALLION_LAKE_ROOT or ./lakehouse)")
    parser.add_argument("--scale-factor", type=float, default=0.01)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--all", action="store_true", help="land every remaining batch")
    parser.add_argument("--work-dir", default=None, help="cache folder for generated TPC-H data")
    parser.add_argument(
        "--order-events-to",
        choices=get_args(OrderEventsTo),
        default="files",
        help="land order events as files, publish them to Kafka (MEDALLION_KAFKA_BOOTSTRAP_SERVERS, "
        "MEDALLION_KAFKA_TOPIC), or both",
    )
    parser.set_defaults(func=simulate_command)
    return parser


def simulate_command(args: argparse.Namespace) -> int:
    """Run the ``simulate`` command; returns the process exit code."""
    try:
        settings = read_settings()
    except SettingsError as error:
        print(f"medallion-assets simulate: {error}", file=sys.stderr)
        return 2
    lake_root = Path(args.lake_root or settings.lake_root.location)
    landing = lake_root / "landing"
    options = dict(
        scale_factor=args.scale_factor,
        batches=args.batches,
        seed=args.seed,
        work_dir=args.work_dir,
        order_events_to=args.order_events_to,
    )
    if args.order_events_to != "files":
        import functools

        from medallion_assets.kafka import publish_files
        from medallion_assets.resources import kafka_resource

        kafka = kafka_resource(settings, resolved=True)
        options["publish"] = functools.partial(publish_files, kafka)
    if args.all:
        landed = land_all(landing, **options)
    else:
        try:
            landed = [land_next_batch(landing, **options)]
        except AllBatchesLandedError as error:
            print(error, file=sys.stderr)
            return 1
    for batch in landed:
        print(f"landed batch {batch.batch}/{batch.batches}: {len(batch.files)} files")
    if not landed:
        print(f"nothing to land: every batch is already in {landing}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m medallion_assets.simulate simulate ...``."""
    parser = argparse.ArgumentParser(prog="medallion-assets")
    add_simulate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
