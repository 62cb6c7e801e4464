"""One whole-graph Dagster run in a process of its own, for tests that switch engines.

``python -m medallion_assets_tests.support.pipeline_runner`` lands the simulator's next
batch, then materializes every asset but the landing simulator (with the
asset checks, every month of the partitioned gold table in one run) on the
persistent instance of ``DAGSTER_HOME`` and the lake of ``MEDALLION_LAKE_ROOT``,
on the deployment ``MEDALLION_DEPLOYMENT`` and the engine ``MEDALLION_DELTA_ENGINE`` pick. It prints one JSON line: the
Delta engine each materialization recorded, the checks that failed with
severity ERROR, and those that failed with severity WARN.

``python -m medallion_assets_tests.support.pipeline_runner landed [maintain LAYER...]`` runs
the same without landing anything: the test has landed the delivery already (into a
bucket, as a producer uploads it); with ``maintain``, the weekly maintenance job
(OPTIMIZE and VACUUM of the tables of the layers named) runs after it in the same
process, and the report says whether it succeeded (``maintenance_succeeded``) and which
tables it maintained (``maintained``: ``layer/table``).

``python -m medallion_assets_tests.support.pipeline_runner orders_step RUN_ID`` runs
only silver's orders step (:func:`run_orders_step`) on that lake, as the
Dagster run ``RUN_ID``, so a test watching the tables' logs from outside knows
which commits are this run's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def run_orders_step(run_id: str):
    """Materialize TPC-H's orders step (``orders_and_lineitem``: silver.orders, silver.lineitem,
    quarantine.orders and their checks) from the bronze tables of ``MEDALLION_LAKE_ROOT``, as the Dagster run ``run_id``
    (on an ephemeral instance: what the step consumed is kept in the tables' logs).

    The IO manager records the run id in each commit it makes (``dagster_run_id``).
    """
    from dagster import AssetSelection, Definitions, define_asset_job

    from medallion_assets.definitions import resources_for
    from medallion_assets.pipelines.tpch import silver
    from medallion_assets_tests.support import tpch_assets as bronze

    definitions = Definitions(
        assets=[bronze.orders_raw, bronze.orders_kafka, silver.orders_and_lineitem],
        jobs=[define_asset_job("orders_step", selection=AssetSelection.assets(silver.orders_and_lineitem))],
        resources=resources_for("local"),
    )
    return definitions.resolve_job_def("orders_step").execute_in_process(run_id=run_id, raise_on_error=False)


def ran_to_the_end(result) -> bool:
    """Whether every step of a run got to its end: the run succeeded, or its steps failed only on
    their blocking checks, which fail a step after its writes (a rejected-rows check at ERROR)."""
    failed = [e.step_failure_data.error for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return (
        result.success
        or bool(failed)
        and all(error is not None and error.cls_name == "DagsterAssetCheckFailedError" for error in failed)
    )


def first_minute_of(instance, run_id: str) -> list[str]:
    """The run's event log up to its first materialization.

    The Spark session's lines, then ``ASSET_MATERIALIZATION``.
    """
    from dagster import DagsterEventType

    seen = []
    for record in instance.all_logs(run_id):
        if (
            record.dagster_event is not None
            and record.dagster_event.event_type == DagsterEventType.ASSET_MATERIALIZATION
        ):
            return [*seen, "ASSET_MATERIALIZATION"]
        if record.dagster_event is None and (record.user_message or "").startswith(
            ("Spark session starting", "Spark session ready")
        ):
            seen.append(record.user_message)
    return seen


def assert_the_first_minute_is_explained(report: dict, *, engine: str, deployment: str) -> None:
    """The run's log says, before its first table, that the session starts and is ready: engine, why, deployment."""
    starting, ready, materialized = report["first_minute"]
    assert materialized == "ASSET_MATERIALIZATION", report["first_minute"]
    assert starting.startswith(f"Spark session starting: {deployment}") and "; Delta engine " in starting, starting
    assert ready.startswith("Spark session ready after ") and f", {deployment}" in ready, ready
    assert f"; Delta engine {engine} (" in ready, ready


def pipeline_command(scale_factor: float, batches: int, seed: int) -> list[str]:
    """The command that runs this module's pipeline (``main``) in a process of its own."""
    return [
        sys.executable,
        "-m",
        "medallion_assets_tests.support.pipeline_runner",
        str(scale_factor),
        str(batches),
        str(seed),
    ]


def landed_pipeline_command(*, maintain: Sequence[str] = ()) -> list[str]:
    """The command that runs the pipeline (``main``) over what is landed already, in a process of its own;
    ``maintain``: then the maintenance job on the tables of these layers."""
    return [sys.executable, "-m", "medallion_assets_tests.support.pipeline_runner", "landed"] + (
        ["maintain", *maintain] if maintain else []
    )


def main(argv: list[str]) -> int:
    if argv[0] == "orders_step":
        run_orders_step(argv[1])
        return 0
    from dagster import AssetCheckSeverity, DagsterInstance

    from medallion_assets.definitions import build_definitions
    from medallion_assets.io_manager.metadata import ENGINE_NAME
    from medallion_assets.jobs import table_maintenance
    from medallion_assets.pipelines.tpch import simulator
    from medallion_assets_tests.support.pipeline_checks import materialize_everything

    if argv[0] != "landed":
        scale_factor, batches, seed = float(argv[0]), int(argv[1]), int(argv[2])
        lake = Path(os.environ["MEDALLION_LAKE_ROOT"])
        simulator.land_next_batch(lake / "landing", scale_factor=scale_factor, batches=batches, seed=seed)
    with DagsterInstance.get() as instance:
        definitions = build_definitions(os.environ.get("MEDALLION_DEPLOYMENT", "local"))
        result = materialize_everything(definitions, instance)
        # Tables of pandas/polars/Arrow assets are written by deltalake whatever the session runs.
        engines = {
            event.asset_key.to_user_string(): event.materialization.metadata["delta/engine"].value
            for event in result.get_asset_materialization_events()
            if "delta/engine" in event.materialization.metadata
            and event.materialization.metadata["delta/engine"].value != ENGINE_NAME
        }
        # A noisy batch fails WARN checks (rows dropped and rejected) on purpose; an ERROR is a fault.
        failed = [
            e.check_name
            for e in result.get_asset_check_evaluations()
            if not e.passed and e.severity == AssetCheckSeverity.ERROR
        ]
        warned = sorted({e.check_name for e in result.get_asset_check_evaluations() if not e.passed} - set(failed))
        first_minute = first_minute_of(instance, result.run_id)
        report = {"engines": engines, "failed_checks": failed, "warned_checks": warned, "first_minute": first_minute}
        if argv[1:2] == ["maintain"]:
            maintenance = table_maintenance.execute_in_process(
                run_config={"ops": {"optimize_and_vacuum": {"config": {"layers": argv[2:]}}}},
                resources={name: definitions.resources[name] for name in ("spark", "lake")},
                instance=instance,
            )
            # The job logs "maintained <layer>/<table>" after each table's OPTIMIZE and VACUUM.
            report["maintained"] = sorted(
                record.user_message.removeprefix("maintained ")
                for record in instance.all_logs(maintenance.run_id)
                if record.dagster_event is None and (record.user_message or "").startswith("maintained ")
            )
            report["maintenance_succeeded"] = maintenance.success
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
