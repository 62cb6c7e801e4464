"""Planning the noisy delivery, one chunk of source rows at a time.

Every line a delivery lands (final versions, older versions, deletes,
phantoms, duplicates, bad lines, rows a drop expectation rejects) is planned
here as columns of numbers: its kind, the file or batch it goes to, its
source row, key, time and place in its file. A chunk's plan depends on
nothing but the plan and the chunk.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from medallion_assets.pipelines.tpch.simulator.plan import NoiseRates, SimulationPlan

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


class OrderLine(enum.IntEnum):
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


class CustomerLine(enum.IntEnum):
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


_BAD_ORDER_KINDS = np.arange(OrderLine.CUT_SHORT, OrderLine.BAD_ORDERDATE + 1)
_BAD_CUSTOMER_KINDS = np.arange(CustomerLine.CUT_SHORT, CustomerLine.BAD_UPDATED_AT + 1)


@dataclass(frozen=True)
class Lines:
    """Planned lines of one chunk; every field has one entry per line.

    Attributes:
        kind: An :class:`OrderLine` or :class:`CustomerLine` value.
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

    def take(self, rows: np.ndarray | slice) -> Lines:
        """The lines at ``rows`` (indices, a boolean mask or a slice)."""
        return Lines(**{name: values[rows] for name, values in self._columns().items()})

    def replace(self, **columns: np.ndarray) -> Lines:
        """A copy with some columns replaced."""
        return Lines(**{**self._columns(), **columns})

    def _columns(self) -> dict[str, np.ndarray]:
        return {item.name: getattr(self, item.name) for item in dataclasses.fields(self)}

    @staticmethod
    def concat(parts: Sequence[Lines]) -> Lines:
        """The lines of every part, in order."""
        names = [item.name for item in dataclasses.fields(Lines)]
        return Lines(**{name: np.concatenate([getattr(part, name) for part in parts]) for name in names})


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
) -> Lines:
    """Lines with the given columns (a single kind or cents for all), each with a random event id."""
    count = len(slot)
    uid = np.frombuffer(rng.bytes(count * uid_bytes), dtype=np.uint8).reshape(count, uid_bytes)
    return Lines(
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


def extra_keys_per_chunk(noise: NoiseRates, phantom_rate: float, chunk_rows: int) -> int:
    """Keys past TPC-H's that one chunk of ``chunk_rows`` source rows may use: its phantoms', then its dropped rows'."""
    return _count(phantom_rate, chunk_rows, 2) + _count(noise.dropped, chunk_rows, 2)


def _plan_dropped(
    plan: SimulationPlan, stream: int, chunk: int, *, kind: int, first_key: int, count: int, epoch: int, slots: int
) -> Lines:
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
        uid_bytes=16 if kind == OrderLine.DROPPED else 0,
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
    lines: Lines,
    noise: NoiseRates,
    redelivery_slot: np.ndarray,
    *,
    bad_kinds: np.ndarray,
    slots: int,
    keys: np.ndarray,
    uid_bytes: int = 16,
) -> Lines:
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
    every = Lines.concat([lines, again, bad])
    return every.replace(shuffle=rng.random(len(every)))


def plan_order_chunk(
    plan: SimulationPlan, chunk: int, order_keys: np.ndarray, order_days: np.ndarray, phantom_key: int
) -> Lines:
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
    final = _new_lines(rng, kind=OrderLine.FINAL, slot=final_slot, source=rows, key=order_keys, time=final_time)

    earlier = np.flatnonzero(rng.random(count) < noise.earlier_version)
    earlier_time = final_time[earlier] - rng.integers(3_600, 20 * _DAY, len(earlier))
    earlier_kind = np.where(rng.random(len(earlier)) < 0.2, OrderLine.DELETE, OrderLine.OLDER)
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
    late_kind = np.where(rng.random(len(late)) < 0.25, OrderLine.DELETE, OrderLine.OLDER)
    late_slot = rng.integers(final_slot[late] + 1, slots)
    late_cents = rng.integers(1, 100_000, len(late))
    stale_lines = _new_lines(
        rng, kind=late_kind, slot=late_slot, source=late, key=order_keys[late], time=late_time, cents=late_cents
    )

    phantoms = _count(noise.phantom, count, 2)
    keys, cloned, insert_time, delete_time, insert_slot, delete_slot = _plan_phantoms(
        rng, phantoms, first_key=phantom_key, count=count, epoch=_PHANTOM_ORDER_EPOCH, slots=slots
    )
    inserts = _new_lines(rng, kind=OrderLine.PHANTOM, slot=insert_slot, source=cloned, key=keys, time=insert_time)
    deletes = _new_lines(rng, kind=OrderLine.DELETE, slot=delete_slot, source=cloned, key=keys, time=delete_time)

    good = Lines.concat([final, older, stale_lines, inserts, deletes])
    redelivery = rng.integers(0, slots, len(good))
    noisy = _with_noise(rng, good, noise, redelivery, bad_kinds=_BAD_ORDER_KINDS, slots=slots, keys=order_keys)
    dropped = _plan_dropped(
        plan,
        2,
        chunk,
        kind=OrderLine.DROPPED,
        first_key=phantom_key + phantoms,
        count=count,
        epoch=_PHANTOM_ORDER_EPOCH,
        slots=slots,
    )
    return Lines.concat([noisy, dropped])


def plan_customer_chunk(plan: SimulationPlan, chunk: int, customer_keys: np.ndarray, phantom_key: int) -> Lines:
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
    final_kind = np.where(updated, CustomerLine.UPDATE, CustomerLine.INSERT)
    final = _new_lines(
        rng, kind=final_kind, slot=final_batch, source=rows, key=customer_keys, time=final_time, uid_bytes=no_uid
    )

    first = np.flatnonzero(updated)
    first_time = final_time[first] - rng.integers(60, 10 * _DAY, len(first))
    first_cents = rng.integers(1, 50_000, len(first))
    inserts = _new_lines(
        rng,
        kind=CustomerLine.OLDER_INSERT,
        slot=np.zeros(len(first), dtype=np.int64),
        source=first,
        key=customer_keys[first],
        time=first_time,
        cents=first_cents,
        uid_bytes=no_uid,
    )

    late = np.flatnonzero(rng.random(count) < noise.customer_stale)
    late_time = final_time[late] - rng.integers(1, 10 * _DAY, len(late))
    late_kind = np.where(rng.random(len(late)) < 0.25, CustomerLine.DELETE, CustomerLine.OLDER_UPDATE)
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
        kind=CustomerLine.PHANTOM_INSERT,
        slot=insert_batch,
        source=cloned,
        key=keys,
        time=insert_time,
        uid_bytes=no_uid,
    )
    phantom_deletes = _new_lines(
        rng, kind=CustomerLine.DELETE, slot=delete_batch, source=cloned, key=keys, time=delete_time, uid_bytes=no_uid
    )

    good = Lines.concat([final, inserts, stale, phantom_inserts, phantom_deletes])
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
        kind=CustomerLine.DROPPED_INSERT,
        first_key=phantom_key + phantoms,
        count=count,
        epoch=_CUSTOMER_EPOCH,
        slots=batches,
    )
    return Lines.concat([noisy, dropped])


def in_file_order(lines: Lines, slots: range) -> Lines:
    """The lines of ``slots``, grouped by slot and shuffled within each."""
    chosen = lines.take((lines.slot >= slots.start) & (lines.slot < slots.stop))
    return chosen.take(np.lexsort((chosen.shuffle, chosen.slot)))
