"""What determines a delivery: the plan and its noise rates (same plan, same files)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


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
