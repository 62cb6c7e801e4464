"""The ``delta`` stream sink and source with a real Spark session.

Results are read back with delta-rs and DuckDB, never with our own reader.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import deltalake
import pytest

from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb, rows

SCHEMA = "id long, name string"


def land(folder: Path, name: str, ids: range) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.write_text("".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in ids))
    tmp.rename(folder / name)  # a landed file is complete when visible


def ids_of(table: Path) -> list[int]:
    return sorted(r["id"] for r in read_with_deltalake(table).to_pylist())


def write_available_now(frame, table: Path, checkpoint: Path):
    """Run ``frame`` into the Delta table ``table`` with ``availableNow`` and wait for it."""
    query = (
        frame.writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(table))
    )
    query.awaitTermination()
    return query


def run_available_now(spark, source: Path, table: Path, checkpoint: Path, **options):
    return write_available_now(spark.readStream.schema(SCHEMA).options(**options).json(str(source)), table, checkpoint)


def txn_of(table: Path, version: int) -> dict | None:
    log = table / "_delta_log" / f"{version:020d}.json"
    for line in log.read_text().splitlines():
        action = json.loads(line)
        if "txn" in action:
            return action["txn"]
    return None


# ---------------------------------------------------------------- sink


def test_available_now_sink_commits_one_version_per_batch(spark, tmp_path):
    source, table, ckpt = tmp_path / "in", tmp_path / "t", tmp_path / "ck"
    for n in range(3):
        land(source, f"f{n}.json", range(n * 10, n * 10 + 10))
    run_available_now(spark, source, table, ckpt, maxFilesPerTrigger="1")

    assert ids_of(table) == list(range(30))
    assert sorted(r["id"] for r in rows(read_with_duckdb(table))) == list(range(30))
    assert deltalake.DeltaTable(str(table)).version() == 2
    query_id = json.loads((ckpt / "metadata").read_text())["id"]
    assert [txn_of(table, v) for v in range(3)] == [{"appId": query_id, "version": b} for b in range(3)] or all(
        txn_of(table, v)["appId"] == query_id and txn_of(table, v)["version"] == v for v in range(3)
    )
    assert deltalake.DeltaTable(str(table)).transaction_version(query_id) == 2


def test_restart_takes_only_new_files(spark, tmp_path):
    source, table, ckpt = tmp_path / "in", tmp_path / "t", tmp_path / "ck"
    land(source, "a.json", range(5))
    run_available_now(spark, source, table, ckpt)
    land(source, "b.json", range(5, 8))
    run_available_now(spark, source, table, ckpt)
    run_available_now(spark, source, table, ckpt)  # nothing new: no new rows
    assert ids_of(table) == list(range(8))


def test_replayed_batch_is_skipped(spark, tmp_path):
    """Batch committed to Delta but not to the checkpoint: the rerun commits nothing twice."""
    source, table, ckpt = tmp_path / "in", tmp_path / "t", tmp_path / "ck"
    land(source, "a.json", range(5))
    land(source, "b.json", range(5, 9))
    run_available_now(spark, source, table, ckpt, maxFilesPerTrigger="1")
    version = deltalake.DeltaTable(str(table)).version()
    # Forget that batch 1 finished, as if the driver died right after the Delta commit.
    for name in ("1", ".1.crc"):
        (ckpt / "commits" / name).unlink(missing_ok=True)
    data_files = {p.name for p in table.rglob("*.parquet")}
    run_available_now(spark, source, table, ckpt, maxFilesPerTrigger="1")
    assert ids_of(table) == list(range(9))
    assert deltalake.DeltaTable(str(table)).version() == version
    assert {p.name for p in table.rglob("*.parquet")} == data_files  # the replay's files were removed
    assert (ckpt / "commits" / "1").exists()


def test_processing_time_trigger_picks_up_files_while_running(spark, tmp_path):
    source, table, ckpt = tmp_path / "in", tmp_path / "t", tmp_path / "ck"
    land(source, "a.json", range(3))
    query = (
        spark.readStream.schema(SCHEMA)
        .json(str(source))
        .writeStream.format("delta")
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="1 second")
        .start(str(table))
    )
    try:
        deadline = time.time() + 90
        landed_second = False
        while time.time() < deadline:
            if (table / "_delta_log").exists() and ids_of(table) == list(range(3)) and not landed_second:
                land(source, "b.json", range(3, 7))
                landed_second = True
            if landed_second and ids_of(table) == list(range(7)):
                break
            time.sleep(0.5)
    finally:
        query.stop()
    assert ids_of(table) == list(range(7))
    assert query.exception() is None


def test_complete_mode_overwrites_each_batch(spark, tmp_path):
    source, table, ckpt = tmp_path / "in", tmp_path / "t", tmp_path / "ck"
    land(source, "a.json", range(4))
    land(source, "b.json", range(2, 6))

    def run():
        counts = (
            spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", "1").json(str(source)).groupBy("name").count()
        )
        q = (
            counts.writeStream.format("delta")
            .outputMode("complete")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start(str(table))
        )
        q.awaitTermination()

    run()
    got = {r["name"]: r["count"] for r in read_with_deltalake(table).to_pylist()}
    assert got == {"n0": 1, "n1": 1, "n2": 2, "n3": 2, "n4": 1, "n5": 1}
    assert {r["name"]: r["count"] for r in rows(read_with_duckdb(table))} == got


def test_abort_after_successful_delta_commit_keeps_files(spark, tmp_path):
    """Spark aborts also when commit() raised after the Delta commit: the files must stay."""
    import pyarrow as pa
    from pyspark.sql import types as T

    from medallion_assets.delta._commit import DeltaCommitMessage
    from medallion_assets.delta._streaming import DeltaStreamWriter

    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("name", T.StringType())])
    table = tmp_path / "t"
    writer = DeltaStreamWriter.create({"path": str(table), "queryId": "q-1"}, schema, False)
    data = pa.record_batch({"id": pa.array([1, 2], pa.int64()), "name": pa.array(["a", "b"])})
    message = DeltaCommitMessage(writer.plan.file_writer(0).write_batches([data]))
    writer.commit([message], 0)
    writer.abort([message], 0)
    assert ids_of(table) == [1, 2]
    # An abort of a batch that never committed deletes its files.
    orphan = DeltaCommitMessage(writer.plan.file_writer(1).write_batches([data]))
    writer.abort([orphan], 1)
    assert not any((table / f.path).exists() for f in orphan.files)
    # A replay of batch 0 commits nothing and deletes its own files.
    again = DeltaCommitMessage(writer.plan.file_writer(2).write_batches([data]))
    writer.commit([again], 0)
    assert ids_of(table) == [1, 2]
    assert not any((table / f.path).exists() for f in again.files)


def test_sink_without_checkpoint_or_query_id_is_refused(tmp_path):
    from pyspark.sql import types as T

    from medallion_assets.delta import DeltaOptionError
    from medallion_assets.delta._streaming import DeltaStreamWriter

    schema = T.StructType([T.StructField("id", T.LongType())])
    with pytest.raises(DeltaOptionError, match="checkpointLocation"):
        DeltaStreamWriter.create({"path": str(tmp_path / "t")}, schema, False)


def _run_job(source, table, ckpt, env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "medallion_assets_tests.support.stream_job", str(source), str(table), str(ckpt)],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after_commit", "during_write"])
def test_kill_between_delta_commit_and_checkpoint_commit(tmp_path, point):
    """SIGKILL the streaming process around batch 1's commit, seen from outside; rerun: no duplicate, no loss.

    ``after_commit``: batch 1 is in the Delta log and not in the checkpoint.
    ``during_write``: batch 1's task wrote a file that no commit adds.
    """
    from medallion_assets_tests.support.kill_points import StreamWatch, kill_when, undo_checkpoint_commit

    source, table, ckpt = tmp_path / "in", tmp_path / "t", tmp_path / "ck"
    # Batch 1 is big enough that its task is seen writing; f2 lands after the kill, so
    # nothing after batch 1 can be planned before it.
    sizes = {"after_commit": 100, "during_write": 400_000}
    land(source, "f0.json", range(0, 100))
    land(source, "f1.json", range(100, 100 + sizes[point]))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    watch = StreamWatch(str(ckpt), str(table))
    if point == "after_commit":
        kill_when(
            _run_job(source, table, ckpt, env),
            watch,
            lambda s: s.txn is not None and s.txn >= 1,
            what="batch 1's Delta commit",
        )
        # A kill that came after Spark's commits/1 is turned into the crash this test is about.
        undo_checkpoint_commit(str(ckpt), 1)
        assert deltalake.DeltaTable(str(table)).version() == 1
        assert (ckpt / "offsets" / "1").exists() and not (ckpt / "commits" / "1").exists()
        assert ids_of(table) == list(range(200))
    else:
        seen = kill_when(
            _run_job(source, table, ckpt, env),
            watch,
            lambda s: 1 in s.offsets and s.txn == 0 and bool(s.uncommitted),
            what="batch 1's task writing",
        )
        assert seen.uncommitted
        assert deltalake.DeltaTable(str(table)).version() == 0 and not (ckpt / "commits" / "1").exists()
        assert ids_of(table) == list(range(100))
    top = 100 + sizes[point]
    land(source, "f2.json", range(top, top + 100))
    rerun = _run_job(source, table, ckpt, env)
    assert rerun.wait(timeout=300) == 0, rerun.stderr.read().decode()[-3000:]
    expected = list(range(top + 100))
    assert ids_of(table) == expected
    assert sorted(r["id"] for r in rows(read_with_duckdb(table))) == expected
    assert deltalake.DeltaTable(str(table)).version() == 2


# ---------------------------------------------------------------- source


def _stream_copy(spark, src: Path, dst: Path, ckpt: Path, **options):
    return write_available_now(spark.readStream.format("delta").options(**options).load(str(src)), dst, ckpt)


def _append(spark, table: Path, ids: range) -> None:
    """Append one file with rows ``ids`` to ``table``, written by delta-rs."""
    import pyarrow as pa

    data = pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids], pa.string())})
    deltalake.write_deltalake(str(table), data, mode="append")


def test_source_reads_snapshot_then_new_commits(spark, tmp_path):
    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    _append(spark, src, range(0, 5))
    _append(spark, src, range(5, 10))
    _stream_copy(spark, src, dst, ckpt)
    assert ids_of(dst) == list(range(10))
    _append(spark, src, range(10, 13))
    _stream_copy(spark, src, dst, ckpt)
    _stream_copy(spark, src, dst, ckpt)
    assert ids_of(dst) == list(range(13))
    assert sorted(r["id"] for r in rows(read_with_duckdb(dst))) == list(range(13))


def test_source_starting_version(spark, tmp_path):
    src = tmp_path / "src"
    _append(spark, src, range(0, 5))  # v0
    _append(spark, src, range(5, 8))  # v1
    _append(spark, src, range(8, 10))  # v2
    _stream_copy(spark, src, tmp_path / "d1", tmp_path / "c1", startingVersion="1")
    assert ids_of(tmp_path / "d1") == list(range(5, 10))
    _stream_copy(spark, src, tmp_path / "d2", tmp_path / "c2", startingVersion="latest")
    assert not (tmp_path / "d2" / "_delta_log").exists() or ids_of(tmp_path / "d2") == []
    _append(spark, src, range(10, 12))  # v3
    _stream_copy(spark, src, tmp_path / "d2", tmp_path / "c2", startingVersion="latest")
    assert ids_of(tmp_path / "d2") == [10, 11]


def test_source_max_files_per_trigger(spark, tmp_path):
    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    spark.createDataFrame([(i, f"n{i}") for i in range(40)], SCHEMA).repartition(4).write.format("delta").mode(
        "append"
    ).save(str(src))
    assert len(deltalake.DeltaTable(str(src)).file_uris()) == 4
    _append(spark, src, range(40, 42))
    query = _stream_copy(spark, src, dst, ckpt, maxFilesPerTrigger="3")
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert ids_of(dst) == list(range(42))
    files_in = deltalake.DeltaTable(str(src)).file_uris()
    assert len(batches) == -(-len(files_in) // 3)


def test_source_max_bytes_per_trigger(spark, tmp_path):
    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    for n in range(4):
        _append(spark, src, range(n * 10, n * 10 + 10))
    query = _stream_copy(spark, src, dst, ckpt, maxBytesPerTrigger="1b")  # one file per batch
    assert ids_of(dst) == list(range(40))
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == len(
        deltalake.DeltaTable(str(src)).file_uris()
    )


def test_source_does_not_replay_optimize(spark, tmp_path):
    from medallion_assets.delta import DeltaTable

    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    for n in range(3):
        _append(spark, src, range(n * 10, n * 10 + 10))
    _stream_copy(spark, src, dst, ckpt)
    DeltaTable.forPath(spark, str(src)).optimize().executeCompaction()
    assert len(deltalake.DeltaTable(str(src)).file_uris()) == 1
    _append(spark, src, range(30, 32))
    _stream_copy(spark, src, dst, ckpt)
    assert ids_of(dst) == list(range(32))


def test_source_fails_on_delete_unless_ignore_changes(spark, tmp_path):
    from medallion_assets.delta import DeltaTable

    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    _append(spark, src, range(10))
    _stream_copy(spark, src, dst, ckpt)
    DeltaTable.forPath(spark, str(src)).delete("id < 3")
    _append(spark, src, range(10, 12))
    with pytest.raises(Exception, match="removed data from the source table"):
        _stream_copy(spark, src, dst, ckpt)
    assert ids_of(dst) == list(range(10))
    # skipChangeCommits: the delete commit is skipped whole, later appends flow.
    _stream_copy(spark, src, dst, ckpt, skipChangeCommits="true")
    assert ids_of(dst) == list(range(12))


def test_source_ignore_deletes_skips_commits_that_only_remove_files(spark, tmp_path):
    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    _append(spark, src, range(0, 5))
    _append(spark, src, range(5, 10))
    _stream_copy(spark, src, dst, ckpt)
    assert deltalake.DeltaTable(str(src)).delete("id >= 5")["num_added_files"] == 0  # removes the second file whole
    _append(spark, src, range(10, 12))
    with pytest.raises(Exception, match="DELETE.*set ignoreDeletes, ignoreChanges or skipChangeCommits"):
        _stream_copy(spark, src, dst, ckpt)
    _stream_copy(spark, src, dst, ckpt, ignoreDeletes="true")
    assert ids_of(dst) == list(range(12))
    # ignoreDeletes does not cover a delete that rewrites a file.
    deltalake.DeltaTable(str(src)).delete("id = 0")
    with pytest.raises(Exception, match="set ignoreChanges or skipChangeCommits"):
        _stream_copy(spark, src, dst, ckpt, ignoreDeletes="true")
    assert ids_of(dst) == list(range(12))


def test_source_fails_clearly_when_a_commit_it_needs_is_gone(spark, tmp_path):
    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    for n in range(3):
        _append(spark, src, range(n * 10, n * 10 + 10))
    deltalake.DeltaTable(str(src)).create_checkpoint()  # at version 2
    for version in (0, 1):  # what a log cleanup leaves
        (src / "_delta_log" / f"{version:020d}.json").unlink()
    with pytest.raises(Exception, match="version 1 cannot be read: .* version 0 can no longer be loaded"):
        _stream_copy(spark, src, dst, ckpt, startingVersion="1")


def test_source_ignore_changes_rereads_rewritten_files(spark, tmp_path):
    from medallion_assets.delta import DeltaTable

    src, dst, ckpt = tmp_path / "src", tmp_path / "dst", tmp_path / "ck"
    spark.createDataFrame([(i, f"n{i}") for i in range(5)], SCHEMA).coalesce(1).write.format("delta").mode(
        "append"
    ).save(str(src))
    _stream_copy(spark, src, dst, ckpt)
    DeltaTable.forPath(spark, str(src)).delete("id = 0")
    _stream_copy(spark, src, dst, ckpt, ignoreChanges="true")
    # delta-spark's ignoreChanges: the rewritten file's surviving rows come again.
    assert ids_of(dst) == [0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_source_reads_each_row_group_of_a_split_file_once(spark, tmp_path):
    """A file split by row groups across input partitions is read slice by slice, not whole per slice."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.testing import assertDataFrameEqual

    src, out, ckpt = tmp_path / "src", tmp_path / "out", tmp_path / "ck"
    n = 300_000
    data = pa.table({"id": pa.array(range(n), pa.int64()), "name": [f"name-{i:09d}" for i in range(n)]})
    deltalake.write_deltalake(str(src), data, writer_properties=deltalake.WriterProperties(max_row_group_size=20_000))
    files = deltalake.DeltaTable(str(src)).file_uris()
    assert len(files) == 1
    meta = pq.ParquetFile(files[0]).metadata
    assert meta.num_row_groups == 15
    assert os.path.getsize(files[0]) > 1024 * 1024, "the file must be larger than maxPartitionBytes"

    query = (
        spark.readStream.format("delta")
        .option("maxPartitionBytes", "1m")
        .load(str(src))
        .writeStream.format("parquet")
        .option("checkpointLocation", str(ckpt))
        .trigger(availableNow=True)
        .start(str(out))
    )
    query.awaitTermination()

    # Every row of the input exactly once (before the fix: each row once per row-group slice).
    got, expected = spark.read.parquet(str(out)), spark.createDataFrame(data)
    assert got.count() == n
    assertDataFrameEqual(got.exceptAll(expected), expected.limit(0))
    assertDataFrameEqual(expected.exceptAll(got), expected.limit(0))
