"""TPC-H's Kafka feed through bronze and silver's orders step in a Dagster run of its own process.

``python -m medallion_assets_tests.support.kafka_feed_runner`` builds the deployed
definitions (``MEDALLION_DEPLOYMENT``, ``MEDALLION_KAFKA_*``, ``MEDALLION_LAKE_ROOT`` as a
deployment sets them) and materializes ``bronze.orders_raw``, ``bronze.orders_kafka`` and
the orders step (``silver.orders``, ``silver.lineitem``, ``quarantine.orders``) with
the bronze tables' checks and the step's own, on an ephemeral instance. It prints one JSON line: whether the run
succeeded, the checks that failed, the steps' errors and the Delta engine each materialization recorded.

A process of its own: a Connect client cannot start beside the test session's
classic SparkSession, and the deployment's settings are read at definitions' load.
"""

from __future__ import annotations

import json

from dagster import AssetKey, AssetSelection, DagsterInstance, materialize

from medallion_assets.definitions import build_definitions

#: What the run materializes: both order sources' bronze tables, and the step that merges them.
BRONZE_KEYS = [AssetKey(["bronze", "orders_raw"]), AssetKey(["bronze", "orders_kafka"])]
ORDERS_STEP_KEY = AssetKey(["silver", "orders"])


def main() -> int:
    defs = build_definitions(None, kafka=True, simulator=False)
    [step] = [a for a in defs.assets if ORDERS_STEP_KEY in getattr(a, "keys", ())]
    wanted = {*BRONZE_KEYS, *step.keys}
    result = materialize(
        [*defs.assets, *defs.asset_checks],
        # The checks of the bronze tables (the consumer-lag check among them) and the orders step's own;
        # not silver's references to tables this run does not build (customers).
        selection=AssetSelection.assets(*wanted).without_checks()
        | AssetSelection.checks_for_assets(*BRONZE_KEYS)
        | AssetSelection.checks(*step.check_keys),
        resources=defs.resources,
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    failed = [
        f"{e.asset_key.to_user_string()}:{e.check_name} ({e.severity.value})"
        for e in result.get_asset_check_evaluations()
        if not e.passed
    ]
    engines = {
        m.asset_key.to_user_string(): str(m.materialization.metadata["delta/engine"].value)
        for m in result.get_asset_materialization_events()
        if "delta/engine" in m.materialization.metadata
    }
    errors = [
        f"{e.step_key}: {e.step_failure_data.error.message if e.step_failure_data.error else '?'}"
        for e in result.all_events
        if e.event_type_value == "STEP_FAILURE"
    ]
    print(json.dumps({"success": result.success, "failed_checks": failed, "engines": engines, "errors": errors}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
