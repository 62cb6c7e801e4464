"""One Dagster run of a small declared feed (bronze and silver) in a process of its own.

``python -m medallion_assets_tests.support.nothing_new_runner`` materializes
:data:`ITEMS`' bronze and silver steps on the lake of ``MEDALLION_LAKE_ROOT``
with the deployment's resources (``MEDALLION_DELTA_ENGINE`` picks the engine)
and prints one JSON line: the assets materialized, the steps skipped, whether
this process started a Spark JVM, and the run's log lines.
"""

from __future__ import annotations

import json

from dagster import DagsterEventType, DagsterInstance, materialize
from pyspark import SparkContext
from pyspark.sql.types import LongType, TimestampType

from medallion_assets.assets.bronze import bronze_assets
from medallion_assets.assets.silver import silver_assets
from medallion_assets.definitions import resources_for
from medallion_assets.feeds import ApplyChanges, Feed, Field, LandingFiles

ITEMS = Feed(
    name="items_raw",
    description="Items, one JSON object per line.",
    source=LandingFiles(folder="items", format="ndjson"),
    fields=(
        Field("item_id", description="The item."),
        Field("qty", LongType(), description="How many."),
        Field("updated_at", TimestampType(), description="When it changed."),
    ),
    silver=ApplyChanges(table="items", keys=("item_id",), sequence_by=("updated_at",)),
)


def main() -> None:
    instance = DagsterInstance.ephemeral()
    result = materialize(
        [*bronze_assets([ITEMS]), *silver_assets([ITEMS])], resources=resources_for("local"), instance=instance
    )
    events = result.all_events
    print(
        json.dumps(
            {
                "success": result.success,
                "materialized": sorted(
                    e.asset_key.to_user_string()
                    for e in events
                    if e.event_type == DagsterEventType.ASSET_MATERIALIZATION
                ),
                "skipped": sorted(e.step_key for e in events if e.event_type == DagsterEventType.STEP_SKIPPED),
                "jvm_started": SparkContext._active_spark_context is not None,
                "log": [r.user_message for r in instance.all_logs(result.run_id) if r.dagster_event is None],
            }
        )
    )


if __name__ == "__main__":
    main()
