"""Order events from Kafka: Apache Kafka on 127.0.0.1 (KRaft, from Maven), Spark's Kafka connector, real Dagster runs.

* A noisy TPC-H delivery published to a three-partition topic goes through
  the whole pipeline; silver equals the landing contract's state and gold
  equals DuckDB's TPC-H answers; a second publish and run takes only the new
  messages; bad messages are quarantined with their partition and offset.
* The consumer-lag check goes red when the stream falls behind or stops
  committing, and green when it catches up; its lag per partition matches the
  broker's own ListOffsets answer, also after partitions are added with the
  admin API between runs (the next run takes the new partitions from offset
  0); the checkpoint sensor reports each batch's offset ranges.
* Continuous mode rides a broker killed and started again mid-stream.
* SASL_SSL with SCRAM: the credentials through ``EnvVar``, the broker's
  certificate trusted through ``MEDALLION_KAFKA_SSL_CA_LOCATION``; the password
  in no log, event, process list or file.
* A broker that is down and a topic that does not exist are clear errors
  that leave the checkpoint untouched.
* The Kafka ingest killed (SIGKILL) after a batch's Delta commit and before
  its checkpoint commit, and while a batch writes, ends with every message
  once.

Every test checks bronze against what the broker holds: each (partition,
offset) exactly once. The tests produce with confluent-kafka's producer
directly (``kafka_broker.produce``), except where the project's publisher is
what is tested (the simulator's delivery, a refused message).

Skipped, saying why, where Spark's Kafka connector (from Maven, or the jars
of ``KAFKA_SPARK_JARS``)
or the broker are missing (see the ``kafka_broker`` fixture).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import deltalake
import pyarrow as pa
import pytest
from dagster import AssetKey, DagsterInstance, build_sensor_context, materialize

from medallion_assets.checkpoints import read_checkpoint
from medallion_assets.kafka import (
    KafkaError,
    KafkaResource,
    latest_offsets,
    publish_files,
    publish_lines,
    watermark_offsets,
)
from medallion_assets.pipelines.tpch.feeds import ORDERS_KAFKA
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.stream_monitoring import kafka_lag
from medallion_assets_tests.support.kafka_broker import free_port, produce
from medallion_assets_tests.support.kill_points import StreamWatch, kill_when, sink_engines, undo_checkpoint_commit
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

KAFKA_STREAM = ORDERS_KAFKA.name


def _bronze_messages(table: str, reader) -> Counter:
    rows = reader(table).to_pylist()
    return Counter((r["partition"], r["offset"], r["value"]) for r in rows)


def _published_messages(kafka: KafkaResource) -> Counter:
    """Every message of the topic, read back with the Python client (not Spark)."""
    from confluent_kafka import Consumer, TopicPartition

    ends = {p: high for p, (_, high) in watermark_offsets(kafka).items()}
    consumer = Consumer({**kafka.client_config(), "group.id": "test-reader", "enable.auto.commit": "false"})
    consumer.assign([TopicPartition(kafka.topic, p, 0) for p in ends])
    found: Counter = Counter()
    deadline = time.monotonic() + 60
    while sum(found.values()) < sum(ends.values()) and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            found[(message.partition(), message.offset(), message.value().decode("utf-8", "replace"))] += 1
    consumer.close()
    assert sum(found.values()) == sum(ends.values()), "read every published message back"
    return found


def _table_version(table: str) -> int:
    return deltalake.DeltaTable(table).version()


def _resources(spark_session, lake: LakeResource, kafka: KafkaResource) -> dict:
    from medallion_assets.io_manager import DeltaIOManager

    spark = SparkResource()
    return {"spark": spark, "lake": lake, "kafka": kafka, "io_manager": DeltaIOManager(spark=spark, lake=lake)}


def test_broker_down_and_unknown_topic_are_clear_errors(spark, kafka_broker, tmp_path):
    from medallion_assets.ingest import start_kafka_stream

    lake = LakeResource(root=str(tmp_path / "lake"))
    missing = KafkaResource(bootstrap_servers=kafka_broker.bootstrap, topic="no-such-topic")
    with pytest.raises(KafkaError, match="topic 'no-such-topic' does not exist"):
        start_kafka_stream(spark, lake, missing, ORDERS_KAFKA)
    down = KafkaResource(bootstrap_servers=f"127.0.0.1:{free_port()}", topic="orders")
    with pytest.raises(KafkaError, match="did not answer"):
        watermark_offsets(down, timeout_seconds=3)
    assert not os.path.exists(lake.checkpoint_dir(KAFKA_STREAM)), "nothing was planned"
    with pytest.raises(KafkaError, match="MEDALLION_KAFKA_BOOTSTRAP_SERVERS"):
        watermark_offsets(KafkaResource())

    # A message too big: the ones before it are delivered, and the error says which one and what to raise.
    kafka = kafka_broker.topic(partitions=1)
    with pytest.raises(
        KafkaError, match=r"message 3 \(2,000,000 bytes\).*refused.*2 before it were delivered.*message.max.bytes"
    ):
        publish_lines(kafka, [b'{"a": 1}', b'{"a": 2}', b"x" * 2_000_000, b'{"a": 4}'])
    assert latest_offsets(kafka) == {0: 2}


def test_lag_check_and_checkpoint_sensor_with_partitions_added(spark, kafka_broker, tmp_path):
    from medallion_assets.sensors import build_checkpoint_sensor, build_kafka_lag_check
    from medallion_assets_tests.support.tpch_assets import orders_kafka

    kafka = kafka_broker.topic(partitions=3, max_lag_messages=5, stall_after_seconds=2)
    lake = LakeResource(root=str(tmp_path / "lake"))
    lines = [json.dumps({"event_id": f"e{i}", "n": i}).encode() for i in range(30)] + [b"not json", b"\xff\xfe"]
    for partition in range(3):  # every partition, several records per batch
        produce(kafka.client_config(), kafka.topic, lines[partition::3], partition=partition)

    behind = kafka_lag(lake, kafka, ORDERS_KAFKA)
    assert not behind.passed and behind.lag == {0: 11, 1: 11, 2: 10}, behind
    assert behind.latest == kafka_broker.end_offsets(kafka.topic), "the broker's own ListOffsets answer"
    assert "consumer lag 32 messages" in behind.problems[0]

    instance = DagsterInstance.ephemeral()
    check = build_kafka_lag_check(ORDERS_KAFKA)
    run = materialize([orders_kafka, check], resources=_resources(spark, lake, kafka), instance=instance)
    [evaluation] = run.get_asset_check_evaluations()
    assert evaluation.passed, evaluation.description
    assert evaluation.metadata["consumer_lag"].value == 0
    table = lake.table_path(["bronze", KAFKA_STREAM])
    assert _bronze_messages(table, read_with_duckdb) == _published_messages(kafka)

    # Everything consumed: the next run compares the broker's end offsets with the checkpoint's and stands
    # down before asking for the session (a fresh process would start no JVM: test_nothing_new.py).
    committed, version = read_checkpoint(lake.checkpoint_dir(KAFKA_STREAM)).last_committed, _table_version(table)
    quiet = materialize([orders_kafka], resources=_resources(spark, lake, kafka), instance=instance)
    assert quiet.get_asset_materialization_events() == [], "nothing new on the topic, nothing materialized"
    said = [r.user_message for r in instance.all_logs(quiet.run_id) if r.dagster_event is None]
    assert any("nothing new" in line and "no Spark session started" in line for line in said), said
    assert read_checkpoint(lake.checkpoint_dir(KAFKA_STREAM)).last_committed == committed
    assert _table_version(table) == version

    sensor = build_checkpoint_sensor(ORDERS_KAFKA)
    context = build_sensor_context(instance=instance, resources={"lake": lake, "kafka": kafka})
    result = sensor(context)
    materializations = [e for e in result.asset_events if type(e).__name__ == "AssetMaterialization"]
    ranges = [m.metadata["offset_ranges"].value[kafka.topic] for m in materializations]
    covered = Counter()
    for batch in ranges:
        for partition, (first, end) in batch.items():
            covered[int(partition)] += end - first
    assert dict(covered) == kafka_broker.end_offsets(kafka.topic)
    assert sum(m.metadata["rows"].value for m in materializations) == 32
    assert result.run_requests, "new batches request silver and gold"

    # Two partitions added with the admin API between runs; messages go to a new one and an old one.
    # The stream stops committing: fewer messages than the lag limit, but older than the stall limit.
    kafka_broker.add_partitions(kafka.topic, 5)
    produce(kafka.client_config(), kafka.topic, [b'{"late": 1}', b'{"late": 2}'], partition=4)
    produce(kafka.client_config(), kafka.topic, [b'{"late": 3}'], partition=0)
    time.sleep(3)
    stalled = kafka_lag(lake, kafka, ORDERS_KAFKA)
    assert not stalled.passed and any("stopped committing" in p for p in stalled.problems), stalled
    assert stalled.latest == kafka_broker.end_offsets(kafka.topic) == {0: 12, 1: 11, 2: 10, 3: 0, 4: 2}
    assert stalled.lag == {0: 1, 1: 0, 2: 0, 3: 0, 4: 2}, "lag per partition, the new ones included"
    run = materialize([orders_kafka, check], resources=_resources(spark, lake, kafka), instance=instance)
    [evaluation] = run.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.metadata["consumer_lag"].value == 0, evaluation.description
    published = _published_messages(kafka)
    assert {p for p, _, _ in published} == {0, 1, 2, 4}
    assert _bronze_messages(table, read_with_duckdb) == published, "every (partition, offset) once"
    # The sensor's next tick reports only the new batch, starting where the last one ended (0 on a new partition).
    context = build_sensor_context(instance=instance, cursor=result.cursor, resources={"lake": lake, "kafka": kafka})
    later = [e for e in sensor(context).asset_events if type(e).__name__ == "AssetMaterialization"]
    assert sum(m.metadata["rows"].value for m in later) == 3
    later_ranges = later[0].metadata["offset_ranges"].value[kafka.topic]
    assert later_ranges["4"] == [0, 2] and later_ranges["0"] == [11, 12], later_ranges
    for partition, (first, _end) in later_ranges.items():
        assert first == max((b.get(partition, [0, 0])[1] for b in ranges), default=0)


@pytest.mark.slow
def test_continuous_mode_rides_a_broker_restart(spark, kafka_broker, tmp_path):
    import threading

    from medallion_assets.continuous import ContinuousStreamsConfig, run_continuous

    kafka = kafka_broker.topic(partitions=3)
    lake = LakeResource(root=str(tmp_path / "lake"))
    table = lake.table_path(["bronze", KAFKA_STREAM])
    config = ContinuousStreamsConfig(streams=[KAFKA_STREAM], trigger_interval="1 second", poll_seconds=0.5)
    lines = [json.dumps({"event_id": f"live{i}"}).encode() for i in range(30)]
    stop = threading.Event()
    failures: list[BaseException] = []

    def bronze_rows() -> int:
        try:
            return deltalake.DeltaTable(table).to_pyarrow_table().num_rows
        except Exception:  # no table yet, or a commit being written: look again
            return 0

    logged: list[str] = []

    def batches_reported() -> int:
        return sum(line.startswith(f"{KAFKA_STREAM}: batch ") for line in list(logged))

    def wait_for(total: int, reports: int) -> None:
        # Spark commits a batch to the table before it reports the batch's progress,
        # and a stop in between loses the report: wait for both.
        deadline = time.monotonic() + 180
        while (bronze_rows() < total or batches_reported() < reports) and time.monotonic() < deadline:
            time.sleep(0.5)

    def producer() -> None:
        # A burst; the broker killed (SIGKILL) and started again on its log folder and port while
        # the stream runs (its triggers keep firing); a burst across every partition after it.
        try:
            produce(kafka.client_config(), kafka.topic, lines[:12])
            wait_for(12, 1)
            kafka_broker.stop(signal.SIGKILL)
            time.sleep(3)  # triggers fire against a broker that is gone
            kafka_broker.start()
            for partition in range(3):
                produce(kafka.client_config(), kafka.topic, lines[12 + partition :: 3], partition=partition)
            wait_for(30, 2)
        except BaseException as error:  # surfaced in the test's thread below
            failures.append(error)
        finally:
            stop.set()

    thread = threading.Thread(target=producer)
    thread.start()
    run = run_continuous(
        spark,
        lake,
        config,
        should_stop=stop.is_set,
        install_signal_handlers=False,
        kafka=kafka,
        log_progress=logged.append,
    )
    thread.join()
    assert not failures, failures
    assert run.stopped_by == "request", "the stream went on through the restart"
    assert len(run.progress[KAFKA_STREAM]) >= 2, "the bursts came in separate micro-batches"
    published = _published_messages(kafka)
    assert sum(published.values()) == 30
    assert _bronze_messages(table, read_with_deltalake) == published, "every (partition, offset) once"
    assert kafka_lag(lake, kafka, ORDERS_KAFKA).lag == {0: 0, 1: 0, 2: 0}


@pytest.mark.slow
def test_sasl_scram_over_tls_with_the_password_in_no_log(spark, kafka_broker, tmp_path, monkeypatch, capfd, caplog):
    import threading
    import uuid

    from dagster import AssetSelection, EnvVar, serialize_value

    from medallion_assets.definitions import build_definitions
    from medallion_assets_tests.support.kafka_broker import SCRAM_MECHANISM, Broker

    secured = Broker(kafka_broker.jars, tmp_path / "broker", sasl_ssl=True)
    try:
        password = f"pw-{uuid.uuid4().hex}"
        secured.add_scram_user("ingest", password)
        topic = f"orders-{uuid.uuid4().hex[:8]}"
        secured.create_topic(topic, 2)
        lines = [json.dumps({"event_id": f"s{i}"}).encode() for i in range(20)]
        for partition in range(2):
            produce(
                {
                    "bootstrap.servers": secured.sasl_bootstrap,
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": SCRAM_MECHANISM,
                    "sasl.username": "ingest",
                    "sasl.password": password,
                    "ssl.ca.location": str(secured.ca_file),
                },
                topic,
                lines[partition::2],
                partition=partition,
            )

        lake = tmp_path / "lake"
        for name, value in (
            ("MEDALLION_LAKE_ROOT", str(lake)),
            ("MEDALLION_KAFKA_BOOTSTRAP_SERVERS", secured.sasl_bootstrap),
            ("MEDALLION_KAFKA_TOPIC", topic),
            ("MEDALLION_KAFKA_SECURITY_PROTOCOL", "SASL_SSL"),
            ("MEDALLION_KAFKA_SASL_MECHANISM", SCRAM_MECHANISM),
            ("MEDALLION_KAFKA_SASL_USERNAME", "ingest"),
            ("MEDALLION_KAFKA_SASL_PASSWORD", password),
            ("MEDALLION_KAFKA_SSL_CA_LOCATION", str(secured.ca_file)),
        ):
            monkeypatch.setenv(name, value)
        defs = build_definitions("local", kafka=True)
        assert isinstance(defs.resources["kafka"].sasl_password, EnvVar), "the password reaches Dagster by name"

        # The process list, sampled while the run goes: the password on no command line.
        command_lines: list[str] = []
        running = threading.Event()

        def sample_processes() -> None:
            while not running.wait(0.3):
                command_lines.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)

        sampler = threading.Thread(target=sample_processes)
        sampler.start()
        instance = DagsterInstance.ephemeral()
        key = AssetKey(["bronze", KAFKA_STREAM])
        try:
            run = materialize(
                [*defs.assets, *defs.asset_checks],
                selection=AssetSelection.assets(key),
                resources=defs.resources,
                instance=instance,
            )
        finally:
            running.set()
            sampler.join()
        assert run.success
        [evaluation] = run.get_asset_check_evaluations()  # the lag check, through librdkafka over SASL_SSL
        assert evaluation.passed and evaluation.metadata["consumer_lag"].value == 0, evaluation.description
        table = str(lake / "bronze" / KAFKA_STREAM)
        read_back = {(r["partition"], r["offset"]): r["value"] for r in read_with_duckdb(table).to_pylist()}
        assert len(read_back) == read_with_duckdb(table).num_rows == 20, "every (partition, offset) once"
        assert read_back == {(p, o): lines[p + 2 * o].decode() for p in range(2) for o in range(10)}

        captured = capfd.readouterr()
        places = {
            "the run's stdout": captured.out,
            "the run's stderr (Spark's log too)": captured.err,
            "Python's log": caplog.text,
            "the process list": "\n".join(command_lines),
            "the Dagster event log": "\n".join(serialize_value(e) for e in instance.all_logs(run.run_id)),
            "the run's config": serialize_value(instance.get_run_by_id(run.run_id).run_config),
            "the broker's log": secured.log.read_text(errors="replace"),
        }
        assert command_lines, "the process list was sampled during the run"
        assert [where for where, text in places.items() if password in text] == []
        in_files = [str(f) for f in lake.rglob("*") if f.is_file() and password.encode() in f.read_bytes()]
        assert in_files == [], "nor in the lake or the stream's checkpoint"
    finally:
        secured.stop()


# ---------------------------------------------------------------- end to end


@pytest.mark.slow
def test_noisy_tpch_delivery_over_kafka(spark, kafka_broker, tmp_path, monkeypatch):
    from medallion_assets.definitions import build_definitions
    from medallion_assets.pipelines.tpch import simulator
    from medallion_assets_tests.support.pipeline_checks import (
        assert_gold_matches_duckdb,
        assert_no_check_errs,
        assert_silver_matches_contract,
        materialize_everything,
    )

    kafka = kafka_broker.topic(partitions=3)
    lake = tmp_path / "lake"
    monkeypatch.setenv("MEDALLION_LAKE_ROOT", str(lake))
    monkeypatch.setenv("MEDALLION_KAFKA_BOOTSTRAP_SERVERS", kafka.bootstrap_servers)
    monkeypatch.setenv("MEDALLION_KAFKA_TOPIC", kafka.topic)
    defs = build_definitions("local", kafka=True)
    instance = DagsterInstance.ephemeral()
    land = dict(
        scale_factor=0.01, batches=2, seed=13, order_events_to="kafka", publish=functools.partial(publish_files, kafka)
    )
    table = str(lake / "bronze" / KAFKA_STREAM)

    def published_lines(batch) -> int:
        return sum(1 for f in batch.files if f.suffix == ".json" for line in f.open("rb") if line.strip())

    # The contract's state is computed from what was published (kept under landing/_published).
    contract_view = tmp_path / "published-landing"
    contract_view.mkdir()
    (lake / "landing").mkdir(parents=True, exist_ok=True)
    for name, target in (
        ("orders", lake / "landing" / simulator.PUBLISHED_FOLDER / "orders"),
        ("customers", lake / "landing" / "customers"),
        ("reference", lake / "landing" / "reference"),
    ):
        (contract_view / name).symlink_to(target, target_is_directory=True)

    batch1 = simulator.land_next_batch(lake / "landing", **land)
    assert not list((lake / "landing" / "orders").glob("*.json")) if (lake / "landing" / "orders").exists() else True
    run1 = materialize_everything(defs, instance)
    assert_no_check_errs(run1)
    assert_silver_matches_contract(lake, landing=contract_view)
    assert_gold_matches_duckdb(lake)
    first_version = deltalake.DeltaTable(table).version()
    ends_after_1 = kafka_lag(LakeResource(root=str(lake)), kafka, ORDERS_KAFKA).committed

    batch2 = simulator.land_next_batch(lake / "landing", **land)
    run2 = materialize_everything(defs, instance)
    assert_no_check_errs(run2)
    assert_silver_matches_contract(lake, landing=contract_view)
    assert_gold_matches_duckdb(lake)

    # Bronze holds every published message once, as delivered.
    assert _bronze_messages(table, read_with_deltalake) == _published_messages(kafka)
    # The second run took only the second publish.
    [m2] = [m for m in run2.get_asset_materialization_events() if m.asset_key == AssetKey(["bronze", KAFKA_STREAM])]
    assert m2.materialization.metadata["new_rows"].value == published_lines(batch2)
    assert deltalake.DeltaTable(table).version() > first_version
    added = pa.table(deltalake.DeltaTable(table).load_cdf(starting_version=first_version + 1).read_all()).to_pylist()
    assert len(added) == published_lines(batch2)
    assert all(r["offset"] >= ends_after_1[r["partition"]] for r in added)
    assert published_lines(batch1) + published_lines(batch2) == deltalake.DeltaTable(table).to_pyarrow_table().num_rows

    # Bad messages are quarantined with their partition and offset (as the message they were: rows a
    # drop expectation set aside are quarantined as typed rows, without the message's value).
    quarantined = [
        r
        for r in read_with_deltalake(lake / "quarantine" / "orders").to_pylist()
        if (r["_source_file"] or "").startswith("kafka://") and "value" in json.loads(r["record"])
    ]
    assert quarantined, "the noisy delivery has bad lines"
    by_position = {(r["partition"], r["offset"]): r["value"] for r in read_with_deltalake(table).to_pylist()}
    for row in quarantined[:50]:
        topic, partition, offset = row["_source_file"][len("kafka://") :].rsplit("/", 2)
        assert topic == kafka.topic
        assert json.loads(row["record"])["value"] == by_position[(int(partition), int(offset))]


# ---------------------------------------------------------------- crash recovery


def _start_ingest(root: Path, kafka: KafkaResource, per_batch: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "MEDALLION_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "MEDALLION_KAFKA_TOPIC": kafka.topic,
    }
    log = root.parent / f"run-{len(list(root.parent.glob('run-*.log')))}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "medallion_assets_tests.support.ingest_runner", str(root), KAFKA_STREAM, str(per_batch)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    proc.log = log
    return proc


@pytest.mark.slow
@pytest.mark.both_engines
@pytest.mark.timeout(1800)
def test_kafka_ingest_killed_ends_exactly_once(kafka_broker, tmp_path, delta_engine):
    kafka = kafka_broker.topic(partitions=3)
    root = tmp_path / "lake"
    lake = LakeResource(root=str(root))
    table = lake.table_path(["bronze", KAFKA_STREAM])
    ckpt = lake.checkpoint_dir(KAFKA_STREAM)
    watch = StreamWatch(ckpt, table)

    def txn_version() -> int | None:
        return deltalake.DeltaTable(table).transaction_version(read_checkpoint(ckpt).query_id)

    # 1. After batch 1's Delta commit, before Spark's checkpoint commit of batch 1 (30 messages a batch).
    publish_lines(kafka, [json.dumps({"event_id": f"a{i}"}).encode() for i in range(60)])
    # Stepped from batch 1's plan: Kafka's rate limit may split the 60 messages into three batches,
    # and batch 2 can be planned tens of milliseconds after commits/1, inside one poll.
    kill_when(
        _start_ingest(root, kafka, 30),
        watch,
        lambda s: s.txn is not None and s.txn >= 1,
        what="batch 1's Delta commit",
        step_once=lambda s: 1 in s.offsets,
    )
    state = read_checkpoint(ckpt)
    assert max(state.offsets) == 1, f"nothing after batch 1 can be planned: {state}"
    undo_checkpoint_commit(ckpt, 1)
    assert 1 not in read_checkpoint(ckpt).commits and txn_version() == 1

    # 2. While batch 2's tasks write: a large batch, killed once a data file no commit adds appears.
    publish_lines(kafka, [json.dumps({"event_id": f"b{i}", "pad": "x" * 300}).encode() for i in range(20_000)])
    earlier_orphans = watch.look().uncommitted
    kill_when(
        _start_ingest(root, kafka, 100_000),
        watch,
        lambda s: 2 in s.offsets and s.txn == 1 and bool(s.uncommitted - earlier_orphans),
        what="batch 2's tasks writing",
        step_once=lambda s: 2 in s.offsets,
    )
    assert txn_version() == 1, "killed before batch 2's Delta commit"

    # 3. A clean run to the end.
    publish_lines(kafka, [b"not json", json.dumps({"event_id": "c0"}).encode()])
    proc = _start_ingest(root, kafka, 100_000)
    assert proc.wait(timeout=900) == 0, f"see {proc.log}"

    published = _published_messages(kafka)
    assert _bronze_messages(table, read_with_deltalake) == published
    assert _bronze_messages(table, read_with_duckdb) == published
    assert read_checkpoint(ckpt).pending() == []
    assert kafka_lag(lake, kafka, ORDERS_KAFKA).lag == {0: 0, 1: 0, 2: 0}
    assert sink_engines(table) == {delta_engine}, "the runs used the test session's engine"


def test_a_missing_connector_names_the_settings_that_bring_it():
    from medallion_assets.kafka import kafka_connector_missing

    package = f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version('pyspark')}"
    here = kafka_connector_missing(over_connect=False)
    assert "MEDALLION_KAFKA_MAVEN=true" in here and "KAFKA_SPARK_JARS" in here and package in here
    server = kafka_connector_missing(over_connect=True)
    assert f"--packages {package}" in server and "docs/kafka.md" in server
