"""The whole TPC-H pipeline with its lake in a bucket: S3Proxy on 127.0.0.1 (support/object_store.py).

The test lands one small delivery (the simulator, into a local folder) and uploads it
to the bucket's landing folder, as a producer does; then one Dagster run of every
asset and check, in a process of its own, with ``MEDALLION_LAKE_ROOT=s3://<bucket>/lake``:
the tables, the stream checkpoints and the landing folder are all in the bucket;
then the maintenance job (OPTIMIZE, VACUUM) on gold, in the same process. The session
is the project's: delta-spark and hadoop-aws from Maven through spark.jars.packages.
Silver is read back from the bucket with deltalake and compared with the landing
contract's state computed independently; gold, read back with deltalake and with
DuckDB, equals DuckDB's own TPC-H answers over silver. The S3 secret appears in no
process's command line, no output of the run, nothing in Dagster's storage, no Spark
event log and no object of the bucket.

Only delta-spark runs the pipeline on a bucket: the delta-rs engine stages and moves
its Parquet files through local folders, and refuses a lake in a bucket before its
session starts (test_object_store.py). docs/deployment.md says what works on a bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import duckdb
import pytest
from deltalake import DeltaTable
from pyarrow import fs

from medallion_assets.pipelines.tpch import simulator
from medallion_assets_tests.support import object_store
from medallion_assets_tests.support.delta_spark import NO_DELTA_SPARK, delta_spark_source
from medallion_assets_tests.support.deployments import spark_conf_with_event_logs
from medallion_assets_tests.support.pipeline_checks import (
    SEED,
    TPCH_GOLD,
    assert_gold_matches_duckdb,
    assert_same_rows,
    assert_silver_matches_contract,
)
from medallion_assets_tests.support.pipeline_runner import landed_pipeline_command
from medallion_assets_tests.support.processes import process_list_watch
from medallion_assets_tests.support.readers import read_with_deltalake

pytestmark = pytest.mark.slow

SCALE_FACTOR = 0.01
BUCKET = "medallion"


@pytest.mark.timeout(1800)  # one whole-graph run in a process of its own, the store beside it
def test_pipeline_on_delta_spark_with_the_lake_in_a_bucket(tmp_path):
    source = delta_spark_source()
    if source is None:
        pytest.skip(f"the pipeline on a bucket runs on delta-spark: {NO_DELTA_SPARK}")
    server, reason = object_store.start(tmp_path / "s3proxy")
    if server is None:
        pytest.skip(reason)
    phases: dict[str, float] = {}
    with server:
        started = time.monotonic()
        server.create_bucket(BUCKET)
        environment = server.environment(BUCKET, "lake")
        lake = environment["MEDALLION_LAKE_ROOT"]
        # The producer: the simulator's delivery, uploaded into the bucket's landing folder.
        landing = tmp_path / "landing"
        simulator.land_next_batch(landing, scale_factor=SCALE_FACTOR, batches=1, seed=SEED)
        fs.copy_files(
            str(landing),
            f"{BUCKET}/lake/landing",
            source_filesystem=fs.LocalFileSystem(),
            destination_filesystem=server.filesystem(),
        )
        phases["land and upload"] = time.monotonic() - started

        home, work = tmp_path / "dagster_home", tmp_path / "work"
        home.mkdir()
        work.mkdir()
        env = dict(
            os.environ,
            **environment,
            **source,
            DAGSTER_HOME=str(home),
            SPARK_CONF_DIR=str(spark_conf_with_event_logs(tmp_path)),
            MEDALLION_DELTA_ENGINE="delta-spark",
        )
        started = time.monotonic()
        with process_list_watch(server.secret_access_key) as command_lines:
            done = subprocess.run(
                landed_pipeline_command(maintain=["gold"]),
                env=env,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=1500,
            )
        phases["the run"] = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-8000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["failed_checks"] == [], report
        assert set(report["engines"].values()) == {"delta-spark"}, report
        # The maintenance job ran OPTIMIZE and VACUUM on every gold table through S3A (listing the bucket
        # for files to remove; a table just written has none old enough, and one file needs no compaction).
        assert report["maintenance_succeeded"], report
        assert {f"gold/{table}" for table in TPCH_GOLD} <= set(report["maintained"]), report

        started = time.monotonic()
        options = server.storage_options()
        # The run wrote into the bucket (tables, the streams' checkpoints), not into a local folder named
        # after the URI (a path joined onto "s3://..." as onto a local folder).
        written = server.filesystem().get_file_info(fs.FileSelector(f"{BUCKET}/lake/_checkpoints/orders_raw/commits"))
        assert [info.base_name for info in written] == ["0"]
        assert DeltaTable(f"{lake}/bronze/orders_raw", storage_options=options).version() >= 1
        assert not [path for path in work.rglob("s3*:")], list(work.iterdir())
        assert_silver_matches_contract(lake, landing=landing, storage_options=options)
        assert_gold_matches_duckdb(lake, storage_options=options)
        _assert_duckdb_reads_gold_as_deltalake_does(lake, options)
        phases["read back and compare"] = time.monotonic() - started

        # The secret reached the store and the run's environment, nothing else.
        secret = server.secret_access_key
        assert command_lines == [], command_lines
        assert secret not in done.stdout + done.stderr
        holding = [
            str(path)
            for folder in (home, tmp_path / "events", tmp_path / "s3proxy" / "data")
            for path in folder.rglob("*")
            if path.is_file() and secret.encode() in path.read_bytes()
        ]
        assert holding == [], holding
        # The session reached the bucket through hadoop-aws from Maven, at the store's endpoint (its event log's
        # Spark properties); the key pair is no Spark setting.
        event_log = "".join(path.read_text() for path in (tmp_path / "events").rglob("*") if path.is_file())
        assert event_log, "no Spark event log was written"
        assert '"spark.jars.packages":"' in event_log and "org.apache.hadoop:hadoop-aws:" in event_log
        assert f'"spark.hadoop.fs.s3a.endpoint":"{server.endpoint}"' in event_log
    print("where the time goes: " + ", ".join(f"{name} {seconds:.0f}s" for name, seconds in phases.items()))


def _assert_duckdb_reads_gold_as_deltalake_does(lake: str, options: dict[str, str]) -> None:
    """DuckDB reads each gold table from the bucket (through deltalake's Arrow dataset: no httpfs extension
    is installed to let DuckDB reach S3 itself) and finds deltalake's rows."""
    for table in TPCH_GOLD:
        location = f"{lake}/gold/{table}"
        dataset = DeltaTable(location, storage_options=options).to_pyarrow_dataset()
        with duckdb.connect() as con:
            con.register("gold", dataset)
            by_duckdb = con.execute("SELECT * FROM gold").fetch_arrow_table().to_pylist()
        assert_same_rows(by_duckdb, read_with_deltalake(location, storage_options=options).to_pylist(), table)
