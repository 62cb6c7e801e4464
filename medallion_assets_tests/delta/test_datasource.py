"""The ``delta`` format: batch reads and writes, checked with independent readers."""

from __future__ import annotations

import datetime as dt
import os
import threading
from decimal import Decimal

import deltalake
import pyarrow as pa
import pytest
from pyspark.errors import AnalysisException, PythonException
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual

from medallion_assets.delta import (
    ConcurrentWriteError,
    DeltaTable,
    NotADeltaTableError,
    UnsupportedFeatureError,
    read_delta,
)
from medallion_assets.delta._commit import commit_write, plan_write
from medallion_assets.delta._files import TableFileWriter
from medallion_assets.delta._options import ReadOptions
from medallion_assets.delta._read import plan_input_partitions, split_budget
from medallion_assets.delta._snapshot import DataFile, resolve_snapshot
from medallion_assets.delta.datasource import DeltaBatchReader
from medallion_assets_tests.support.readers import SAMPLE_SCHEMA as SCHEMA
from medallion_assets_tests.support.readers import read_with_deltalake, read_with_duckdb, rows


def sample_rows(start: int, count: int) -> list[tuple]:
    regions = ["EU", "US", "ASIA", None]
    out = []
    for i in range(start, start + count):
        out.append(
            (
                i,
                regions[i % 4],
                Decimal(i * 101) / Decimal(100),
                dt.date(2024, 1, 1) + dt.timedelta(days=i % 40),
                dt.datetime(2024, 1, 1, 12, 0, 0, 123456, tzinfo=dt.UTC) + dt.timedelta(hours=i),
                None if i % 5 == 0 else f"row {i}",
            )
        )
    return out


def frame(spark, start: int = 0, count: int = 20):
    return spark.createDataFrame(sample_rows(start, count), SCHEMA)


def expected_dicts(data: list[tuple]) -> list[dict]:
    return [dict(zip(SCHEMA.fieldNames(), r, strict=False)) for r in data]


def assert_independent_readers_see(path, data: list[tuple]) -> None:
    """delta-rs and DuckDB both read exactly ``data`` from the table."""
    want = rows(pa.Table.from_pylist(expected_dicts(data)), sort_by="id")
    for reader in (read_with_deltalake, read_with_duckdb):
        got = rows(reader(path).select(SCHEMA.fieldNames()), sort_by="id")
        assert got == want, f"{reader.__name__} disagrees"


def test_roundtrip_types_nulls_and_both_read_routes(spark, tmp_path):
    path = str(tmp_path / "t")
    df = frame(spark)
    df.write.format("delta").mode("overwrite").save(path)

    assert_independent_readers_see(path, sample_rows(0, 20))
    assertDataFrameEqual(spark.read.format("delta").load(path), df)
    assertDataFrameEqual(read_delta(spark, path), df)
    assertDataFrameEqual(DeltaTable.forPath(spark, path).toDF(), df)
    assert spark.read.format("delta").load(path).schema == SCHEMA


def test_append_and_time_travel(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 10).write.format("delta").mode("append").save(path)
    frame(spark, 10, 5).write.format("delta").mode("append").option("userMetadata", "second").save(path)

    assert_independent_readers_see(path, sample_rows(0, 15))
    v0 = spark.read.format("delta").option("versionAsOf", 0).load(path)
    assertDataFrameEqual(v0, frame(spark, 0, 10))
    assertDataFrameEqual(read_delta(spark, path, version=0), frame(spark, 0, 10))
    history = deltalake.DeltaTable(path).history()
    assert history[0]["userMetadata"] == "second"
    ts0 = dt.datetime.fromtimestamp(history[-1]["timestamp"] / 1000, tz=dt.UTC)
    by_time = spark.read.format("delta").option("timestampAsOf", ts0.isoformat()).load(path)
    assert by_time.count() == 10


def test_empty_dataframe_creates_table_with_schema(spark, tmp_path):
    path = str(tmp_path / "empty")
    spark.createDataFrame([], SCHEMA).write.format("delta").mode("overwrite").save(path)
    assert deltalake.DeltaTable(path).version() == 0
    assert read_with_deltalake(path).num_rows == 0
    assert read_with_duckdb(path).num_rows == 0
    assert read_delta(spark, path).schema == SCHEMA
    assert spark.read.format("delta").load(path).count() == 0


def test_partitioned_table_via_builder_then_append_and_overwrite(spark, tmp_path):
    path = str(tmp_path / "parts")
    DeltaTable.create(spark).location(path).addColumns(SCHEMA).partitionedBy("region").execute()
    frame(spark, 0, 20).write.format("delta").mode("append").save(path)

    table = deltalake.DeltaTable(path)
    assert table.metadata().partition_columns == ["region"]
    folders = {os.path.basename(os.path.dirname(f)) for f in table.file_uris()}
    assert folders == {"region=EU", "region=US", "region=ASIA", "region=__HIVE_DEFAULT_PARTITION__"}
    assert_independent_readers_see(path, sample_rows(0, 20))
    assertDataFrameEqual(read_delta(spark, path), frame(spark, 0, 20))
    assertDataFrameEqual(spark.read.format("delta").load(path), frame(spark, 0, 20))

    # replaceWhere on the partition column replaces exactly that partition.
    replacement = [r for r in sample_rows(100, 8) if r[1] == "EU"]
    spark.createDataFrame(replacement, SCHEMA).write.format("delta").mode("overwrite").option(
        "replaceWhere", "region = 'EU'"
    ).save(path)
    expected = [r for r in sample_rows(0, 20) if r[1] != "EU"] + replacement
    assert_independent_readers_see(path, expected)


def test_partition_values_with_special_characters_read_back(spark, tmp_path):
    path = str(tmp_path / "odd")
    schema = T.StructType([T.StructField("k", T.StringType()), T.StructField("v", T.IntegerType())])
    DeltaTable.create(spark).location(path).addColumns(schema).partitionedBy("k").execute()
    data = [("a:b", 1), ("c d", 2), ("x/y=z", 3), ("100%", 4), (None, 5)]
    spark.createDataFrame(data, schema).write.format("delta").mode("append").save(path)
    assertDataFrameEqual(read_delta(spark, path), spark.createDataFrame(data, schema))
    assert rows(read_with_deltalake(path), sort_by="v") == [{"k": k, "v": v} for k, v in data]
    assert rows(read_with_duckdb(path), sort_by="v") == [{"k": k, "v": v} for k, v in data]


def test_replace_where_on_a_data_column_rewrites_partly_matching_files(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 30).coalesce(1).write.format("delta").mode("overwrite").save(path)
    new = [r for r in sample_rows(500, 40) if dt.date(2024, 1, 5) <= r[3] < dt.date(2024, 1, 10)]
    spark.createDataFrame(new, SCHEMA).write.format("delta").mode("overwrite").option(
        "replaceWhere", "day >= DATE '2024-01-05' AND day < '2024-01-10'"
    ).save(path)
    kept = [r for r in sample_rows(0, 30) if not (dt.date(2024, 1, 5) <= r[3] < dt.date(2024, 1, 10))]
    assert_independent_readers_see(path, kept + new)


def test_replace_where_refuses_rows_outside_the_predicate_and_commits_nothing(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 10).write.format("delta").mode("overwrite").save(path)
    files_before = set(_all_parquet(path))
    with pytest.raises(Exception, match="replaceWhere") as err:
        frame(spark, 100, 10).write.format("delta").mode("overwrite").option("replaceWhere", "id < 105").save(path)
    assert "violate" in str(err.value)
    assert deltalake.DeltaTable(path).version() == 0
    assert set(_all_parquet(path)) == files_before, "a failed write must leave no files behind"


def _all_parquet(path) -> list[str]:
    out = []
    for root, _, names in os.walk(path):
        out += [os.path.join(root, n) for n in names if n.endswith(".parquet")]
    return out


def test_schema_enforcement_names_columns_and_changes_nothing(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 5).write.format("delta").mode("overwrite").save(path)
    wrong = frame(spark, 5, 5).withColumn("amount", F.col("amount").cast("string")).withColumn("extra", F.lit(1))
    with pytest.raises(AnalysisException) as err:
        wrong.write.format("delta").mode("append").save(path)
    message = str(err.value)
    assert "'amount' is string in the data but decimal(15,2) in the table" in message
    assert "'extra' (int) is not in the table" in message
    assert path in message
    assert deltalake.DeltaTable(path).version() == 0
    assert_independent_readers_see(path, sample_rows(0, 5))


def test_merge_schema_adds_columns_and_overwrite_schema_replaces(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 5).write.format("delta").mode("overwrite").save(path)
    frame(spark, 5, 5).withColumn("extra", F.col("id") * 2).write.format("delta").mode("append").option(
        "mergeSchema", "true"
    ).save(path)
    back = read_with_duckdb(path)
    assert "extra" in back.column_names
    extras = {r["id"]: r["extra"] for r in back.select(["id", "extra"]).to_pylist()}
    assert extras == {i: (i * 2 if i >= 5 else None) for i in range(10)}
    assertDataFrameEqual(
        read_delta(spark, path).select("id", "extra"),
        spark.createDataFrame([(i, i * 2 if i >= 5 else None) for i in range(10)], "id long, extra long"),
    )

    spark.range(3).withColumnRenamed("id", "only").write.format("delta").mode("overwrite").option(
        "overwriteSchema", "true"
    ).save(path)
    assert read_with_deltalake(path).column_names == ["only"]
    assert sorted(read_with_duckdb(path).column("only").to_pylist()) == [0, 1, 2]


def test_idempotent_writes_with_app_transactions(spark, tmp_path):
    path = str(tmp_path / "t")
    for _ in range(2):  # the replay of version 1 is skipped
        frame(spark, 0, 5).write.format("delta").mode("append").option("txnAppId", "loader").option(
            "txnVersion", "1"
        ).save(path)
    frame(spark, 5, 5).write.format("delta").mode("append").option("txnAppId", "loader").option("txnVersion", "2").save(
        path
    )
    assert_independent_readers_see(path, sample_rows(0, 10))
    assert deltalake.DeltaTable(path).transaction_version("loader") == 2
    assert len(_all_parquet(path)) == len(deltalake.DeltaTable(path).file_uris()), "skipped write left files"


def test_table_properties_on_create_and_commit_info(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 3).write.format("delta").mode("overwrite").option("delta.appendOnly", "true").option(
        "delta.enableChangeDataFeed", "true"
    ).option("commitInfo.dagster_run_id", "run-123").save(path)
    table = deltalake.DeltaTable(path)
    assert table.metadata().configuration["delta.appendOnly"] == "true"
    assert table.metadata().configuration["delta.enableChangeDataFeed"] == "true"
    assert table.history(1)[0]["dagster_run_id"] == "run-123"
    with pytest.raises(AnalysisException, match="append-only"):
        frame(spark, 0, 3).write.format("delta").mode("overwrite").save(path)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"replaceWher": "id = 1"}, "unknown write option 'replacewher'"),
        ({"mergeSchema": "maybe"}, "must be true or false"),
        ({"txnAppId": "x"}, "txnAppId and txnVersion go together"),
    ],
)
def test_bad_options_are_refused(spark, tmp_path, options, needle):
    path = str(tmp_path / "t")
    frame(spark, 0, 3).write.format("delta").mode("overwrite").save(path)
    writer = frame(spark, 0, 3).write.format("delta").mode("overwrite")
    for k, v in options.items():
        writer = writer.option(k, v)
    with pytest.raises(AnalysisException) as err:
        writer.save(path)
    assert needle in str(err.value).lower() or needle in str(err.value)
    assert deltalake.DeltaTable(path).version() == 0


def test_unstorable_type_and_unsupported_save_modes(spark, tmp_path):
    path = str(tmp_path / "t")
    with pytest.raises(AnalysisException, match="interval"):
        spark.sql("select 1 as id, interval 3 days as gap").write.format("delta").mode("overwrite").save(path)
    assert not os.path.exists(os.path.join(path, "_delta_log"))
    frame(spark, 0, 3).write.format("delta").mode("overwrite").save(path)
    for mode in ("errorifexists", "ignore"):
        with pytest.raises(AnalysisException, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
            frame(spark, 3, 3).write.format("delta").mode(mode).save(path)
    assert deltalake.DeltaTable(path).version() == 0
    assert_independent_readers_see(path, sample_rows(0, 3))


def test_not_a_delta_table(spark, tmp_path):
    missing = str(tmp_path / "nothing")
    with pytest.raises(AnalysisException, match="is not a Delta table"):
        spark.read.format("delta").load(missing).count()
    with pytest.raises(NotADeltaTableError, match="is not a Delta table"):
        read_delta(spark, missing)
    with pytest.raises(NotADeltaTableError):
        DeltaTable.forPath(spark, missing)


def test_tables_with_deletion_vectors_are_refused_by_both_routes(spark, tmp_path):
    path = str(tmp_path / "dv")
    deltalake.write_deltalake(path, pa.table({"id": [1, 2]}), configuration={"delta.enableDeletionVectors": "true"})
    if "deletionVectors" not in (deltalake.DeltaTable(path).protocol().reader_features or []):
        pytest.skip("this delta-rs did not enable the deletionVectors feature")
    with pytest.raises(UnsupportedFeatureError, match="deletionVectors"):
        read_delta(spark, path)
    with pytest.raises(AnalysisException, match="deletionVectors"):
        spark.read.format("delta").load(path).count()


def test_pushed_filters_skip_files_by_partition_and_statistics(spark, tmp_path):
    path = str(tmp_path / "t")
    DeltaTable.create(spark).location(path).addColumns(SCHEMA).partitionedBy("region").execute()
    for start in (0, 100, 200):  # three appends: ids in disjoint ranges per file
        frame(spark, start, 8).coalesce(1).write.format("delta").mode("append").save(path)
    snapshot = resolve_snapshot(path)
    from pyspark.sql.datasource import EqualTo, GreaterThan

    reader = DeltaBatchReader(snapshot, ReadOptions())
    list(reader.pushFilters([GreaterThan(("id",), 150)]))
    by_stats = reader.live_files()
    assert {f.min_values["id"] >= 100 for f in by_stats} == {True}
    assert len(by_stats) < len(snapshot.files)

    reader = DeltaBatchReader(snapshot, ReadOptions())
    list(reader.pushFilters([EqualTo(("region",), "EU")]))
    assert {f.partition_values["region"] for f in reader.live_files()} == {"EU"}

    filtered = spark.read.format("delta").load(path).filter("id > 150 and region = 'EU'")
    assertDataFrameEqual(filtered, frame(spark, 200, 8).filter("region = 'EU'"))


def test_input_partitions_are_sized_by_bytes(spark, tmp_path):
    path = str(tmp_path / "t")
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("s", T.StringType())])
    plan = plan_write(path, schema, mode="overwrite", options={})
    data = pa.table({"id": pa.array(range(200_000), pa.int64()), "s": [f"value-{i:08d}" for i in range(200_000)]})
    writer = TableFileWriter(path, plan.arrow_schema, [], row_group_rows=20_000)
    commit_write(plan, writer.write_batches(data.to_batches(max_chunksize=10_000)))
    snapshot = resolve_snapshot(path)
    assert len(snapshot.files) == 1
    budget = snapshot.files[0].size // 4
    parts = plan_input_partitions(snapshot.files, budget)
    assert len(parts) >= 4, "a file larger than the budget is split by row groups"
    groups = sorted(g for p in parts for s in p.slices for g in s.row_groups)
    assert groups == list(range(10)), "every row group is read exactly once"
    assert len(plan_input_partitions(snapshot.files, snapshot.files[0].size * 2)) == 1
    back = spark.read.format("delta").option("maxPartitionBytes", str(budget)).load(path)
    assert back.rdd.getNumPartitions() == len(parts)
    assert back.agg(F.count("*"), F.sum("id")).first() == (200_000, sum(range(200_000)))


def test_split_budget_spreads_a_table_over_the_cores():
    mb = 1024 * 1024
    two_files = [DataFile(f"f{i}", 32 * mb, {}) for i in range(2)]
    # Two 32 MB files on two cores: one file each, not both in one 128 MB partition.
    assert split_budget(two_files, 128 * mb, parallelism=2) == 32 * mb + 1
    assert len(plan_input_partitions(two_files, split_budget(two_files, 128 * mb, parallelism=2))) == 2
    # Never above maxPartitionBytes, never below Spark's 4 MB open cost.
    assert split_budget([DataFile("big", 10_000 * mb, {})], 128 * mb, parallelism=2) == 128 * mb
    assert split_budget(two_files, 128 * mb, parallelism=1000) == 4 * mb


def test_concurrent_appends_both_land(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 1).write.format("delta").mode("overwrite").save(path)
    errors = []

    def append(start):
        try:
            frame(spark, start, 10).write.format("delta").mode("append").save(path)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(s,)) for s in (100, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert_independent_readers_see(path, sample_rows(0, 1) + sample_rows(100, 10) + sample_rows(200, 10))


def test_conflicting_overwrite_fails_cleanly(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 5).write.format("delta").mode("overwrite").save(path)
    # An overwrite planned against version 0 ...
    plan = plan_write(path, SCHEMA, mode="overwrite", options={})
    data = pa.Table.from_pylist(expected_dicts(sample_rows(50, 5)), schema=plan.arrow_schema)
    files = plan.file_writer(0).write_batches(data.to_batches())
    # ... loses to an append that commits first.
    frame(spark, 5, 5).write.format("delta").mode("append").save(path)
    with pytest.raises(ConcurrentWriteError, match="concurrent"):
        commit_write(plan, files)
    assert deltalake.DeltaTable(path).version() == 1
    assert_independent_readers_see(path, sample_rows(0, 10))
    for f in files:
        assert not os.path.exists(os.path.join(path, f.path)), "the losing write's files are removed"


def test_overwrite_loses_to_an_append_that_commits_between_its_check_and_its_commit(spark, tmp_path, monkeypatch):
    from medallion_assets.delta import _commit
    from medallion_assets.delta._schema import spark_to_arrow_schema

    path = str(tmp_path / "t")
    arrow_schema = spark_to_arrow_schema(SCHEMA, table=path)
    deltalake.write_deltalake(path, pa.Table.from_pylist(expected_dicts(sample_rows(0, 5)), schema=arrow_schema))
    plan = plan_write(path, SCHEMA, mode="overwrite", options={})
    data = pa.Table.from_pylist(expected_dicts(sample_rows(50, 5)), schema=plan.arrow_schema)
    files = plan.file_writer(0).write_batches(data.to_batches())
    # The overwrite's conflict check sees version 0, as planned ...
    checked = deltalake.DeltaTable(path)
    monkeypatch.setattr(_commit, "open_existing", lambda *_a, **_k: checked)
    # ... and another writer appends before the overwrite commits.
    deltalake.write_deltalake(
        path, pa.Table.from_pylist(expected_dicts(sample_rows(5, 5)), schema=arrow_schema), mode="append"
    )
    with pytest.raises(ConcurrentWriteError, match="concurrent"):
        commit_write(plan, files)
    monkeypatch.undo()
    assert deltalake.DeltaTable(path).version() == 1
    assert_independent_readers_see(path, sample_rows(0, 10))
    for f in files:
        assert not os.path.exists(os.path.join(path, f.path)), "the losing write's files are removed"


def test_check_constraints_and_not_null_are_enforced_on_write(spark, tmp_path):
    path = str(tmp_path / "t")
    strict = T.StructType([T.StructField("id", T.LongType(), nullable=False), *SCHEMA.fields[1:]])
    DeltaTable.create(spark).location(path).addColumns(strict).execute()
    frame(spark, 1, 5).write.format("delta").mode("append").save(path)
    DeltaTable.forPath(spark, path).addConstraint("positive_amount", "amount > 0")

    with pytest.raises(PythonException, match="positive_amount") as err:
        frame(spark, 0, 3).write.format("delta").mode("append").save(path)  # id 0 has amount 0.00
    assert "'id': 0" in str(err.value), "the message shows a violating row"
    with_null_id = spark.createDataFrame([(None, "EU", Decimal("1.00"), None, None, None)], SCHEMA)
    with pytest.raises(PythonException, match="'id' is NOT NULL"):
        with_null_id.write.format("delta").mode("append").save(path)

    frame(spark, 10, 3).write.format("delta").mode("append").save(path)
    assert_independent_readers_see(path, sample_rows(1, 5) + sample_rows(10, 3))


def test_failed_job_commits_nothing_and_vacuum_removes_leftovers(spark, tmp_path):
    path = str(tmp_path / "t")
    frame(spark, 0, 5).write.format("delta").mode("overwrite").save(path)
    # A task that fails halfway through: the first partition's files are written, then an error.
    exploding = (
        frame(spark, 5, 20)
        .repartition(2)
        .withColumn("note", F.when(F.col("id") == 24, F.raise_error(F.lit("boom"))).otherwise(F.col("note")))
    )
    with pytest.raises(Exception, match="boom"):
        exploding.write.format("delta").mode("append").save(path)
    assert deltalake.DeltaTable(path).version() == 0
    assert_independent_readers_see(path, sample_rows(0, 5))
    # Whatever a killed task could leave behind is unreferenced; vacuum removes it.
    orphan = os.path.join(path, "part-00000-orphan-c000.snappy.parquet")
    with open(orphan, "wb") as fh:
        fh.write(b"not referenced")
    os.utime(orphan, (0, 0))
    live = {os.path.basename(f) for f in deltalake.DeltaTable(path).file_uris()}
    deleted = {
        os.path.basename(r.path)
        for r in DeltaTable.forPath(spark, path).vacuum(0, enforceRetentionDuration=False).collect()
    }
    # A task cancelled when its sibling failed may also have left a partial file.
    assert os.path.basename(orphan) in deleted
    assert not deleted & live
    assert {os.path.basename(f) for f in _all_parquet(path)} == live
    assert not os.path.exists(orphan)
    assert_independent_readers_see(path, sample_rows(0, 5))


def _parquet_files(path) -> set[str]:
    return set(_all_parquet(path))


def test_replace_where_comparing_two_partition_columns_keeps_the_other_partitions(spark, tmp_path):
    path = str(tmp_path / "t")
    schema = pa.schema([("p1", pa.int64()), ("p2", pa.int64()), ("v", pa.string())])
    original = [{"p1": a, "p2": b, "v": f"old {a}{b}"} for a in range(3) for b in range(3)]
    deltalake.write_deltalake(path, pa.Table.from_pylist(original, schema=schema), partition_by=["p1", "p2"])
    new = [{"p1": i, "p2": i, "v": f"new {i}"} for i in range(3)]

    spark.createDataFrame(pa.Table.from_pylist(new, schema=schema).to_pandas()).write.format("delta").mode(
        "overwrite"
    ).option("replaceWhere", "p1 = p2").save(path)

    expected = [r for r in original if r["p1"] != r["p2"]] + new
    key = ["p1", "p2", "v"]
    assert rows(read_with_deltalake(path), sort_by=key) == rows(
        pa.Table.from_pylist(expected, schema=schema), sort_by=key
    )


def test_replace_where_with_sql_functions_rewrites_only_the_matching_rows(spark, tmp_path):
    path = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    original = [{"id": i, "name": f"{'ab'[i % 2]}-{i}"} for i in range(10)]
    deltalake.write_deltalake(path, pa.Table.from_pylist(original, schema=schema))
    predicate = "name LIKE 'a%' AND length(name) = 3"  # 'a-0' ... 'a-8'
    new = [{"id": 100 + i, "name": f"a-{i}"} for i in range(2)]

    spark.createDataFrame(pa.Table.from_pylist(new, schema=schema).to_pandas()).write.format("delta").mode(
        "overwrite"
    ).option("replaceWhere", predicate).save(path)

    replaced = {r["id"] for r in original if r["name"].startswith("a") and len(r["name"]) == 3}
    expected = [r for r in original if r["id"] not in replaced] + new
    assert rows(read_with_deltalake(path), sort_by="id") == rows(
        pa.Table.from_pylist(expected, schema=schema), sort_by="id"
    )


CONSTRAINED = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("kind", pa.string())])
CONSTRAINTS = {
    "amount_positive": "amount * 2 > 0",
    # delta-rs 1.6's add_constraint cannot store length()/char_length() ("Unable to convert expression
    # to string") and rejects valid rows for a searched CASE with boolean branches; these forms it keeps.
    "short_name": "character_length(name) < 10",
    "name_prefix": "name LIKE 'n%'",
    "small_refund": "CASE kind WHEN 'refund' THEN amount < 100 ELSE TRUE END",
}


@pytest.mark.parametrize(
    ("broken", "row"),
    [
        ("amount_positive", {"id": 10, "name": "n10", "amount": -1.0, "kind": "sale"}),
        ("short_name", {"id": 10, "name": "n-much-too-long", "amount": 1.0, "kind": "sale"}),
        ("name_prefix", {"id": 10, "name": "x10", "amount": 1.0, "kind": "sale"}),
        ("small_refund", {"id": 10, "name": "n10", "amount": 500.0, "kind": "refund"}),
    ],
)
def test_check_constraints_with_arithmetic_functions_like_and_case_are_enforced(spark, tmp_path, broken, row):
    path = str(tmp_path / "t")
    first = [
        {"id": 1, "name": "n1", "amount": 5.0, "kind": "sale"},
        {"id": 2, "name": "n2", "amount": 50.0, "kind": "refund"},
    ]
    deltalake.write_deltalake(path, pa.Table.from_pylist(first, schema=CONSTRAINED))
    table = DeltaTable.forPath(spark, path)
    for name, expr in CONSTRAINTS.items():
        table.addConstraint(name, expr)

    # A write that satisfies every constraint lands.
    good = [
        {"id": 3, "name": "n3", "amount": 700.0, "kind": "sale"},
        {"id": 4, "name": "nnnnnnnnn", "amount": 99.5, "kind": "refund"},
    ]
    spark.createDataFrame(pa.Table.from_pylist(good, schema=CONSTRAINED).to_pandas()).write.format("delta").mode(
        "append"
    ).save(path)
    assert rows(read_with_deltalake(path), sort_by="id") == rows(
        pa.Table.from_pylist(first + good, schema=CONSTRAINED), sort_by="id"
    )

    # A write with one row that breaks one constraint fails, naming it and the table, and commits nothing.
    version, files = deltalake.DeltaTable(path).version(), _parquet_files(path)
    # One task, so that its own clean-up is what leaves no file behind (a sibling task cut short by
    # the failure could leave an unreferenced file for vacuum, as in the failed-job test above).
    bad = spark.createDataFrame(
        pa.Table.from_pylist([good[0] | {"id": 9}, row], schema=CONSTRAINED).to_pandas()
    ).coalesce(1)
    with pytest.raises(Exception, match=broken) as err:
        bad.write.format("delta").mode("append").save(path)
    message = str(err.value)
    assert "violate" in message and path in message
    assert [name for name in CONSTRAINTS if f"constraint {name} " in message] == [broken]
    assert deltalake.DeltaTable(path).version() == version
    assert _parquet_files(path) == files, "a refused write leaves no files behind"
    assert rows(read_with_deltalake(path), sort_by="id") == rows(
        pa.Table.from_pylist(first + good, schema=CONSTRAINED), sort_by="id"
    )
