"""Landing: the demo, an asset that lands the next simulated TPC-H batch, so a fresh ``dagster dev`` has data.

The definitions find it through :func:`landing_producers` and leave it out with
``MEDALLION_SIMULATOR=off``; then no bronze asset shows it upstream. The check
gate fills its throwaway lake with :func:`land_sample`.
"""

import functools
from pathlib import Path
from typing import Literal

from dagster import AssetKey, Config, MaterializeResult, asset
from pydantic import Field

from medallion_assets.kafka import KafkaResource, publish_files
from medallion_assets.pipelines.tpch import feeds
from medallion_assets.pipelines.tpch.feeds import ORDERS_KAFKA
from medallion_assets.pipelines.tpch.simulator import AllBatchesLandedError, land_all, land_next_batch
from medallion_assets.project import feeds_in
from medallion_assets.resources import LakeResource


class SimulatedFeedConfig(Config):
    """Which simulated delivery to land from (see ``medallion_assets.pipelines.tpch.simulator``)."""

    scale_factor: float = Field(default=0.01, description="TPC-H scale factor of the simulated delivery.")
    batches: int = Field(default=2, description="Number of batches the delivery is split into.")
    seed: int = Field(default=7, description="Seed of the delivery's noise.")
    order_events_to: Literal["files", "kafka", "both"] = Field(
        default="files",
        description="Order events as landed files, as messages on the Kafka resource's topic (one per line), or both.",
    )


def simulated_feeds() -> tuple[str, ...]:
    """The feeds whose files (or Kafka messages) the simulator lands: TPC-H's."""
    return tuple(f.name for f in feeds_in([feeds]))


@asset(
    key=["landing", "simulated_batch"],
    group_name="landing",
    description="Lands the next batch of a noisy TPC-H feed under landing/.",
)
def simulated_batch(config: SimulatedFeedConfig, lake: LakeResource, kafka: KafkaResource) -> MaterializeResult:
    """Land the next batch; when every batch is landed, land nothing and say so.

    Raises:
        ValueError: the lake is in a bucket: the simulator writes a local folder only.
    """
    if "://" in lake.root:
        raise ValueError(
            f"MEDALLION_LAKE_ROOT={lake.root!r}: the simulator lands into a local folder only (it stages and "
            "renames its files). Land with `medallion-assets simulate --lake-root <local folder>` and upload its "
            "landing/ to the lake's (docs/deployment.md), or use a local MEDALLION_LAKE_ROOT"
        )
    try:
        landed = land_next_batch(
            lake.landing_dir,
            scale_factor=config.scale_factor,
            batches=config.batches,
            seed=config.seed,
            order_events_to=config.order_events_to,
            publish=functools.partial(publish_files, kafka.for_feed(ORDERS_KAFKA)),
        )
    except AllBatchesLandedError as done:
        return MaterializeResult(metadata={"landed_files": 0, "note": str(done)})
    return MaterializeResult(
        metadata={"batch": landed.batch, "batches": landed.batches, "landed_files": len(landed.files)}
    )


def landing_producers() -> dict[AssetKey, tuple[str, ...]]:
    """The definitions' producer hook: :data:`simulated_batch` lands the files of every TPC-H feed."""
    return {simulated_batch.key: simulated_feeds()}


def land_sample(landing: Path, *, scale_factor: float, seed: int) -> None:
    """The check gate's sample hook: the simulator's whole delivery, in one batch, into the empty ``landing``."""
    land_all(landing, scale_factor=scale_factor, batches=1, seed=seed)
