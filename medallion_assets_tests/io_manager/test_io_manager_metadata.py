"""The Delta IO manager's output metadata, column-mapped tables and kept statistics, through real Dagster runs."""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import AssetIn, MetadataValue, asset, materialize
from pyspark.sql import functions as F

from medallion_assets.storage.client import DeltaTableClient
from medallion_assets_tests.support.resources import io_manager_resources as _resources

pytestmark = pytest.mark.both_engines


def test_output_metadata_rows_files_and_bytes_are_those_an_independent_reader_sees(spark, tmp_path, delta_engine):
    """Rows, files and bytes come from the Delta log now: they must still be the table's."""
    import deltalake
    import pyarrow as pa

    from medallion_assets.io_manager import WriteSpec, table_metadata
    from medallion_assets.storage.engines import DeltaSparkSqlEngine
    from medallion_assets_tests.support.readers import read_with_duckdb

    client = DeltaTableClient(spark)
    path = str(tmp_path / "silver" / "counted")
    schema = "id long, part string, seq long, _deleted boolean"
    merge = WriteSpec(
        mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted", partition_columns=("part",)
    )

    def write(rows, spec):
        frame = spark.createDataFrame(rows, schema).repartition(3)
        if spec.mode != "merge":
            frame = frame.drop("_deleted")
        return client.write(frame, path, spec)

    def added_by(version):
        """Files, rows and bytes commit ``version`` added, from delta-rs's snapshots at it and before it."""

        def files(at):
            if at < 0:
                return {}
            actions = pa.table(deltalake.DeltaTable(path, version=at).get_add_actions(flatten=True)).to_pylist()
            return {a["path"]: (a["num_records"], a["size_bytes"]) for a in actions}

        before = files(version - 1)
        added = [stats for name, stats in files(version).items() if name not in before]
        return {
            "numFiles": len(added),
            "numOutputRows": sum(r for r, _ in added),
            "numOutputBytes": sum(b for _, b in added),
        }

    def check(result, expected_rows):
        metadata = table_metadata(client, path, commit=result.commit, key_columns=["id"])
        table = deltalake.DeltaTable(path)
        actions = pa.table(table.get_add_actions(flatten=True))
        # Text, not a number Dagster would plot on the asset's Plots tab; it reads back with int().
        assert metadata["delta/version"] == MetadataValue.text(str(table.version()))
        assert int(metadata["delta/version"].value) == result.version == table.version()
        assert metadata["dagster/row_count"] == expected_rows
        assert read_with_duckdb(path).num_rows == expected_rows
        assert table.to_pyarrow_table().num_rows == expected_rows
        assert metadata["delta/num_files"] == actions.num_rows
        assert metadata["delta/size_bytes"] == sum(actions.column("size_bytes").to_pylist())
        assert metadata["delta/partition_columns"].value == ["part"]
        assert [c.name for c in metadata["dagster/column_schema"].columns] == ["id", "part", "seq"]
        preview = metadata["preview"].value
        assert "| id | part | seq |" in preview
        # The first five rows by key, of a table small enough to sort.
        smallest = sorted(table.to_pyarrow_table().column("id").to_pylist())[:5]
        assert [int(line.split("|")[1]) for line in preview.splitlines()[2:7]] == smallest
        assert f"The first 5 of {expected_rows} rows by `id`." in preview
        if result.commit.operation != "MERGE":
            # A write's metrics are its commit's (delta-spark's DeltaTable.history, the delta-rs
            # engine's commitInfo): files, rows and bytes it added, as delta-rs sees that commit.
            metrics = metadata["delta/operation_metrics"].value
            assert {name: metrics[name] for name in ("numFiles", "numOutputRows", "numOutputBytes")} == added_by(
                result.version
            )
        if delta_engine == "delta-spark":
            # The Spark Connect route (DESCRIBE DETAIL and a count) describes the same version alike.
            state = DeltaSparkSqlEngine().table_state(spark, path, result.version)
            assert (state.num_files, state.size_bytes) == (actions.num_rows, metadata["delta/size_bytes"])
            assert state.frame.count() == expected_rows

    first = [(i, f"p{i % 3}", 1, False) for i in range(100)]
    check(write(first, WriteSpec(mode="overwrite", partition_columns=("part",))), 100)
    # Deletes 10 keys, updates 10, inserts 5: files are removed and added.
    changes = (
        [(i, f"p{i % 3}", 2, True) for i in range(10)]
        + [(i, f"p{i % 3}", 2, False) for i in range(10, 20)]
        + [(i, f"p{i % 3}", 2, False) for i in range(100, 105)]
    )
    merged = write(changes, merge)
    assert merged.commit.operation == "MERGE"
    check(merged, 95)
    check(write([(i, "p9", 3, False) for i in range(200, 207)], WriteSpec(mode="append")), 102)
    check(write([(i, f"p{i % 2}", 4, False) for i in range(40)], WriteSpec(mode="overwrite")), 40)
    if delta_engine == "delta-spark":
        # A checksum without the add actions (delta-spark keeps them there for small tables
        # only): the rows then come from one job over the version's add actions.
        spark.conf.set("spark.databricks.delta.allFilesInCrc.enabled", "false")
        try:
            check(write(first, WriteSpec(mode="overwrite")), 100)
        finally:
            spark.conf.unset("spark.databricks.delta.allFilesInCrc.enabled")


def _column_mapped_table(spark, path: str) -> None:
    """Three rows in a column-mapped table, written by delta-spark (reader version 2: no reader feature named)."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (k BIGINT, v STRING) USING delta "
        "TBLPROPERTIES ('delta.columnMapping.mode' = 'name')"
    )
    written = spark.range(3).select(F.col("id").alias("k"), F.concat(F.lit("v"), F.col("id").cast("string")).alias("v"))
    written.write.format("delta").mode("append").save(path)


def test_a_column_mapped_table_is_previewed_by_spark_with_its_values(spark, tmp_path, delta_engine):
    """delta-rs opens a column-mapped table but reads its renamed columns as nulls: Spark previews it."""
    if delta_engine != "delta-spark":
        pytest.skip("only delta-spark writes column-mapped tables; the delta-rs engine refuses them")
    from medallion_assets.io_manager import table_metadata

    path = str(tmp_path / "mapped")
    _column_mapped_table(spark, path)

    preview = table_metadata(DeltaTableClient(spark), path, key_columns=["k"])["preview"].value
    shown = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in preview.splitlines()[2:]
        if line.startswith("| ")
    ]
    assert shown == [["0", "v0"], ["1", "v1"], ["2", "v2"]]


def test_a_column_mapped_table_is_refused_as_an_arrow_input_naming_it(spark, tmp_path, delta_engine):
    """An Arrow input of a column-mapped table fails, naming the input and the fix, instead of reading nulls."""
    if delta_engine != "delta-spark":
        pytest.skip("only delta-spark writes column-mapped tables; the delta-rs engine refuses them")
    from dagster import AssetSpec

    from medallion_assets.delta.errors import UnsupportedFeatureError

    resources = _resources(tmp_path)
    _column_mapped_table(spark, str(tmp_path / "lake" / "silver" / "mapped"))
    read = []

    @asset(key=["gold", "from_mapped"], ins={"mapped": AssetIn(key=["silver", "mapped"])})
    def from_mapped(mapped: pa.Table) -> None:
        read.append(mapped.to_pylist())  # delta-rs alone reads [{'k': None, 'v': None}, ...]

    with pytest.raises(UnsupportedFeatureError) as refused:
        materialize([AssetSpec(["silver", "mapped"]), from_mapped], selection=[from_mapped], resources=resources)
    assert read == []
    message = str(refused.value)
    for part in (
        "input silver/mapped of gold__from_mapped",
        "columnMapping",
        "as Table",
        "annotate the input as a Spark DataFrame",
    ):
        assert part in message

    # The same rows as a Spark input: Spark reads the mapped columns.
    @asset(key=["gold", "counted"], ins={"mapped": AssetIn(key=["silver", "mapped"])})
    def counted(mapped) -> None:
        assert sorted(mapped.collect()) == [(0, "v0"), (1, "v1"), (2, "v2")]

    assert materialize([AssetSpec(["silver", "mapped"]), counted], selection=[counted], resources=resources).success


def test_the_kept_statistics_still_skip_files_for_filters_and_merges_on_delta_spark(spark, tmp_path, delta_engine):
    """Statistics on a merge table's keys and dates only: a filter on a date skips files, a MERGE
    rewrites only the files holding its keys. (The delta-rs engine's pushed filters: ``delta/test_predicate.py``.)"""
    if delta_engine != "delta-spark":
        pytest.skip("data skipping of delta-spark's scan; the delta-rs engine's is tested in delta/test_predicate.py")
    from delta.tables import DeltaTable
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.io_manager import WriteSpec

    client = DeltaTableClient(spark)
    path = str(tmp_path / "silver" / "events")
    spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted")
    # Eight files, each one range of days (and so of ids): what a date filter can skip.
    events = spark.range(4000, numPartitions=1).select(
        "id",
        (F.col("id") % 5).alias("seq"),
        F.expr("date_add(DATE'2024-01-01', CAST(id DIV 100 AS INT))").alias("day"),
        F.lit(False).alias("_deleted"),
        F.concat(F.lit("payload "), F.col("id").cast("string")).alias("payload"),
    )
    client.write(events.repartitionByRange(8, "day"), path, spec)
    table = spark.read.format("delta").load(path)
    assert len(table.inputFiles()) == 8

    first_days = table.where(F.col("day") <= F.lit("2024-01-05").cast("date"))
    assert len(first_days.inputFiles()) == 1  # by the statistics on `day`: the other seven files are skipped
    assertDataFrameEqual(first_days, events.drop("_deleted").where(F.col("id") < 500))
    assert len(table.where(F.col("payload") == "payload 7").inputFiles()) == 8  # no statistics kept on payload

    changes = (
        events.where(F.col("id") < 10).withColumn("seq", F.lit(9).cast("long")).withColumn("payload", F.lit("changed"))
    )
    client.write(changes, path, spec)
    [merge] = DeltaTable.forPath(spark, path).history(1).select("operation", "operationMetrics").collect()
    assert merge.operation == "MERGE"
    assert (merge.operationMetrics["numTargetFilesRemoved"], merge.operationMetrics["numTargetRowsUpdated"]) == (
        "1",
        "10",
    )
    assert spark.read.format("delta").load(path).where(F.col("payload") == "changed").count() == 10


def test_merge_tables_keep_statistics_on_what_readers_filter_and_merge_on(spark, tmp_path, delta_engine):
    """A new merge table keeps per-file min/max on its keys and dates only (not its sequence).

    As delta-rs reads its log.
    """
    import deltalake
    import pyarrow as pa

    from medallion_assets.io_manager import WriteSpec

    client = DeltaTableClient(spark)
    path = str(tmp_path / "silver" / "events")
    spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="_deleted")
    rows = [(i, i % 7, f"payload {i}", f"2024-01-{1 + i % 28:02d}", False) for i in range(200)]
    frame = spark.createDataFrame(rows, "id long, seq long, payload string, day string, _deleted boolean")
    client.write(frame.withColumn("day", F.to_date("day")), path, spec)

    table = deltalake.DeltaTable(path)
    assert table.metadata().configuration["delta.dataSkippingStatsColumns"] == "id,day"
    actions = pa.table(table.get_add_actions(flatten=True))
    kept = {name.split(".", 1)[1] for name in actions.column_names if name.startswith("min.")}
    if delta_engine == "delta-spark":
        assert kept == {"id", "day"}
    else:
        # The delta-rs engine commits Spark's Parquet files with the statistics of their footers.
        assert {"id", "day"} <= kept
    for column in ("id", "day"):
        assert all(value is not None for value in actions.column(f"min.{column}").to_pylist())
    assert pa.table(table.to_pyarrow_table()).num_rows == 200


def test_declared_filters_choose_the_statistics_and_a_replace_group_stands_for_its_keys():
    """``filtered_by`` replaces the every-date default; a group-replaced table keeps its group, not its other keys."""
    from pyspark.sql.types import DateType, LongType, StringType, StructField, StructType

    from medallion_assets.storage.write_spec import WriteSpec, table_properties_for

    schema = StructType(
        [
            StructField(name, kind)
            for name, kind in [
                ("order", LongType()),
                ("line", LongType()),
                ("seq", StringType()),
                ("shipped", DateType()),
                ("received", DateType()),
                ("note", StringType()),
            ]
        ]
    )
    grouped = dict(
        mode="merge",
        merge_keys=("order", "line"),
        sequence_column="seq",
        delete_column="_deleted",
        replace_group="order",
    )
    stats = lambda **spec: table_properties_for(WriteSpec(**spec), schema)["delta.dataSkippingStatsColumns"]  # noqa: E731
    assert stats(**grouped) == "order,shipped,received"
    assert stats(**grouped, filtered_by=("shipped",)) == "order,shipped"
    assert stats(**grouped, filtered_by=()) == "order"
    assert stats(mode="merge", merge_keys=("order", "line"), filtered_by=("note",)) == "order,line,note"
    with pytest.raises(ValueError, match=r"filtered_by names column\(s\) \['shiped'\].*leave filtered_by out"):
        table_properties_for(WriteSpec(**grouped, filtered_by=("shiped",)), schema)


def test_a_misspelt_filter_column_fails_the_write_naming_the_table_and_creates_nothing(spark, tmp_path):
    from medallion_assets.io_manager import delta_table, write_spec_from_metadata

    path = str(tmp_path / "silver" / "events")
    spec = write_spec_from_metadata(delta_table(write_mode="merge", merge_keys=["id"], filtered_by=["dya"]))
    frame = spark.createDataFrame([(1, "2024-01-01")], "id long, day string").withColumn("day", F.to_date("day"))
    with pytest.raises(ValueError, match=r"table .*events: filtered_by names column\(s\) \['dya'\]"):
        DeltaTableClient(spark).write(frame, path, spec)
    assert not (tmp_path / "silver" / "events").exists()
