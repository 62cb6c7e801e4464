"""Continuous mode in a real process, followed by the checkpoint sensor on a real instance.

``medallion-assets stream`` runs in a subprocess; files land while it runs;
the ``orders_raw`` checkpoint sensor (from the project's Definitions, run
with ``build_sensor_context`` on an ephemeral instance) reports each
committed batch once and requests the downstream run. SIGTERM stops the
stream cleanly; after a restart the sensor's cursor picks up where it left off.
Both tests check the stream wrote with the test session's Delta engine: the
subprocess gets it from ``MEDALLION_DELTA_ENGINE`` and ``DELTA_SPARK_JARS`` or
``MEDALLION_DELTA_SPARK_MAVEN``.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dagster import AssetCheckEvaluation, AssetMaterialization, DagsterInstance, SensorResult, build_sensor_context

from medallion_assets.checkpoints import read_checkpoint
from medallion_assets.kafka import KafkaResource
from medallion_assets.pipelines.tpch.feeds import ORDERS_RAW
from medallion_assets.resources import LakeResource
from medallion_assets_tests.support.kill_points import sink_engines
from medallion_assets_tests.support.processes import signal_group
from medallion_assets_tests.support.readers import read_with_deltalake

# Stream processes with JVMs of their own, waited for with generous timeouts.
pytestmark = [pytest.mark.slow, pytest.mark.both_engines, pytest.mark.timeout(2400)]
STREAM = "orders_raw"


def land(folder: Path, name: str, lines: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text("".join(f'{{"event_id": "{name}-{i}"}}\n' for i in range(lines)))
    tmp.rename(folder / name)


def start_stream(root: Path, log_file: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "medallion_assets.cli",
            "stream",
            "--lake-root",
            str(root),
            "--streams",
            STREAM,
            "--trigger-interval",
            "1 second",
            "--max-files-per-trigger",
            f"{STREAM}=5",
        ],
        env=env,
        start_new_session=True,
        stdout=log_file.open("ab"),
        stderr=subprocess.STDOUT,
    )


def stop_stream(proc: subprocess.Popen) -> int | None:
    """SIGTERM the stream, as a person's Ctrl-C would; SIGKILL it if it does not stop in time."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            signal_group(proc, signal.SIGKILL)
            proc.wait()


def wait_for(condition, proc, timeout=480, what=""):
    """Poll ``condition`` until it holds. The timeout is generous: a fresh JVM's
    first Delta batch (delta-spark loads and compiles its classes) takes minutes
    on a busy machine."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the stream process ended (rc {proc.returncode}) while waiting for {what}")
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_continuous_stream_and_checkpoint_sensor(tmp_path, delta_engine):
    from medallion_assets.definitions import build_definitions

    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    landing = Path(lake.landing_folder(ORDERS_RAW))
    ckpt = lake.checkpoint_dir(STREAM)
    table = lake.table_path(["bronze", STREAM])
    defs = build_definitions()
    sensor_def = defs.resolve_sensor_def(f"{STREAM}_checkpoint_sensor")
    log_file = tmp_path / "stream.log"
    reported: list[int] = []
    cursor = None

    def tick(instance):
        nonlocal cursor
        context = build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake}, definitions=defs)
        result = sensor_def(context)
        if isinstance(result, SensorResult):
            cursor = result.cursor or cursor
            batches = [e.metadata["batch_id"].value for e in result.asset_events if isinstance(e, AssetMaterialization)]
            reported.extend(batches)
            return result, batches
        return result, []

    def committed_with(lines_total):
        return lambda: Path(table, "_delta_log").exists() and read_with_deltalake(table).num_rows == lines_total

    def reported_once(instance, proc, file_name: str, lines_total: int, lines_new: int) -> None:
        """Wait until the file's batch is committed, then check one tick reports it and requests downstream."""
        wait_for(committed_with(lines_total), proc, what=f"{file_name} in bronze")
        wait_for(lambda: not read_checkpoint(ckpt).pending() and read_checkpoint(ckpt).commits, proc, what="commit")
        result, batches = tick(instance)
        assert batches and result.run_requests, f"the batch of {file_name} is reported and silver/gold requested"
        rows = sum(e.metadata["rows"].value for e in result.asset_events if isinstance(e, AssetMaterialization))
        assert rows == lines_new

    with DagsterInstance.ephemeral() as instance:
        proc = start_stream(root, log_file)
        try:
            wait_for(lambda: read_checkpoint(ckpt).query_id is not None, proc, what="the query to start")
            time.sleep(12)  # idle triggers first: Spark reports no-data progress every 10 s
            land(landing, "a.json", 10)
            reported_once(instance, proc, "a.json", 10, 10)
            assert tick(instance)[1] == []  # nothing twice

            land(landing, "b.json", 7)
            reported_once(instance, proc, "b.json", 17, 7)
        finally:
            assert stop_stream(proc) == 0
        output = log_file.read_text()
        assert "input_rows=10" in output and "input_rows=7" in output and "rows_per_second=" in output
        assert "batch_duration_ms=" in output and "streams stopped (signal)" in output

        # While it is down: a landed file shows up as backlog, and nothing is reported.
        land(landing, "c.json", 5)
        result, batches = tick(instance)
        assert batches == []
        health = (
            [e for e in result.asset_events if isinstance(e, AssetCheckEvaluation)]
            if isinstance(result, SensorResult)
            else []
        )
        assert not health or health[-1].metadata["backlog_files"].value == 1

        # Restart: the new batch is reported once, nothing before it again.
        proc = start_stream(root, log_file)
        try:
            reported_once(instance, proc, "c.json", 22, 5)
        finally:
            stop_stream(proc)

    assert reported == sorted(set(reported)), "each batch reported once, in order"
    assert reported == sorted(read_checkpoint(ckpt).commits)
    assert read_with_deltalake(table).num_rows == 22
    assert sink_engines(table) == {delta_engine}, "medallion-assets stream ran the test session's engine"


def test_continuous_dagster_job_runs_streams_until_its_time_is_up(spark, tmp_path, delta_engine):
    """The ``bronze_streams_continuous`` job (bounded by run_seconds here) ingests what lands."""
    from medallion_assets.continuous import bronze_streams_continuous
    from medallion_assets.resources import SparkResource
    from medallion_assets.storage.engines import engine_for

    # A session's first Delta write is slow (delta-spark loads and compiles its
    # classes: half a minute or more on a busy machine). Pay that before the
    # timed run, so its 25 seconds go to streaming whichever test ran before
    # (run_seconds counts from before the queries start, table creation included).
    warm = str(tmp_path / "warm")
    spark.range(1).write.format("delta").mode("append").save(warm)
    assert engine_for(spark).read(spark, warm).count() == 1

    lake = LakeResource(root=str(tmp_path / "lake"))
    land(Path(lake.landing_folder(ORDERS_RAW)), "a.json", 4)
    instance = DagsterInstance.ephemeral()
    result = bronze_streams_continuous.execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "run_bronze_streams": {
                    "config": {
                        "streams": [STREAM],
                        "trigger_interval": "1 second",
                        "run_seconds": 25,
                        "rate_limits": {STREAM: {"max_files_per_trigger": 1}},
                    }
                }
            }
        },
        # No Kafka source: the job says so and runs the file stream alone.
        resources={"spark": SparkResource(), "lake": lake, "kafka": KafkaResource()},
    )
    assert result.success
    assert read_with_deltalake(lake.table_path(["bronze", STREAM])).num_rows == 4
    assert sink_engines(lake.table_path(["bronze", STREAM])) == {delta_engine}
    messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("batch 0 input_rows=4" in m for m in messages)
    assert any("streams stopped (run_seconds)" in m for m in messages)
