"""The lake on an S3-compatible object store: S3Proxy on 127.0.0.1 (support/object_store.py), a real server.

What is tested here: the server itself (credentials, buckets), the commit guarantee
two delta-rs writers get when they write one table at once, the project's
settings and lake resource reaching the bucket, a stream's checkpoint and landing
folder read in the bucket (the sensors' and stream checks' inputs), and the
delta-rs engine's refusal of a lake in a bucket. test_pipeline_on_object_store.py
runs the whole pipeline on the bucket on delta-spark (hadoop-aws from Maven), in a
process of its own. Skipped where Maven or Java is
missing (the server's jars come from Maven Central).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import deltalake
import pyarrow as pa
import pytest
from pyarrow import fs

from medallion_assets.checkpoints import delta_commits_of_query, read_checkpoint
from medallion_assets.definitions import resources_for
from medallion_assets.ingest import full_refresh_stream
from medallion_assets.object_store import S3Store, storage_options_for
from medallion_assets.pipelines.tpch.feeds import ORDERS_RAW
from medallion_assets.resources import ObjectStoreEngineError, SparkResource, lake_resource
from medallion_assets.settings import read_settings
from medallion_assets.stream_monitoring import StreamHealthPolicy, batch_schema_drift, stream_health
from medallion_assets_tests.support import object_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server, reason = object_store.start(tmp_path_factory.mktemp("s3proxy"))
    if server is None:
        pytest.skip(reason)
    with server:
        yield server


@pytest.fixture
def bucket(store, request) -> str:
    name = request.node.name.lower().replace("_", "-")[:50].strip("-")
    store.create_bucket(name)
    return name


def test_the_server_listens_on_loopback_with_its_own_credentials_only(store, bucket):
    assert store.endpoint.startswith("http://127.0.0.1:")
    store.filesystem().create_dir(f"{bucket}/folder")
    with store.filesystem().open_output_stream(f"{bucket}/folder/object.txt") as out:
        out.write(b"kept")
    with store.filesystem().open_input_stream(f"{bucket}/folder/object.txt") as source:
        assert source.read() == b"kept"
    stranger = fs.S3FileSystem(
        endpoint_override=store.endpoint.removeprefix("http://"),
        scheme="http",
        access_key=store.access_key_id,
        secret_key="not-the-secret",
        region=object_store.REGION,
    )
    with pytest.raises(OSError, match="(?i)access denied|forbidden|signature"):
        stranger.get_file_info(fs.FileSelector(bucket))
    # The secret went to the server's properties file only.
    listing = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert store.secret_access_key not in listing


def test_two_delta_rs_writers_appending_to_one_table_at_once_both_commit(store, bucket):
    # delta-rs commits on S3 with a conditional put (If-None-Match: *) of the next log entry: the
    # writer that loses the race gets 412 from the store, re-reads the log, finds no conflict
    # between two appends, and commits the next version. Nothing is overwritten.
    options = store.storage_options()
    table = f"s3://{bucket}/events"
    deltalake.write_deltalake(table, pa.table({"writer": ["setup"], "n": [0]}), storage_options=options)
    writers, rows_each = 4, 5
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write(writer: int) -> None:
        try:
            stale = deltalake.DeltaTable(table, storage_options=options)  # every writer starts from version 0
            start.wait()
            for n in range(rows_each):
                deltalake.write_deltalake(stale, pa.table({"writer": [f"w{writer}"], "n": [n]}), mode="append")
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=write, args=(writer,)) for writer in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert failures == []
    result = deltalake.DeltaTable(table, storage_options=options)
    assert result.version() == writers * rows_each
    rows = sorted(zip(*result.to_pyarrow_table().select(["writer", "n"]).to_pydict().values(), strict=True))
    assert rows == sorted([("setup", 0)] + [(f"w{w}", n) for w in range(writers) for n in range(rows_each)])
    assert [entry["version"] for entry in result.history()] == list(range(writers * rows_each, -1, -1))


def test_two_delta_rs_writers_that_conflict_leave_one_commit_and_one_clean_failure(store, bucket):
    # Both read version 1 and delete what they read: the second to commit finds the files it
    # removes already removed by the first, and fails without writing a log entry.
    options = store.storage_options()
    table = f"s3://{bucket}/orders"
    deltalake.write_deltalake(table, pa.table({"id": [1, 2, 3]}), storage_options=options)
    first = deltalake.DeltaTable(table, storage_options=options)
    second = deltalake.DeltaTable(table, storage_options=options)
    first.delete("id = 1")
    with pytest.raises(deltalake.exceptions.CommitFailedError):
        second.delete("id = 2")
    result = deltalake.DeltaTable(table, storage_options=options)
    assert result.version() == 1
    assert sorted(result.to_pyarrow_table()["id"].to_pylist()) == [2, 3]


def test_the_lake_resource_lists_tables_and_files_in_the_bucket_from_the_settings(store, bucket, monkeypatch):
    for name, value in store.environment(bucket).items():
        monkeypatch.setenv(name, value)
    settings = read_settings()
    configured = lake_resource(settings)
    # The secret is named (EnvVar), not held, until Dagster resolves the resource when a run starts.
    assert store.secret_access_key not in repr(settings) + repr(configured)
    assert store.secret_access_key not in repr(resources_for(settings=settings)["spark"])
    lake = configured.process_config_and_initialize()
    options = lake.delta_storage_options()
    assert options["AWS_ENDPOINT_URL"] == store.endpoint
    deltalake.write_deltalake(lake.table_path(["silver", "orders"]), pa.table({"id": [1]}), storage_options=options)
    filesystem = store.filesystem()
    with filesystem.open_output_stream(f"{bucket}/lake/landing/orders/part-1.csv") as out:
        out.write(b"id\n1\n")
    assert lake.delta_tables() == [("silver", "orders", f"s3://{bucket}/lake/silver/orders")]
    assert lake.files(f"s3://{bucket}/lake/landing/orders", ".csv") == [f"s3://{bucket}/lake/landing/orders/part-1.csv"]
    assert list(lake.files_modified(f"s3://{bucket}/lake/landing/orders", ".csv")) == [
        f"s3://{bucket}/lake/landing/orders/part-1.csv"
    ]


def test_a_stream_checkpoint_and_landing_in_the_bucket_are_read_as_on_a_local_lake(store, bucket, monkeypatch):
    # What a file stream leaves in the bucket (Spark's v1 log files, S3A's s3a:// names), written here
    # through the S3 API; the sensors' and stream checks' readers reach it through the lake's settings.
    for name, value in store.environment(bucket).items():
        monkeypatch.setenv(name, value)
    lake = lake_resource(read_settings()).process_config_and_initialize()
    filesystem = store.filesystem()
    checkpoint, landing = lake.checkpoint_dir(ORDERS_RAW.name), lake.landing_folder(ORDERS_RAW)

    def put(location: str, text: str) -> None:
        with filesystem.open_output_stream(location.split("://", 1)[1]) as out:
            out.write(text.encode())

    taken, drifted, waiting = (f"{landing}/batch-{n}.json" for n in (1, 2, 3))
    put(taken, '{"event_id": "1"}\n')
    put(drifted, '{"event_id": "2", "coupon": "X"}\n{"event_id": "3"}\n')
    put(waiting, '{"event_id": "4"}\n')
    put(f"{checkpoint}/metadata", '{"id":"q-1"}\n')
    for batch, file in enumerate((taken, drifted)):
        put(f"{checkpoint}/offsets/{batch}", 'v1\n{"batchWatermarkMs":0}\n{"logOffset":' + str(batch) + "}\n")
        source = json.dumps({"path": file.replace("s3://", "s3a://"), "timestamp": 0, "batchId": batch})
        put(f"{checkpoint}/sources/0/{batch}", "v1\n" + source + "\n")
    put(f"{checkpoint}/commits/0", 'v1\n{"nextBatchWatermarkMs":0}\n')

    state = read_checkpoint(checkpoint, lake.filesystem)
    assert (state.query_id, sorted(state.commits), state.pending()) == ("q-1", [0], [1])
    assert state.input_files(1) == [drifted.replace("s3://", "s3a://")]
    health = stream_health(lake, ORDERS_RAW, StreamHealthPolicy(max_backlog_age_seconds=0.0), now=time.time() + 5)
    assert (health.last_committed_batch, health.pending_batch, health.backlog_files) == (0, 1, 1)
    assert not health.passed and "1 landed file(s) not taken" in health.problems[0]
    drift = batch_schema_drift(state.input_files(1), ORDERS_RAW, lake.filesystem)
    assert (drift.rows, drift.fields) == (1, ["coupon"])

    bronze = lake.table_path(["bronze", ORDERS_RAW.name])
    options = lake.delta_storage_options()
    deltalake.write_deltalake(
        bronze,
        pa.table({"value": ["line"]}),
        storage_options=options,
        commit_properties=deltalake.CommitProperties(
            custom_metadata={"operationParameters": {"queryId": "q-1", "epochId": "0"}}
        ),
    )
    assert [(c.batch_id, c.rows) for c in delta_commits_of_query(bronze, "q-1", storage_options=options).values()] == [
        (0, 1)
    ]
    # deltalake's callers that hold only a location get the same store from the environment's settings.
    assert storage_options_for(bronze) == options and storage_options_for("/lake/silver/orders") is None
    full_refresh_stream(lake, ORDERS_RAW, allowed=True)
    assert read_checkpoint(checkpoint, lake.filesystem).query_id is None
    assert lake.delta_tables() == []
    assert len(lake.files(landing, ".json")) == 3  # the landed files stay


def test_the_delta_rs_engine_refuses_a_lake_in_a_bucket_before_its_session_starts():
    spark = SparkResource(delta_engine="delta-rs", object_store=S3Store(endpoint="http://127.0.0.1:9"))
    with pytest.raises(
        ObjectStoreEngineError, match="MEDALLION_DELTA_ENGINE='delta-rs'.*MEDALLION_DELTA_ENGINE=delta-spark"
    ):
        _ = spark.process_config_and_initialize().spark_session
