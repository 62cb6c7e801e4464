"""The landing simulator: a noisy, batched delivery of a TPC-H data set.

It generates TPC-H with ``tpchgen-cli`` and lands it under ``<landing>/``
exactly as LANDING_CONTRACT.md describes, one batch per call:

- ``orders/batch-<NNNNN>-<PPP>.json``: NDJSON order events with their line
  items, delivered at least once, out of order, with orders that are inserted
  and later deleted, and with bad lines.
- ``customers/batch-<NNNNN>.csv``: I/U/D customer changes, with late older
  updates, inserted-then-deleted customers and bad lines.
- ``reference/<table>/batch-<NNNNN>.parquet``: full snapshots; a later batch
  may land a newer snapshot, and the newest one is always the TPC-H table.

Once every batch is landed, the state the contract defines equals the TPC-H
tables the simulator started from; after batch 1 alone it is a consistent
partial state (every customer exists, every landed order is complete).

The whole delivery is planned from the seed on every call, so a batch is the
same whichever process lands it; which batch comes next is kept in
``<landing>/_simulator_state.json`` (Spark's file sources ignore names that
start with ``_``). Files appear atomically: they are written under a dot-name
in their folder and renamed into place.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from medallion_assets.contract import CUSTOMER_CSV_COLUMNS, REFERENCE_TABLES, TPCH_SCHEMAS

#: Reference tables landed as Parquet snapshots.

#: Header of the customer change files, in contract order.
CUSTOMER_CSV_HEADER: tuple[str, ...] = CUSTOMER_CSV_COLUMNS

STATE_FILE_NAME = "_simulator_state.json"

# Bad lines carry an event time / update time later than any good one, so a
# pipeline that wrongly accepts one ends with a visibly wrong state.
_BAD_LINE_TIME = datetime(2001, 1, 1, tzinfo=timezone.utc)
# Customer versions are timed after every order event; only their order matters.
_CUSTOMER_EPOCH = datetime(1998, 9, 1, tzinfo=timezone.utc)


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
    """

    duplicate: float = 0.03
    earlier_version: float = 0.05
    stale_version: float = 0.03
    phantom: float = 0.01
    bad_line: float = 0.003
    customer_update: float = 0.05
    customer_stale: float = 0.03
    customer_phantom: float = 0.01


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


def tpch_tables(work_dir: Path | str | None = None, scale_factor: float = 0.01) -> dict[str, pa.Table]:
    """The TPC-H tables at ``scale_factor``, with the contract's column types.

    The generator runs once per scale factor and work dir; later calls read
    the cached Parquet files.

    Args:
        work_dir: Cache folder; defaults to :func:`default_work_dir`.
        scale_factor: TPC-H scale factor.

    Returns:
        Table name -> Arrow table cast to :data:`TPCH_SCHEMAS`.
    """
    folder = Path(work_dir or default_work_dir()) / f"tpch-sf{_scale_factor_text(scale_factor)}"
    if not (folder / "_SUCCESS").exists():
        _generate_tpch(folder, scale_factor)
    return {
        name: pq.read_table(folder / f"{name}.parquet").cast(schema)
        for name, schema in TPCH_SCHEMAS.items()
    }


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


# --------------------------------------------------------------------------
# Planning the delivery
# --------------------------------------------------------------------------


@dataclass
class _Delivery:
    """All files of every batch, as text or Arrow tables."""

    # (batch index, part index) -> NDJSON lines
    order_lines: dict[tuple[int, int], list[str]]
    # batch index -> CSV rows (lists of fields), header excluded
    customer_rows: dict[int, list[list[str]]]
    # batch index -> table name -> snapshot
    snapshots: dict[int, dict[str, pa.Table]]


def _timestamp_text(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _event_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def _json_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return f"{value:.2f}"
    if isinstance(value, date):
        return value.isoformat()
    return value


def _order_body(order: dict[str, Any], lineitems: list[dict[str, Any]]) -> dict[str, Any]:
    body = {name: _json_value(value) for name, value in order.items()}
    body["lineitems"] = [
        {name: _json_value(value) for name, value in item.items() if name != "l_orderkey"}
        for item in lineitems
    ]
    return body


def _event_line(event_id: str, event_time: datetime, op: str, body: dict[str, Any]) -> str:
    event = {"event_id": event_id, "event_time": _timestamp_text(event_time), "op": op, "order": body}
    return json.dumps(event, separators=(",", ":"))


def _older_order_version(rng: random.Random, body: dict[str, Any]) -> dict[str, Any]:
    """A plausible earlier version of an order that differs from ``body``."""
    older = json.loads(json.dumps(body))
    older["o_orderstatus"] = "P" if body["o_orderstatus"] != "P" else "O"
    older["o_totalprice"] = f"{Decimal(body['o_totalprice']) + Decimal(rng.randrange(1, 100_000)) / 100:.2f}"
    items = older["lineitems"]
    if len(items) > 1:
        items.pop()
    items[0]["l_quantity"] = f"{Decimal(items[0]['l_quantity']) + 1:.2f}"
    return older


def _bad_order_lines(
    rng: random.Random, count: int, bodies: Sequence[dict[str, Any]]
) -> list[str]:
    """Lines that break the contract in each of the ways it names, in turn."""
    lines = []
    for index in range(count):
        body = json.loads(json.dumps(rng.choice(bodies)))
        event_time = _BAD_LINE_TIME + timedelta(seconds=index)
        kind = index % 8
        if kind == 0:
            good = _event_line(_event_id(rng), event_time, "upsert", body)
            lines.append(good[: len(good) // 2])  # truncated: not JSON
            continue
        if kind == 1:
            del body["o_orderkey"]
        elif kind == 2:
            body["o_orderkey"] = f"{body['o_orderkey']}x"
        elif kind == 3:
            body["o_orderkey"] = body["o_orderkey"] + 0.5
        elif kind == 4:
            body["o_totalprice"] = "12,50"
        elif kind == 5:
            body["lineitems"][0]["l_extendedprice"] = "N/A"
        elif kind == 6:
            body["o_shippriority"] = "high"
        else:
            body["o_orderdate"] = "1996-13-45"
        lines.append(_event_line(_event_id(rng), event_time, "upsert", body))
    return lines


def _plan_orders(
    plan: SimulationPlan, tables: dict[str, pa.Table], rng: random.Random
) -> dict[tuple[int, int], list[str]]:
    noise = plan.noise
    positions = [(b, p) for b in range(plan.batches) for p in range(plan.files_per_batch)]
    last = len(positions) - 1
    items_by_order: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for item in tables["lineitem"].to_pylist():
        items_by_order[item["l_orderkey"]].append(item)
    orders = tables["orders"].to_pylist()

    events: list[tuple[int, str]] = []  # (position index, line)
    bodies = []
    for order in orders:
        body = _order_body(order, items_by_order[order["o_orderkey"]])
        bodies.append(body)
        start = datetime.combine(order["o_orderdate"], time(), tzinfo=timezone.utc)
        final_time = start + timedelta(days=30, seconds=rng.randrange(86_400))
        final_pos = rng.randrange(len(positions))
        stale = last > 0 and rng.random() < noise.stale_version
        if stale and final_pos == last:
            final_pos = rng.randrange(last)
        events.append((final_pos, _event_line(_event_id(rng), final_time, "upsert", body)))
        if rng.random() < noise.earlier_version:
            older_time = final_time - timedelta(seconds=rng.randrange(3_600, 20 * 86_400))
            if rng.random() < 0.2:
                line = _event_line(_event_id(rng), older_time, "delete", {"o_orderkey": order["o_orderkey"]})
            else:
                line = _event_line(_event_id(rng), older_time, "upsert", _older_order_version(rng, body))
            events.append((rng.randrange(final_pos + 1), line))
        if stale:
            stale_time = final_time - timedelta(seconds=rng.randrange(1, 20 * 86_400))
            if rng.random() < 0.25:
                line = _event_line(_event_id(rng), stale_time, "delete", {"o_orderkey": order["o_orderkey"]})
            else:
                line = _event_line(_event_id(rng), stale_time, "upsert", _older_order_version(rng, body))
            events.append((rng.randrange(final_pos + 1, last + 1), line))

    # Orders that never were TPC-H orders: inserted, then deleted.
    next_key = max(order["o_orderkey"] for order in orders) + 1
    for offset in range(max(2, round(noise.phantom * len(orders)))):
        body = json.loads(json.dumps(rng.choice(bodies)))
        body["o_orderkey"] = next_key + offset
        body["o_comment"] = "phantom order, deleted later"
        insert_time = datetime(1998, 8, 1, tzinfo=timezone.utc) + timedelta(seconds=rng.randrange(86_400 * 30))
        delete_time = insert_time + timedelta(seconds=rng.randrange(60, 86_400))
        insert_pos = rng.randrange(len(positions))
        # Mostly the delete comes later; sometimes it overtakes its insert.
        if insert_pos > 0 and rng.random() < 0.3:
            delete_pos = rng.randrange(insert_pos)
        else:
            delete_pos = rng.randrange(insert_pos, last + 1)
        events.append((insert_pos, _event_line(_event_id(rng), insert_time, "upsert", body)))
        events.append(
            (delete_pos, _event_line(_event_id(rng), delete_time, "delete", {"o_orderkey": body["o_orderkey"]}))
        )

    # At-least-once delivery: the same line again, in the same or another file.
    for pos, line in rng.sample(events, max(2, round(noise.duplicate * len(events)))):
        events.append((pos if rng.random() < 0.5 else rng.randrange(last + 1), line))

    for line in _bad_order_lines(rng, max(8, round(noise.bad_line * len(events))), bodies):
        events.append((rng.randrange(last + 1), line))

    keyed = [(pos, rng.random(), line) for pos, line in events]
    keyed.sort(key=lambda row: (row[0], row[1]))
    order_lines: dict[tuple[int, int], list[str]] = {position: [] for position in positions}
    for pos, _, line in keyed:
        order_lines[positions[pos]].append(line)
    return order_lines


def _customer_row(op: str, customer: dict[str, Any], updated_at: datetime) -> list[str]:
    values = [
        "" if customer.get(name) is None else str(_json_value(customer[name]))
        for name in CUSTOMER_CSV_HEADER[1:-1]
    ]
    return [op, *values, _timestamp_text(updated_at)]


def _older_customer_version(rng: random.Random, customer: dict[str, Any]) -> dict[str, Any]:
    older = dict(customer)
    older["c_acctbal"] = customer["c_acctbal"] + Decimal(rng.randrange(1, 50_000)) / 100
    older["c_address"] = customer["c_address"][::-1]
    older["c_phone"] = customer["c_phone"][:3] + "000-000-0000"
    older["c_mktsegment"] = "HOUSEHOLD" if customer["c_mktsegment"] != "HOUSEHOLD" else "MACHINERY"
    return older


def _plan_customers(
    plan: SimulationPlan, tables: dict[str, pa.Table], rng: random.Random
) -> dict[int, list[list[str]]]:
    noise = plan.noise
    last = plan.batches - 1
    customers = tables["customer"].to_pylist()
    rows: list[tuple[int, list[str]]] = []
    for customer in customers:
        final_time = _CUSTOMER_EPOCH + timedelta(seconds=rng.randrange(86_400 * 30))
        key_only = {"c_custkey": customer["c_custkey"]}
        final_batch = 0
        # Every customer exists after batch 1, so batch 1 orders never dangle.
        if rng.random() < noise.customer_update:
            older_time = final_time - timedelta(seconds=rng.randrange(60, 86_400 * 10))
            rows.append((0, _customer_row("I", _older_customer_version(rng, customer), older_time)))
            final_batch = rng.randrange(last + 1)
            rows.append((final_batch, _customer_row("U", customer, final_time)))
        else:
            rows.append((0, _customer_row("I", customer, final_time)))
        if rng.random() < noise.customer_stale:
            stale_time = final_time - timedelta(seconds=rng.randrange(1, 86_400 * 10))
            if rng.random() < 0.25:
                row = _customer_row("D", key_only, stale_time)
            else:
                row = _customer_row("U", _older_customer_version(rng, customer), stale_time)
            rows.append((rng.randrange(final_batch, last + 1), row))

    next_key = max(customer["c_custkey"] for customer in customers) + 1
    for offset in range(max(2, round(noise.customer_phantom * len(customers)))):
        phantom = dict(rng.choice(customers))
        phantom["c_custkey"] = next_key + offset
        phantom["c_comment"] = "phantom customer, deleted later"
        insert_time = _CUSTOMER_EPOCH + timedelta(seconds=rng.randrange(86_400 * 30))
        delete_time = insert_time + timedelta(seconds=rng.randrange(60, 86_400))
        insert_batch = rng.randrange(last + 1)
        if insert_batch > 0 and rng.random() < 0.3:
            delete_batch = rng.randrange(insert_batch)
        else:
            delete_batch = rng.randrange(insert_batch, last + 1)
        rows.append((insert_batch, _customer_row("I", phantom, insert_time)))
        rows.append((delete_batch, _customer_row("D", {"c_custkey": phantom["c_custkey"]}, delete_time)))

    for batch, row in rng.sample(rows, max(2, round(noise.duplicate * len(rows)))):
        rows.append((batch if rng.random() < 0.5 else rng.randrange(last + 1), row))

    bad_count = max(5, round(noise.bad_line * len(rows)))
    for index in range(bad_count):
        customer = rng.choice(customers)
        row = _customer_row("U", customer, _BAD_LINE_TIME + timedelta(seconds=index))
        kind = index % 5
        if kind == 0:
            row = ["U", str(customer["c_custkey"]), "a line cut short"]
        elif kind == 1:
            row[1] = f"{customer['c_custkey']}x"
        elif kind == 2:
            row[6] = "12.3.4"
        elif kind == 3:
            row[0] = "X"
        else:
            row[9] = "yesterday"
        rows.append((rng.randrange(last + 1), row))

    keyed = [(batch, rng.random(), row) for batch, row in rows]
    keyed.sort(key=lambda item: (item[0], item[1]))
    by_batch: dict[int, list[list[str]]] = {batch: [] for batch in range(plan.batches)}
    for batch, _, row in keyed:
        by_batch[batch].append(row)
    return by_batch


def _plan_snapshots(plan: SimulationPlan, tables: dict[str, pa.Table]) -> dict[int, dict[str, pa.Table]]:
    final = {name: tables[name] for name in REFERENCE_TABLES}
    if plan.batches == 1:
        return {0: final}
    # Batch 1 lands an older snapshot of part and supplier; the last batch
    # replaces it with the TPC-H one.
    older = dict(final)
    part = final["part"]
    older["part"] = part.set_column(
        part.schema.get_field_index("p_retailprice"),
        "p_retailprice",
        pa.array([price + Decimal("1.00") for price in part["p_retailprice"].to_pylist()], part["p_retailprice"].type),
    )
    supplier = final["supplier"]
    older["supplier"] = supplier.set_column(
        supplier.schema.get_field_index("s_comment"),
        "s_comment",
        pa.array([f"old: {comment}" for comment in supplier["s_comment"].to_pylist()], pa.string()),
    )
    return {
        0: older,
        plan.batches - 1: {"part": final["part"], "supplier": final["supplier"]},
    }


def _plan_delivery(plan: SimulationPlan, tables: dict[str, pa.Table]) -> _Delivery:
    rng = random.Random(plan.seed)
    return _Delivery(
        order_lines=_plan_orders(plan, tables, rng),
        customer_rows=_plan_customers(plan, tables, rng),
        snapshots=_plan_snapshots(plan, tables),
    )


# --------------------------------------------------------------------------
# Writing files
# --------------------------------------------------------------------------


def _publish(target: Path, write: Callable[[Path], None]) -> Path:
    """Write through ``write(path)`` to a dot-name, then rename into place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.{uuid.uuid4().hex}.tmp"
    try:
        write(staging)
        os.replace(staging, target)
    finally:
        if staging.exists():
            staging.unlink()
    return target


def _write_text(text: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(text, encoding="utf-8", newline="")

    return write


def _csv_text(rows: list[list[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CUSTOMER_CSV_HEADER)
    writer.writerows(rows)
    return buffer.getvalue()


def _write_batch(landing: Path, plan: SimulationPlan, delivery: _Delivery, batch_index: int) -> list[Path]:
    number = batch_index + 1
    written = []
    for name, snapshot in sorted(delivery.snapshots.get(batch_index, {}).items()):
        target = landing / "reference" / name / f"batch-{number:05d}.parquet"
        written.append(_publish(target, lambda path, table=snapshot: pq.write_table(table, path)))
    rows = delivery.customer_rows[batch_index]
    written.append(_publish(landing / "customers" / f"batch-{number:05d}.csv", _write_text(_csv_text(rows))))
    for part in range(plan.files_per_batch):
        lines = delivery.order_lines[(batch_index, part)]
        target = landing / "orders" / f"batch-{number:05d}-{part + 1:03d}.json"
        written.append(_publish(target, _write_text("".join(f"{line}\n" for line in lines))))
    return written


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
    _publish(landing / STATE_FILE_NAME, _write_text(json.dumps(state, indent=2) + "\n"))


def _make_plan(scale_factor: float, batches: int, seed: int, noise: NoiseRates | None, files_per_batch: int) -> SimulationPlan:
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

    Returns:
        The batch number and the files made visible.

    Raises:
        AllBatchesLandedError: When every batch of the plan is landed.
        ValueError: When the folder holds a delivery of a different plan.
    """
    landing = Path(landing_dir)
    plan = _make_plan(scale_factor, batches, seed, noise, files_per_batch)
    landed = _read_state(landing, plan)
    if landed >= plan.batches:
        raise AllBatchesLandedError(f"all {plan.batches} batches are already landed in {landing}")
    delivery = _plan_delivery(plan, tpch_tables(work_dir, plan.scale_factor))
    files = _write_batch(landing, plan, delivery, landed)
    _write_state(landing, plan, landed + 1)
    return LandedBatch(batch=landed + 1, batches=plan.batches, files=tuple(files))


def land_all(
    landing_dir: Path | str,
    *,
    scale_factor: float = 0.01,
    batches: int = 2,
    seed: int = 7,
    work_dir: Path | str | None = None,
    noise: NoiseRates | None = None,
    files_per_batch: int = 2,
) -> list[LandedBatch]:
    """Land every batch not landed yet (none if all are); see :func:`land_next_batch`."""
    landing = Path(landing_dir)
    plan = _make_plan(scale_factor, batches, seed, noise, files_per_batch)
    landed = _read_state(landing, plan)
    if landed >= plan.batches:
        return []
    delivery = _plan_delivery(plan, tpch_tables(work_dir, plan.scale_factor))
    results = []
    for batch_index in range(landed, plan.batches):
        files = _write_batch(landing, plan, delivery, batch_index)
        _write_state(landing, plan, batch_index + 1)
        results.append(LandedBatch(batch=batch_index + 1, batches=plan.batches, files=tuple(files)))
    return results


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
    parser.set_defaults(func=simulate_command)
    return parser


def simulate_command(args: argparse.Namespace) -> int:
    """Run the ``simulate`` command; returns the process exit code."""
    lake_root = Path(args.lake_root or os.environ.get("MEDALLION_LAKE_ROOT") or "lakehouse")
    landing = lake_root / "landing"
    options = dict(scale_factor=args.scale_factor, batches=args.batches, seed=args.seed, work_dir=args.work_dir)
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
