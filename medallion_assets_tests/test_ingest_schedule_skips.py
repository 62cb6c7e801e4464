"""The hourly ingest launches a run only when it has work, and says why it skipped otherwise.

The schedule is evaluated as the daemon evaluates it (``build_schedule_context``
on the project's definitions), on a lake of the test's own whose files and
Delta tables are written with plain Python and deltalake: no Spark. Nothing
landed is a SkipReason; a landed file, or a bronze version silver has not
taken in, is a RunRequest; silver having taken in bronze's newest version is
a SkipReason again. The daily refresh (silver and gold, no bronze step) asks
the same of its tables.
"""

from __future__ import annotations

import json
import shutil

import pyarrow as pa
import pytest
from dagster import RunRequest, build_schedule_context
from deltalake import CommitProperties, write_deltalake

from medallion_assets.definitions import build_definitions
from medallion_assets.kafka import KafkaResource
from medallion_assets.resources import LakeResource


@pytest.fixture(scope="module")
def repository():
    return build_definitions("local", simulator=False, kafka=False).get_repository_def()


def _evaluate(repository, lake: LakeResource, schedule_name: str = "ingest_hourly"):
    schedule = repository.get_schedule_def(schedule_name)
    tick = schedule.evaluate_tick(
        build_schedule_context(repository_def=repository, resources={"lake": lake, "kafka": KafkaResource()})
    )
    return list(tick.run_requests or []), tick.skip_message


def _table(path, custom: dict[str, str] | None = None) -> None:
    write_deltalake(
        str(path),
        pa.table({"value": ["x"]}),
        mode="append",
        commit_properties=CommitProperties(custom_metadata=custom or {}),
    )


def test_ingest_schedule_runs_only_when_something_landed_or_silver_lags(tmp_path, repository):
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))

    requests, skipped = _evaluate(repository, lake)
    assert requests == [] and skipped.startswith("ingest: nothing new")

    orders = root / "landing" / "orders"
    orders.mkdir(parents=True)
    (orders / "batch-00001.json").write_text(json.dumps({"o_orderkey": 1}) + "\n")
    requests, skipped = _evaluate(repository, lake)
    assert len(requests) == 1 and isinstance(requests[0], RunRequest) and skipped is None
    assert "bronze/orders_raw: 1 landed file(s) not taken yet" in requests[0].tags["medallion/work"]

    # Nothing left to take (the file gone), bronze has a table and silver has none: work.
    (orders / "batch-00001.json").unlink()
    _table(root / "bronze" / "orders_raw")
    requests, _ = _evaluate(repository, lake)
    assert "silver/lineitem: no table yet" in requests[0].tags["medallion/work"]

    # Each table of the orders step took in bronze's newest version (0): nothing to do.
    for table in ("silver/orders", "silver/lineitem", "quarantine/orders"):
        _table(root / table, {"consumed.bronze/orders_raw": "0"})
    requests, skipped = _evaluate(repository, lake)
    assert requests == [] and skipped.startswith("ingest: nothing new")

    # Bronze gained a version silver has not taken in: work.
    _table(root / "bronze" / "orders_raw")
    requests, _ = _evaluate(repository, lake)
    assert "has version 1, taken in: 0" in requests[0].tags["medallion/work"]


def test_ingest_schedule_keeps_its_name_job_and_cron(repository):
    schedule = repository.get_schedule_def("ingest_hourly")
    assert schedule.job_name == "ingest" and schedule.cron_schedule == "0 * * * *"


def test_history_reading_silver_whole_beside_bronze_changes_is_up_to_date_by_bronze_alone(tmp_path, repository):
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    _table(root / "bronze" / "customers_cdc")
    for table in ("silver/customers", "quarantine/customers", "silver/customers_history"):
        _table(root / table, {"consumed.bronze/customers_cdc": "0"})
    requests, skipped = _evaluate(repository, lake)
    assert requests == [] and skipped.startswith("ingest: nothing new")

    # A table whose commits name none of its inputs (written by other code) always has work.
    shutil.rmtree(root / "silver" / "customers_history")
    _table(root / "silver" / "customers_history")
    requests, _ = _evaluate(repository, lake)
    assert (
        "silver/customers_history: its commits name none of its inputs' versions" in requests[0].tags["medallion/work"]
    )


def test_refresh_schedule_runs_only_when_a_table_lags_its_inputs(tmp_path, repository):
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    requests, skipped = _evaluate(repository, lake, "refresh_daily")
    assert requests == [] and skipped.startswith("refresh: nothing new"), "no table: nothing to compute from"

    # Silver took in bronze; gold was computed from silver's newest versions: nothing to do.
    _table(root / "bronze" / "orders_raw")
    for table in ("silver/orders", "silver/lineitem", "quarantine/orders"):
        _table(root / table, {"consumed.bronze/orders_raw": "0"})
    computed_from = json.dumps({"inputs": {"silver/lineitem": 0, "silver/orders": 0}})
    for table in repository.get_job("refresh").asset_layer.selected_asset_keys:
        if table.path[0] == "gold":
            _table(root / "/".join(table.path), {"computed_from": computed_from})
    report = root / "gold" / "pricing_summary_report"
    shutil.rmtree(report)
    _table(report, {"computed_from": json.dumps({"inputs": {"gold/pricing_summary": 0}})})
    requests, skipped = _evaluate(repository, lake, "refresh_daily")
    assert requests == [] and skipped.startswith("refresh: nothing new"), skipped

    # Silver gained a version gold was not computed from: a run, saying why.
    _table(root / "silver" / "lineitem", {"consumed.bronze/orders_raw": "0"})
    requests, skipped = _evaluate(repository, lake, "refresh_daily")
    assert len(requests) == 1 and skipped is None
    assert "silver/lineitem has version 1, taken in: 0" in requests[0].tags["medallion/work"]
