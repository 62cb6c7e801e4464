"""The output preview's order: by the table's key, with no scan of a large table."""

from __future__ import annotations

from medallion_assets.io_manager import WriteSpec, delta_table, markdown_preview, write_spec_from_metadata
from medallion_assets.io_manager.metadata import SORTED_PREVIEW_MAX_ROWS


def _shown(preview: str) -> list[list[str]]:
    """The cells of the preview's rows."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in preview.splitlines()[2:]
        if line.startswith("| ")
    ]


def test_the_declared_key_is_what_previews_are_sorted_by():
    assert write_spec_from_metadata(
        delta_table(write_mode="merge", merge_keys=["o_orderkey"], partition_columns=["day"])
    ).key_columns == ("o_orderkey",)
    assert write_spec_from_metadata(delta_table(partition_columns=["day"], partition_expr="day")).key_columns == (
        "day",
    )
    assert write_spec_from_metadata(delta_table(partition_expr="order_month")).key_columns == ("order_month",)
    assert write_spec_from_metadata(delta_table()).key_columns == ()


def test_a_small_table_shows_its_first_rows_by_key_and_a_large_one_the_rows_read_first_in_key_order(spark):
    # One partition, in this order: the rows a limit reads first are the first three.
    rows = [(5, "e", 2), (3, "c", 1), (None, "n", 1), (1, "a", 1), (4, "d", 2), (2, "b", 9)]
    frame = spark.createDataFrame(rows, "k long, name string, tie long").coalesce(1)

    small = markdown_preview(frame, 3, key_columns=["k"], total_rows=len(rows))
    assert _shown(small) == [["None", "n", "1"], ["1", "a", "1"], ["2", "b", "9"]]  # nulls first, as Spark sorts
    assert small.endswith("The first 3 of 6 rows by `k`.")

    large = markdown_preview(frame, 3, key_columns=["k"], total_rows=SORTED_PREVIEW_MAX_ROWS + 1)
    assert _shown(large) == [["None", "n", "1"], ["3", "c", "1"], ["5", "e", "2"]]
    assert "the first read" in large and "`k`" in large

    # No key declared: the first column, its ties broken by the others.
    by_first = markdown_preview(frame.select("tie", "name"), 4, total_rows=len(rows))
    assert _shown(by_first) == [["1", "a"], ["1", "c"], ["1", "n"], ["2", "d"]]
    assert by_first.endswith("The first 4 of 6 rows by `tie`.")


def test_a_written_table_is_previewed_from_its_files_as_spark_shows_it_without_a_spark_job(spark, tmp_path):
    # Spark's first read of a new version costs delta-spark a snapshot; delta-rs reads one file instead.
    from medallion_assets.io_manager.metadata import description_metadata
    from medallion_assets.storage.client import DeltaTableClient

    client = DeltaTableClient(spark)
    path = str(tmp_path / "previewed")
    rows = [(5, "e", 2), (3, "c", 1), (None, "n", 1), (1, "a", 1), (4, "d", 2), (2, "b", 9)]
    client.write(
        spark.createDataFrame(rows, "k long, name string, tie long").repartition(2), path, WriteSpec(mode="overwrite")
    )
    description = client.describe(path)

    context = spark.sparkContext
    context.setJobGroup("output-preview", "the output metadata of one write")
    try:
        preview = description_metadata(description, preview_rows=3, key_columns=["k"])["preview"].value
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert list(context.statusTracker().getJobIdsForGroup("output-preview")) == []

    assert _shown(preview) == [["None", "n", "1"], ["1", "a", "1"], ["2", "b", "9"]]
    assert preview == markdown_preview(description.frame, 3, key_columns=["k"], total_rows=len(rows))


def test_a_large_table_previews_the_first_rows_of_one_file_with_its_partition_values(spark, tmp_path):
    # The preview reads one batch of one file, not the file's row group; it must still show
    # whole rows of the table: partition values (which live in the log, not the file) included.
    import deltalake
    from pyspark.sql import functions as F
    from pyspark.testing import assertDataFrameEqual

    from medallion_assets.io_manager.metadata import first_rows
    from medallion_assets.storage.client import DeltaTableClient

    path = str(tmp_path / "partitioned")
    written = spark.range(SORTED_PREVIEW_MAX_ROWS + 5, numPartitions=3).select(
        F.col("id").alias("k"),
        F.expr("date_add(DATE'2024-01-01', CAST(id % 3 AS INT))").alias("day"),
        F.expr("timestamp_seconds(id)").alias("at"),
        F.expr("repeat('x', CAST(id % 50 AS INT))").alias("text"),
    )
    DeltaTableClient(spark).write(written, path, WriteSpec(mode="overwrite", partition_columns=("day",)))

    dataset = deltalake.DeltaTable(path).to_pyarrow_dataset()
    head = first_rows(dataset, 4)
    assert head.schema == dataset.schema and head.num_rows == 4
    shown = spark.createDataFrame(head.to_pandas()).select("k", "day", "at", "text")
    assertDataFrameEqual(shown, written.join(shown.select("k"), on="k", how="inner").select("k", "day", "at", "text"))
    assert head.column("day").null_count == 0


def test_a_table_only_appended_to_previews_its_newest_rows_on_both_routes(spark, tmp_path):
    # A quarantine: the first rows by any column are old batches; what the last run added is what one looks for.
    import time

    import deltalake
    import pyarrow as pa

    from medallion_assets.io_manager.metadata import arrow_table_metadata, description_metadata
    from medallion_assets.storage.arrow_client import ArrowDeltaClient
    from medallion_assets.storage.client import DeltaTableClient

    assert write_spec_from_metadata(delta_table(write_mode="append")).newest_first
    assert not write_spec_from_metadata(delta_table(write_mode="merge", merge_keys=["k"])).newest_first
    path = str(tmp_path / "appended")
    for batch in (1, 2, 3):  # written by deltalake, not by the code under test
        deltalake.write_deltalake(
            path, pa.table({"reason": [f"a{batch}", f"b{batch}", f"c{batch}"], "batch": [batch] * 3}), mode="append"
        )
        time.sleep(0.01)  # a file's modification time is in milliseconds

    spark_route = description_metadata(DeltaTableClient(spark).describe(path), preview_rows=2, newest_first=True)[
        "preview"
    ].value
    arrow_route = arrow_table_metadata(ArrowDeltaClient(), path, newest_first=True)["preview"].value
    for preview in (spark_route, arrow_route):
        shown = _shown(preview)
        assert shown and {batch for _, batch in shown} == {"3"}, preview
        assert "the newest" in preview and "of 9 rows" in preview
    # Without it, the same table previews its first rows by the first column, old batches first.
    by_reason = description_metadata(DeltaTableClient(spark).describe(path), preview_rows=2)["preview"].value
    assert _shown(by_reason) == [["a1", "1"], ["a2", "2"]]
