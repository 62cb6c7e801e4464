"""The lake on an S3-compatible object store: S3Proxy on 127.0.0.1 (support/object_store.py), a real server.

What is tested here: the server itself (credentials, buckets), the commit guarantee
two delta-rs writers get when they write one table at once, and the project's
settings and lake resource reaching the bucket. Skipped where Maven or Java is
missing (the server's jars come from Maven Central).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import deltalake
import pyarrow as pa
import pytest
from pyarrow import fs

from medallion_assets.definitions import resources_for
from medallion_assets.resources import lake_resource
from medallion_assets.settings import read_settings
from medallion_assets_tests.support import object_store
from medallion_assets_tests.support.processes import process_list_watch


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


@pytest.mark.slow
def test_delta_spark_writes_the_lake_in_the_bucket_through_hadoop_aws_and_delta_rs_reads_it(store, bucket):
    # delta-spark and hadoop-aws (at pyspark's Hadoop version) from Maven through spark.jars.packages, in a
    # process of its own; the key pair reaches S3A on the Hadoop configuration, never a command line.
    env = {**os.environ, **store.environment(bucket), "MEDALLION_DELTA_ENGINE": "delta-spark"}
    env["MEDALLION_DELTA_SPARK_MAVEN"] = "true"
    settings = read_settings(env)
    lake = lake_resource(settings)
    path = lake.table_path(["silver", "numbers"])
    assert store.secret_access_key not in repr(resources_for(settings=settings)["spark"])
    command = [sys.executable, "-m", "medallion_assets_tests.support.object_store", "write-with-spark", path]
    with process_list_watch(store.secret_access_key) as seen:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-6000:]
    assert seen == []
    assert store.secret_access_key not in done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["endpoint"] == store.endpoint
    assert "org.apache.hadoop:hadoop-aws:" in report["packages"]
    assert report["rows"] == 15
    options = store.storage_options()
    table = deltalake.DeltaTable(path, storage_options=options)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(15))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in store.environment(bucket).items():
            patch.setenv(name, value)
        assert lake_resource(read_settings()).process_config_and_initialize().delta_tables() == [
            ("silver", "numbers", path)
        ]
