"""Every deployment the README offers, end to end, on this machine.

``cluster``: the pyspark wheel's standalone master and a worker (a separate
executor JVM) on 127.0.0.1. ``connect``: the wheel's Spark Connect server. Each
runs the whole pipeline over one landed batch in a Dagster run of its own, on
the delta-rs engine here. The whole pipeline on delta-spark on the cluster is
the delta-spark run of test_engine_switch.py (the suite's time budget: one run
instead of two); over Connect it is opt-in (MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE=1),
and delta-spark's Connect route is covered by the Connect write test below.
Silver must equal the landing contract's state and gold DuckDB's TPC-H answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections import Counter

import pytest

from medallion_assets.kafka import KafkaResource, latest_offsets
from medallion_assets.resources import KAFKA_VARIABLES
from medallion_assets.storage.session import plan_engine
from medallion_assets_tests.support.delta_spark import NO_DELTA_SPARK, delta_spark_plan, delta_spark_source
from medallion_assets_tests.support.deployments import connect_server, documented_connect_server, standalone_cluster
from medallion_assets_tests.support.kafka_broker import SCRAM_MECHANISM, Broker, produce
from medallion_assets_tests.support.order_events import order_event_line
from medallion_assets_tests.support.pipeline_checks import (
    SEED,
    assert_gold_matches_duckdb,
    assert_silver_matches_contract,
)
from medallion_assets_tests.support.pipeline_runner import assert_the_first_minute_is_explained, pipeline_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

SCALE_FACTOR = 0.01


def _run_pipeline(tmp_path, deployment_env: dict[str, str], engine_env: dict[str, str]) -> dict:
    lake, home = tmp_path / "lake", tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    env = dict(os.environ, MEDALLION_LAKE_ROOT=str(lake), DAGSTER_HOME=str(home), **engine_env, **deployment_env)
    command = pipeline_command(SCALE_FACTOR, 1, SEED)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-8000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failed_checks"] == []
    assert_silver_matches_contract(lake)
    assert_gold_matches_duckdb(lake)
    return report


@pytest.mark.parametrize("engine", ["delta-spark", "delta-rs"])
def test_pipeline_on_a_standalone_cluster(tmp_path, engine):
    # The delta-rs engine's executors write Parquet with Spark and its driver commits with
    # delta-rs; on delta-spark the jars travel to the executor.
    if engine == "delta-spark" and delta_spark_source() is None:
        pytest.skip(f"delta-spark on the cluster not tested: {NO_DELTA_SPARK}")
    if engine == "delta-spark" and not os.environ.get("MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE"):
        # The suite's time budget: test_engine_switch.py's delta-spark run is on a standalone cluster.
        pytest.skip(
            "budget: delta-spark on the cluster runs in test_engine_switch.py; "
            "set MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE=1 to run it here too"
        )
    if (
        engine == "delta-rs"
        and delta_spark_source() is not None
        and not os.environ.get("MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE")
    ):
        # The suite's time budget: with delta-spark, test_engine_switch.py runs the cluster deployment.
        pytest.skip(
            "budget: the cluster deployment runs in test_engine_switch.py (delta-spark); "
            "set MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE=1 to run it on delta-rs too"
        )
    engine_env = {"MEDALLION_DELTA_ENGINE": engine, **((delta_spark_source() or {}) if engine == "delta-spark" else {})}
    with standalone_cluster(tmp_path) as master:
        report = _run_pipeline(
            tmp_path,
            {"MEDALLION_DEPLOYMENT": "cluster", "SPARK_MASTER_URL": master, "PYSPARK_PYTHON": sys.executable},
            engine_env,
        )
    assert set(report["engines"].values()) == {engine}
    assert_the_first_minute_is_explained(report, engine=engine, deployment=f"cluster at {master}")


@pytest.mark.parametrize("engine", ["delta-spark", "delta-rs"])
def test_pipeline_over_spark_connect(tmp_path, engine):
    # Both engines here: each has its own Connect route (Delta SQL; a Python data source on the server).
    if engine == "delta-spark" and delta_spark_source() is None:
        pytest.skip(f"delta-spark over Connect not tested: {NO_DELTA_SPARK}")
    if engine == "delta-spark" and not os.environ.get("MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE"):
        # The suite's time budget: one end-to-end run per deployment (Connect on delta-rs,
        # the cluster on delta-spark). delta-spark's Connect route (Delta SQL) is covered by
        # the Connect write test below; this whole run takes about 8 minutes more.
        pytest.skip(
            "budget: set MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE=1 to run the pipeline over Connect on delta-spark too"
        )
    engine_env = {"MEDALLION_DELTA_ENGINE": engine, **((delta_spark_source() or {}) if engine == "delta-spark" else {})}
    # The server is the session: it gets the engine's jars (or packages) and settings, as a deployment's would.
    plan = delta_spark_plan(engine) if engine == "delta-spark" else plan_engine(engine)  # type: ignore[arg-type]
    with connect_server(tmp_path, spark_config=plan.spark_config, python=sys.executable) as remote:
        report = _run_pipeline(tmp_path, {"MEDALLION_DEPLOYMENT": "connect", "SPARK_REMOTE": remote}, engine_env)
    assert set(report["engines"].values()) == {engine}
    assert_the_first_minute_is_explained(report, engine=engine, deployment=f"Spark Connect server {remote.rstrip('/')}")


# The Connect client runs in a process of its own: this test session's process already
# holds a regular SparkSession, and PySpark allows no remote session beside it.
_WRITE_OVER_CONNECT = """
import sys
from pyspark.sql import SparkSession, functions as F, types as T
from medallion_assets.io_manager import WriteSpec
from medallion_assets.storage.client import DeltaTableClient

remote, path = sys.argv[1:]
spark = SparkSession.builder.remote(remote).getOrCreate()
frame = spark.range(3).select(
    F.col("id"), F.col("id").cast(T.StringType()).alias("name"),
    F.array(F.col("id").cast(T.StringType())).alias("tags"),
)
client = DeltaTableClient(spark)
assert client.engine.name == "delta-spark", client.engine.name
client.write(frame, path, WriteSpec(mode="overwrite"))
client.write(frame.where("id = 0"), path, WriteSpec(mode="append"))
spark.stop()
"""


def test_tables_written_over_connect_by_delta_spark_are_readable_by_delta_rs(tmp_path):
    # A cast to a StringType object reaches the server with an explicit collation, which
    # delta-spark would store as "string collate UTF8_BINARY" (unreadable by delta-rs).
    from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

    if delta_spark_source() is None:
        pytest.skip(f"delta-spark over Connect not tested: {NO_DELTA_SPARK}")
    plan = delta_spark_plan()
    path = str(tmp_path / "t")
    with connect_server(tmp_path, spark_config=plan.spark_config, python=sys.executable) as remote:
        done = subprocess.run(
            [sys.executable, "-c", _WRITE_OVER_CONNECT, remote, path], capture_output=True, text=True, timeout=600
        )
    assert done.returncode == 0, done.stderr[-6000:]
    rows = sorted(tuple(r.values()) for r in read_with_deltalake(path).to_pylist())
    assert rows == [(0, "0", ["0"]), (0, "0", ["0"]), (1, "1", ["1"]), (2, "2", ["2"])]
    assert read_with_duckdb(path).num_rows == 4


# ---------------------------------------------------------------- Kafka feeds


def _produce_order_events(kafka, partitions: int = 3, per_partition: int = 10) -> list[int]:
    """``partitions * per_partition`` order events (one order each) on the topic, produced with
    confluent-kafka's own producer; returns the order keys."""
    keys = list(range(1, partitions * per_partition + 1))
    for partition in range(partitions):
        lines = [order_event_line(key, f"k{key}").encode() for key in keys[partition::partitions]]
        produce(kafka.client_config(), kafka.topic, lines, partition=partition)
    return keys


def _run_kafka_feed(tmp_path, kafka: KafkaResource, deployment_env: dict[str, str]) -> dict:
    """The Kafka feed's bronze and silver's orders step in a Dagster run of the deployment (delta-rs engine)."""
    lake = tmp_path / "lake"
    (lake / "landing" / "orders").mkdir(parents=True)  # the file feed beside it has nothing landed
    env = dict(
        os.environ,
        MEDALLION_LAKE_ROOT=str(lake),
        MEDALLION_DELTA_ENGINE="delta-rs",
        **{name: str(getattr(kafka, field)) for name, field in KAFKA_VARIABLES.items() if getattr(kafka, field)},
        **deployment_env,
    )
    command = [sys.executable, "-m", "medallion_assets_tests.support.kafka_feed_runner"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-8000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["success"], (report, done.stderr[-8000:])
    return report


def _assert_every_message_once(tmp_path, kafka, keys: list[int]) -> None:
    from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

    lake = tmp_path / "lake"
    rows = read_with_duckdb(lake / "bronze" / "orders_kafka").to_pylist()
    positions = Counter((r["partition"], r["offset"]) for r in rows)
    expected = {(p, o) for p, end in latest_offsets(kafka).items() for o in range(end)}
    assert set(positions) == expected and set(positions.values()) == {1}, "every (partition, offset) once"
    orders = read_with_deltalake(lake / "silver" / "orders").to_pylist()
    assert sorted(r["o_orderkey"] for r in orders) == keys


@pytest.mark.timeout(600)
def test_kafka_feed_on_a_standalone_cluster(tmp_path, kafka_broker, monkeypatch):
    # The connector comes from Maven (or KAFKA_SPARK_JARS) on the driver; the executor fetches its jars from there.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))  # the worker's Python imports this checkout
    kafka = kafka_broker.topic(partitions=3)
    keys = _produce_order_events(kafka)
    with standalone_cluster(tmp_path) as master:
        report = _run_kafka_feed(
            tmp_path,
            kafka,
            {"MEDALLION_DEPLOYMENT": "cluster", "SPARK_MASTER_URL": master, "PYSPARK_PYTHON": sys.executable},
        )
    assert report["engines"]["bronze/orders_kafka"] == "delta-rs", report
    _assert_every_message_once(tmp_path, kafka, keys)
    shipped = [p.name for p in (tmp_path / "work").rglob("*.jar") if "spark-sql-kafka-0-10" in p.name]
    assert shipped, "the executor fetched the connector's jar from the driver"


@pytest.mark.timeout(600)
def test_kafka_feed_over_spark_connect_with_sasl_over_tls(tmp_path, kafka_broker, monkeypatch):
    # The server is started as docs/kafka.md says, with the connector from Maven; the client's own
    # connector settings do not reach it (off here, so only the server's can serve). The broker takes
    # SCRAM over TLS: the JAAS line travels to the server with the query's options.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))  # the server's Python workers import this checkout
    secured = Broker(kafka_broker.jars, tmp_path / "broker", sasl_ssl=True)
    try:
        password = f"pw-{uuid.uuid4().hex}"
        secured.add_scram_user("ingest", password)
        kafka = KafkaResource(
            bootstrap_servers=secured.sasl_bootstrap,
            topic=f"orders-{uuid.uuid4().hex[:8]}",
            security_protocol="SASL_SSL",
            sasl_mechanism=SCRAM_MECHANISM,
            sasl_username="ingest",
            sasl_password=password,
            ssl_ca_location=str(secured.ca_file),
        )
        secured.create_topic(kafka.topic, 3)
        keys = _produce_order_events(kafka)
        with documented_connect_server(tmp_path) as remote:
            env = {"MEDALLION_DEPLOYMENT": "connect", "SPARK_REMOTE": remote, "MEDALLION_KAFKA_MAVEN": "false"}
            report = _run_kafka_feed(tmp_path, kafka, env)
        assert report["engines"]["bronze/orders_kafka"] == "delta-rs", report
        _assert_every_message_once(tmp_path, kafka, keys)
        assert password not in (tmp_path / "connect.log").read_text(errors="replace"), "the server logs no password"
    finally:
        secured.stop()


_KAFKA_OVER_CONNECT_WITHOUT_CONNECTOR = """
import sys
from pyspark.sql import SparkSession
from medallion_assets.ingest import start_kafka_stream
from medallion_assets.kafka import KafkaError, KafkaResource
from medallion_assets.pipelines.tpch.feeds import ORDERS_KAFKA
from medallion_assets.resources import LakeResource

remote, root, servers, topic = sys.argv[1:]
spark = SparkSession.builder.remote(remote).getOrCreate()
try:
    kafka = KafkaResource(bootstrap_servers=servers, topic=topic)
    start_kafka_stream(spark, LakeResource(root=root), kafka, ORDERS_KAFKA)
except KafkaError as error:
    print(error)
spark.stop()
"""


@pytest.mark.timeout(600)
def test_a_connect_server_without_the_kafka_connector_is_a_clear_error(tmp_path, kafka_broker):
    kafka = kafka_broker.topic(partitions=1)
    plan = plan_engine("delta-rs")
    with connect_server(tmp_path, spark_config=plan.spark_config, python=sys.executable) as remote:
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                _KAFKA_OVER_CONNECT_WITHOUT_CONNECTOR,
                remote,
                str(tmp_path / "lake"),
                kafka.bootstrap_servers,
                kafka.topic,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
        )
    assert done.returncode == 0, done.stderr[:3000]
    assert "the Spark Connect server has no Kafka connector" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:" in done.stdout
