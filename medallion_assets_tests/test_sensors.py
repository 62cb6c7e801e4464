"""Checkpoint and landing sensors, the stream health check, bronze protection.

The checkpoint folders here are written the way Spark writes them (``v1``
then JSON lines) and the bronze table is a real Delta table written by
delta-rs with app transactions and the stream sinks' commitInfo keys, so the
sensors read what a stream leaves behind. A test here and
``test_streaming_continuous.py`` run them against real streams.
"""

import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    SensorResult,
    SkipReason,
    build_sensor_context,
)

from medallion_assets.checkpoints import read_checkpoint
from medallion_assets.ingest import FullRefreshRefusedError, full_refresh_stream
from medallion_assets.kafka import KafkaResource
from medallion_assets.pipelines.tpch.feeds import CUSTOMERS_CDC, ORDERS_RAW
from medallion_assets.project import project_feeds
from medallion_assets.resources import LakeResource
from medallion_assets.sensors import (
    build_checkpoint_sensor,
    build_landing_sensor,
    build_stream_health_check,
)
from medallion_assets.stream_monitoring import StreamHealthPolicy, stream_health

pytestmark = pytest.mark.both_engines

FEED = ORDERS_RAW
STREAM = FEED.name


class FakeStream:
    """Writes what a stream leaves behind: checkpoint files and Delta commits with app transactions."""

    def __init__(self, lake: LakeResource, query_id: str = "q-1") -> None:
        self.lake = lake
        self.query_id = query_id
        self.ckpt = Path(lake.checkpoint_dir(STREAM))
        self.landing = Path(lake.landing_folder(FEED))
        self.table = lake.table_path(["bronze", STREAM])
        self.landing.mkdir(parents=True, exist_ok=True)
        (self.ckpt / "offsets").mkdir(parents=True, exist_ok=True)
        (self.ckpt / "commits").mkdir(parents=True, exist_ok=True)
        (self.ckpt / "sources" / "0").mkdir(parents=True, exist_ok=True)
        (self.ckpt / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
        self.batch = -1

    def land(self, name: str, lines: int, content: list[str] | None = None) -> str:
        path = self.landing / name
        path.write_text("".join(f"{line}\n" for line in content or [f'{{"event_id": "{i}"}}' for i in range(lines)]))
        return path.resolve().as_uri()

    def plan(self, files: list[str]) -> int:
        self.batch += 1
        b = self.batch
        (self.ckpt / "offsets" / str(b)).write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":' + str(b) + "}\n")
        (self.ckpt / "sources" / "0" / str(b)).write_text(
            "v1\n" + "".join(json.dumps({"path": f, "timestamp": 0, "batchId": b}) + "\n" for f in files)
        )
        return b

    def commit(self, rows: int, lines: list[str] | None = None) -> None:
        from deltalake import write_deltalake
        from deltalake.transaction import CommitProperties, Transaction

        data = pa.table({"value": pa.array(lines or [f"line {i}" for i in range(rows)], pa.string())})
        # The app transaction and the commitInfo keys both engines' stream sinks write
        # (delta-rs adds the write's own row and file counts).
        params = {"outputMode": "Append", "queryId": self.query_id, "epochId": str(self.batch)}
        write_deltalake(
            self.table,
            data,
            mode="append",
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self.query_id, self.batch)],
                custom_metadata={"operationParameters": params},
            ),
        )
        (self.ckpt / "commits" / str(self.batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')

    def run_batch(self, names_and_lines: list[tuple[str, int]]) -> int:
        files = [self.land(n, k) for n, k in names_and_lines]
        b = self.plan(files)
        self.commit(sum(k for _, k in names_and_lines))
        return b


@pytest.fixture
def lake(tmp_path):
    return LakeResource(root=str(tmp_path / "lake"))


@pytest.fixture(scope="module")
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def tick(sensor_def, lake, instance, cursor):
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake})
    result = sensor_def(context)
    return result


def materializations(result) -> list[AssetMaterialization]:
    if not isinstance(result, SensorResult):
        return []
    return [e for e in result.asset_events if isinstance(e, AssetMaterialization)]


def test_checkpoint_sensor_reports_each_batch_once(lake, instance):
    stream = FakeStream(lake)
    sensor_def = build_checkpoint_sensor(FEED)
    assert isinstance(tick(sensor_def, lake, instance, None), SensorResult)  # health only, nothing to report
    stream.run_batch([("a.json", 3), ("b.json", 2)])
    stream.run_batch([("c.json", 4)])

    first = tick(sensor_def, lake, instance, None)
    events = materializations(first)
    assert [e.metadata["batch_id"].value for e in events] == [0, 1]
    assert [e.metadata["rows"].value for e in events] == [5, 4]
    assert [e.metadata["input_files"].value for e in events] == [2, 1]
    assert [e.metadata["delta_version"].value for e in events] == [0, 1]
    assert [r.run_key for r in first.run_requests] == ["orders_raw:q-1:0-1"]
    health = [e for e in first.asset_events if isinstance(e, AssetCheckEvaluation)]
    assert len(health) == 1 and health[0].passed
    assert any(isinstance(e, AssetObservation) for e in first.asset_events)

    # Nothing new: no batch reported twice, no run requested.
    second = tick(sensor_def, lake, instance, first.cursor)
    assert materializations(second) == [] and not (isinstance(second, SensorResult) and second.run_requests)

    # A planned batch that has not committed yet is not reported...
    files = [stream.land("d.json", 6)]
    stream.plan(files)
    third = tick(sensor_def, lake, instance, second.cursor)
    assert materializations(third) == []
    # ... until it commits; the cursor (as the daemon stores it) carries over.
    stream.commit(6)
    fourth = tick(sensor_def, lake, instance, third.cursor)
    assert [e.metadata["batch_id"].value for e in materializations(fourth)] == [2]
    assert [r.run_key for r in fourth.run_requests] == ["orders_raw:q-1:2-2"]
    assert json.loads(fourth.cursor)["last_batch"] == 2


def test_checkpoint_sensor_starts_over_for_a_new_query(lake, instance, tmp_path):
    stream = FakeStream(lake)
    stream.run_batch([("a.json", 1)])
    sensor_def = build_checkpoint_sensor(FEED)
    first = tick(sensor_def, lake, instance, None)
    # Full refresh: checkpoint and table dropped, a new query id.
    full_refresh_stream(lake, FEED, allowed=True)
    fresh = FakeStream(lake, query_id="q-2")
    fresh.run_batch([("a.json", 1), ("b.json", 1)])
    again = tick(sensor_def, lake, instance, first.cursor)
    assert [e.metadata["batch_id"].value for e in materializations(again)] == [0]
    assert [e.metadata["query_id"].value for e in materializations(again)] == ["q-2"]


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_health_turns_red_for_stall_and_old_backlog_and_green_when_fresh(lake, instance):
    policy = StreamHealthPolicy(stall_after_seconds=60, max_backlog_age_seconds=120)
    stream = FakeStream(lake)
    stream.run_batch([("a.json", 2)])
    assert stream_health(lake, FEED, policy).passed

    # Fresh backlog and a fresh pending batch: green.
    stream.land("b.json", 1)
    stream.plan([stream.land("c.json", 1)])
    fresh = stream_health(lake, FEED, policy)
    assert fresh.passed and fresh.backlog_files == 1 and fresh.pending_batch == 1

    # The pending batch gets old: stalled.
    _age(stream.ckpt / "offsets" / "1", 300)
    stalled = stream_health(lake, FEED, policy)
    assert not stalled.passed and "batch 1" in stalled.problems[0] and stalled.pending_batch_age_seconds >= 299

    # The batch commits; the landed-but-untaken file gets old: behind.
    stream.commit(1)
    _age(stream.landing / "b.json", 600)
    behind = stream_health(lake, FEED, policy)
    assert not behind.passed and behind.backlog_files == 1 and behind.oldest_backlog_age_seconds >= 599
    assert "not taken by any batch" in behind.problems[0]

    # The same verdicts through the sensor (check evaluation + plotted observation) and the asset check.
    sensor_def = build_checkpoint_sensor(FEED, policy=policy)
    result = tick(sensor_def, lake, instance, None)
    evaluation = next(e for e in result.asset_events if isinstance(e, AssetCheckEvaluation))
    assert not evaluation.passed and evaluation.metadata["backlog_files"].value == 1
    # Taken by a batch: green again.
    stream.plan([(stream.landing / "b.json").resolve().as_uri()])
    stream.commit(1)
    assert stream_health(lake, FEED, policy).passed


def test_stream_health_check_definition(lake, instance):
    from dagster import Definitions, asset

    policy = StreamHealthPolicy(stall_after_seconds=60, max_backlog_age_seconds=120)
    stream = FakeStream(lake)
    stream.run_batch([("a.json", 2)])
    _age(stream.landing / "a.json", 1000)  # taken: its age does not matter
    stream.land("late.json", 1)
    _age(stream.landing / "late.json", 1000)

    @asset(key=["bronze", STREAM])
    def bronze_placeholder():
        return None

    check = build_stream_health_check(FEED, policy=policy)
    defs = Definitions(assets=[bronze_placeholder], asset_checks=[check], resources={"lake": lake})
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, raise_on_error=False)
    evaluations = result.get_asset_check_evaluations()
    assert len(evaluations) == 1 and not evaluations[0].passed
    assert evaluations[0].metadata["backlog_files"].value == 1


def test_landing_sensor_keys_runs_by_file_set(lake, instance):
    from dagster import job, op

    @op
    def noop():
        return None

    @job
    def ingest():
        noop()

    sensor_def = build_landing_sensor(ingest, feeds=project_feeds())
    assert isinstance(tick(sensor_def, lake, instance, None), SkipReason)
    stream = FakeStream(lake)
    stream.land("a.json", 1)
    stream.land("b.json", 1)
    first = tick(sensor_def, lake, instance, None)
    assert len(first.run_requests) == 1
    # The same files seen again (cursor lost) give the same run key: no second run.
    again = tick(sensor_def, lake, instance, None)
    assert again.run_requests[0].run_key == first.run_requests[0].run_key
    assert isinstance(tick(sensor_def, lake, instance, first.cursor), SkipReason)
    time.sleep(0.01)
    stream.land("c.json", 1)
    third = tick(sensor_def, lake, instance, first.cursor)
    assert third.run_requests[0].run_key != first.run_requests[0].run_key
    assert third.run_requests[0].tags["medallion/landed_files"] == "1"


def test_full_refresh_of_a_streaming_bronze_table_is_refused_unless_allowed(lake):
    stream = FakeStream(lake)
    stream.run_batch([("a.json", 1)])
    with pytest.raises(FullRefreshRefusedError, match="allow_full_refresh"):
        full_refresh_stream(lake, FEED, allowed=False)
    assert read_checkpoint(lake.checkpoint_dir(STREAM)).last_committed == 0
    full_refresh_stream(lake, FEED, allowed=True)
    assert read_checkpoint(lake.checkpoint_dir(STREAM)).query_id is None
    assert not Path(stream.table).exists()


def test_bronze_asset_refuses_full_refresh_by_default(lake, instance):
    from dagster import materialize

    from medallion_assets.resources import SparkResource
    from medallion_assets_tests.support.tpch_assets import orders_raw

    stream = FakeStream(lake)
    stream.run_batch([("a.json", 1)])
    result = materialize(
        [orders_raw],
        resources={"lake": lake, "spark": SparkResource(), "kafka": KafkaResource()},
        instance=instance,
        raise_on_error=False,
        run_config={"ops": {"bronze__orders_raw": {"config": {"full_refresh": True}}}},
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    error = failure.step_failure_data.error
    assert error.cause.cls_name == "FullRefreshRefusedError" and "allow_full_refresh" in error.cause.message
    assert read_checkpoint(lake.checkpoint_dir(STREAM)).last_committed == 0  # nothing dropped


def test_schema_drift_is_counted_and_kept_raw(lake, instance):
    stream = FakeStream(lake)
    lines = [
        '{"event_id": "1", "op": "upsert", "order": {"o_orderkey": 1}}',
        '{"event_id": "2", "op": "upsert", "channel": "web", "order": {"o_orderkey": 2, "o_discount_code": "X"}}',
        '{"event_id": "3", "op": "upsert", '
        '"order": {"o_orderkey": 3, "lineitems": [{"l_linenumber": 1, "l_gift": true}]}}',
        "not json",
    ]
    stream.plan([stream.land("a.json", 4, content=lines)])
    stream.commit(4, lines)
    result = tick(build_checkpoint_sensor(FEED), lake, instance, None)
    [event] = materializations(result)
    assert event.metadata["rows"].value == 4  # every line kept, drifted or not
    assert event.metadata["schema_drift_rows"].value == 2
    assert event.metadata["schema_drift_fields"].value == ["channel", "order.lineitems.l_gift", "order.o_discount_code"]


def test_drifted_files_stream_into_bronze_raw_and_are_counted(spark, lake, instance):
    """Real streams: an order with an unknown field and a CSV with an extra column do not stop them."""
    from medallion_assets.ingest import start_bronze_stream
    from medallion_assets.pipelines.tpch.contract import CUSTOMER_CSV_COLUMNS
    from medallion_assets_tests.support.readers import read_with_deltalake

    orders = Path(lake.landing_folder(ORDERS_RAW))
    customers = Path(lake.landing_folder(CUSTOMERS_CDC))
    orders.mkdir(parents=True)
    customers.mkdir(parents=True)
    (orders / "a.json").write_text(
        '{"event_id": "1", "op": "upsert", "order": {"o_orderkey": 1}}\n'
        '{"event_id": "2", "op": "upsert", "order": {"o_orderkey": 2, "o_loyalty_tier": "gold"}}\n'
    )
    header = ",".join([*CUSTOMER_CSV_COLUMNS, "c_email"])
    row = "I,7,Customer#7,Street,1,11-111,10.00,BUILDING,hi,2024-01-01T00:00:00Z,a@b.c"
    (customers / "a.csv").write_text(f"{header}\n{row}\n")
    for feed in (ORDERS_RAW, CUSTOMERS_CDC):
        query = start_bronze_stream(spark, lake, feed)
        query.awaitTermination()
        assert query.exception() is None
    bronze_orders = read_with_deltalake(lake.table_path(["bronze", "orders_raw"])).column("value").to_pylist()
    assert any("o_loyalty_tier" in v for v in bronze_orders) and len(bronze_orders) == 2
    bronze_customers = read_with_deltalake(lake.table_path(["bronze", "customers_cdc"])).to_pylist()
    assert len(bronze_customers) == 1 and "a@b.c" in (bronze_customers[0]["_corrupt_record"] or "")

    for feed, fields in ((ORDERS_RAW, ["order.o_loyalty_tier"]), (CUSTOMERS_CDC, ["c_email"])):
        [event] = materializations(tick(build_checkpoint_sensor(feed), lake, instance, None))
        assert event.metadata["schema_drift_rows"].value == 1
        assert event.metadata["schema_drift_fields"].value == fields


def test_sensor_batches_agree_with_independent_readers(spark, lake, instance):
    """A real stream on the session's engine: each batch's rows and version are what readers of the table see.

    The sensor takes them from the commitInfo the engine's sink records; delta-rs
    reading the table at each version (and DuckDB reading the last one) must agree.
    """
    from medallion_assets.ingest import start_bronze_stream
    from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb

    landing = Path(lake.landing_folder(FEED))
    landing.mkdir(parents=True)
    for i, count in enumerate([3, 1, 5]):
        lines = "".join(
            f'{{"event_id": "{i}-{j}", "op": "upsert", "order": {{"o_orderkey": {j}}}}}\n' for j in range(count)
        )
        (landing / f"{i}.json").write_text(lines)
        os.utime(landing / f"{i}.json", (1_700_000_000 + i, 1_700_000_000 + i))  # taken oldest first
    query = start_bronze_stream(spark, lake, FEED, max_files_per_trigger=1)
    query.awaitTermination()
    assert query.exception() is None

    events = materializations(tick(build_checkpoint_sensor(FEED), lake, instance, None))
    assert [e.metadata["batch_id"].value for e in events] == [0, 1, 2]
    table = lake.table_path(["bronze", STREAM])
    versions = [e.metadata["delta_version"].value for e in events]
    assert versions == sorted(versions) and versions[0] >= 0
    for event, version in zip(events, versions, strict=False):
        before = read_with_deltalake(table, version - 1).num_rows if version > 0 else 0
        assert event.metadata["rows"].value == read_with_deltalake(table, version).num_rows - before
    assert [e.metadata["rows"].value for e in events] == [3, 1, 5]
    assert read_with_duckdb(table).num_rows == 9


def test_batches_are_read_from_recent_history_and_old_sink_commits_still_count(lake, monkeypatch):
    """Paging stops at ``after_batch``.

    Commits of the delta-rs sink from before it recorded metrics are counted by delta-rs.
    """
    from deltalake import DeltaTable, write_deltalake
    from deltalake.transaction import AddAction, CommitProperties, Transaction

    import medallion_assets.checkpoints as checkpoints

    stream = FakeStream(lake)
    for rows in range(1, 6):
        stream.run_batch([(f"{rows}.json", rows)])
    # Another writer between batches, then a commit as the sink wrote it before: top-level
    # keys, no operationMetrics (create_write_transaction records none), adding a copy of batch 0's file.
    write_deltalake(stream.table, pa.table({"value": pa.array(["other"])}), mode="append")
    table = DeltaTable(stream.table)
    first = pa.table(DeltaTable(stream.table, version=0).get_add_actions(flatten=True)).to_pylist()[0]
    shutil.copy(os.path.join(stream.table, first["path"]), os.path.join(stream.table, "old-sink.parquet"))
    stream.plan([stream.land("old.json", 1)])
    table.create_write_transaction(
        [AddAction("old-sink.parquet", first["size_bytes"], {}, 1, True, f'{{"numRecords": {first["num_records"]}}}')],
        "append",
        table.schema(),
        [],
        commit_properties=CommitProperties(
            custom_metadata={"streamingQueryId": "q-1", "streamingBatchId": stream.batch},
            app_transactions=[Transaction("q-1", stream.batch)],
        ),
    )
    monkeypatch.setattr(checkpoints, "_HISTORY_PAGE", 2)
    pages = []
    history = DeltaTable.history
    monkeypatch.setattr(DeltaTable, "history", lambda self, limit=None: pages.append(limit) or history(self, limit))

    commits = checkpoints.delta_commits_of_query(stream.table, "q-1", after_batch=3)
    assert [(b, c.rows, c.data_files, c.delta_version) for b, c in sorted(commits.items())] == [
        (4, 5, 1, 4),
        (5, 1, 1, 6),
    ]
    assert pages == [2, 4]  # batch 3 (version 3) came in the second page: nothing older was read
    assert sorted(checkpoints.delta_commits_of_query(stream.table, "q-1")) == [0, 1, 2, 3, 4, 5]
    assert checkpoints.delta_commits_of_query(stream.table, "q-2") == {}


def test_health_sees_files_a_stream_took_through_a_symlinked_landing_folder(spark, tmp_path):
    # Spark's checkpoint keeps the path it read through (a linked landing folder, macOS's
    # /tmp); the landing listing resolves links. Taken files must not count as backlog.
    from medallion_assets.ingest import start_bronze_stream
    from medallion_assets_tests.support.order_events import order_event_line

    delivered = tmp_path / "delivered"
    (delivered / "orders").mkdir(parents=True)
    (delivered / "orders" / "batch-1.json").write_text(order_event_line(1, "e1") + "\n")
    lake = LakeResource(root=str(tmp_path / "lake"))
    Path(lake.root_path).mkdir(parents=True)
    Path(lake.landing_folder(ORDERS_RAW)).parent.symlink_to(delivered, target_is_directory=True)
    query = start_bronze_stream(spark, lake, ORDERS_RAW)
    query.awaitTermination()
    assert query.exception() is None

    _age(delivered / "orders" / "batch-1.json", 10_000)
    health = stream_health(lake, ORDERS_RAW, StreamHealthPolicy(stall_after_seconds=60, max_backlog_age_seconds=120))
    assert health.backlog_files == 0 and health.passed, health.problems
    (delivered / "orders" / "batch-2.json").write_text(order_event_line(2, "e2") + "\n")
    _age(delivered / "orders" / "batch-2.json", 10_000)
    late = stream_health(lake, ORDERS_RAW, StreamHealthPolicy(stall_after_seconds=60, max_backlog_age_seconds=120))
    assert late.backlog_files == 1 and not late.passed
