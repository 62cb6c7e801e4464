"""pandas, polars and Arrow through the Delta IO manager: delta-rs only, no SparkSession.

Inputs are Delta tables written by ``write_deltalake`` (not by the IO manager);
outputs the IO manager writes are read back with DuckDB's delta extension.
The SparkResource is configured as in the other tests: it is lazy, and a
subprocess proves that loading and storing these types starts no SparkContext.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from decimal import Decimal

import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from dagster import AssetIn, AssetKey, AssetSpec, MonthlyPartitionsDefinition, asset, materialize
from deltalake import write_deltalake

from medallion_assets.io_manager import DeltaIOManager, delta_table
from medallion_assets.io_manager.metadata import ENGINE_NAME
from medallion_assets.pipelines.tpch.reports import pricing_summary_report
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets_tests.support.readers import read_with_duckdb, rows

SOURCE = AssetKey(["silver", "numbers"])


def _resources(root: str) -> dict:
    lake = LakeResource(root=root)
    spark = SparkResource(master="local[1]")
    return {"spark": spark, "lake": lake, "io_manager": DeltaIOManager(spark=spark, lake=lake)}


def _write_source(root: str) -> None:
    """Version 0: ids 1..3; version 1: id 4 appended (written by delta-rs directly)."""
    path = f"{root}/silver/numbers"
    write_deltalake(path, pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"], "amount": [1.5, 2.5, 3.5]}))
    write_deltalake(path, pa.table({"id": [4], "name": ["d"], "amount": [4.5]}), mode="append")


def load_every_type(root: str) -> dict:
    """Materialize one asset per input type over the source table; what each saw, and whether Spark started.

    Run in a subprocess by the test (a fresh interpreter, so no earlier test's SparkContext counts).
    """
    from pyspark import SparkContext

    pinned = {"delta/version": 0, "delta/columns": ["id", "name"]}
    seen: dict[str, dict] = {}

    def remember(name: str, table: pa.Table, kind: type) -> None:
        seen[name] = {"type": kind.__name__, "rows": sorted(table.to_pylist(), key=lambda r: r["id"])}

    @asset(key=["gold", "as_pandas"], ins={"numbers": AssetIn(key=SOURCE, metadata=pinned)})
    def as_pandas(numbers: pd.DataFrame) -> pd.DataFrame:
        remember("pandas", pa.Table.from_pandas(numbers, preserve_index=False), type(numbers))
        return numbers.assign(doubled=numbers["id"] * 2)

    @asset(ins={"numbers": AssetIn(key=SOURCE, metadata=pinned)})
    def as_polars(numbers: pl.DataFrame) -> None:
        remember("polars", numbers.to_arrow(), type(numbers))

    @asset(ins={"numbers": AssetIn(key=SOURCE, metadata={"delta/columns": ["id", "amount"]})})
    def as_lazy(numbers: pl.LazyFrame) -> None:
        remember("lazy", numbers.filter(pl.col("id") > 1).collect().to_arrow(), type(numbers))

    @asset(ins={"numbers": AssetIn(key=SOURCE)})
    def as_table(numbers: pa.Table) -> None:
        remember("table", numbers.select(["id"]), type(numbers))

    @asset(ins={"numbers": AssetIn(key=SOURCE, metadata=pinned)})
    def as_dataset(numbers: ds.Dataset) -> None:
        remember("dataset", numbers.to_table(), type(numbers))

    result = materialize(
        [AssetSpec(SOURCE), as_pandas, as_polars, as_lazy, as_table, as_dataset],
        resources=_resources(root),
        selection=[
            AssetKey(["gold", "as_pandas"]),
            *(AssetKey(n) for n in ("as_polars", "as_lazy", "as_table", "as_dataset")),
        ],
    )
    [stored] = result.asset_materializations_for_node("gold__as_pandas")
    return {
        "seen": seen,
        "stored_engine": stored.metadata["delta/engine"].value,
        "stored_rows": stored.metadata["dagster/row_count"].value,
        "spark_started": SparkContext._active_spark_context is not None,
    }


def test_inputs_load_as_each_type_with_version_and_columns_without_starting_spark(tmp_path):
    root = str(tmp_path / "lake")
    _write_source(root)
    code = (
        "import json, sys; from medallion_assets_tests.io_manager.test_io_manager_arrow import load_every_type; "
        "print('RESULT ' + json.dumps(load_every_type(sys.argv[1])))"
    )
    done = subprocess.run([sys.executable, "-c", code, root], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    report = json.loads(line.removeprefix("RESULT "))
    assert report["spark_started"] is False
    seen = report["seen"]
    version_0 = [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}]
    assert seen["pandas"] == {"type": "DataFrame", "rows": version_0}
    assert seen["polars"] == {"type": "DataFrame", "rows": version_0}
    assert seen["dataset"]["rows"] == version_0 and seen["dataset"]["type"] == "FileSystemDataset"
    # Latest version, two columns, the asset's own filter on the lazy scan.
    assert seen["lazy"] == {"type": "LazyFrame", "rows": [{"id": i, "amount": i + 0.5} for i in (2, 3, 4)]}
    assert seen["table"] == {"type": "Table", "rows": [{"id": i} for i in (1, 2, 3, 4)]}
    # The pandas output was stored by delta-rs too, and an independent reader sees it.
    assert (report["stored_engine"], report["stored_rows"]) == (ENGINE_NAME, 3)
    assert rows(read_with_duckdb(f"{root}/gold/as_pandas"), sort_by="id") == [
        {"id": i, "name": n, "doubled": 2 * i} for i, n in ((1, "a"), (2, "b"), (3, "c"))
    ]


def _frames(kind: str, ids: list[int]):
    data = {"id": ids, "label": [f"n{i}" for i in ids]}
    return {
        "pandas": lambda: pd.DataFrame(data),
        "polars": lambda: pl.DataFrame(data),
        "lazy": lambda: pl.LazyFrame(data),
        "arrow": lambda: pa.table(data),
    }[kind]()


@pytest.mark.parametrize("kind", ["pandas", "polars", "lazy", "arrow"])
def test_outputs_append_then_overwrite_read_back_by_duckdb(tmp_path, kind):
    root = str(tmp_path / "lake")
    batches = iter([[1, 2], [3], [7]])

    def run(mode: str):
        @asset(key=["silver", "labels"], metadata=delta_table(write_mode=mode))
        def labels():
            return _frames(kind, next(batches))

        result = materialize([labels], resources=_resources(root))
        [materialization] = result.asset_materializations_for_node("silver__labels")
        return materialization.metadata

    run("append")
    appended = run("append")
    path = f"{root}/silver/labels"
    assert [r["id"] for r in rows(read_with_duckdb(path), sort_by="id")] == [1, 2, 3]
    assert (int(appended["delta/version"].value), appended["dagster/row_count"].value) == (1, 3)
    assert appended["delta/engine"].value == ENGINE_NAME
    assert [c.name for c in appended["dagster/column_schema"].schema.columns] == ["id", "label"]
    overwritten = run("overwrite")
    assert rows(read_with_duckdb(path)) == [{"id": 7, "label": "n7"}]
    assert (int(overwritten["delta/version"].value), overwritten["dagster/row_count"].value) == (2, 1)
    assert overwritten["delta/operation"].value == "WRITE"


def test_merge_on_keys_keeps_the_newer_sequence(tmp_path):
    root = str(tmp_path / "lake")
    batches = iter(
        [
            {"id": [1, 2], "seq": [5, 5], "v": ["old1", "old2"]},
            {"id": [1, 2, 3], "seq": [6, 4, 1], "v": ["new1", "stale2", "new3"]},
        ]
    )

    @asset(key=["silver", "states"], metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq"))
    def states() -> pa.Table:
        return pa.table(next(batches))

    for _ in range(2):
        materialize([states], resources=_resources(root))
    assert rows(read_with_duckdb(f"{root}/silver/states"), sort_by="id") == [
        {"id": 1, "seq": 6, "v": "new1"},
        {"id": 2, "seq": 5, "v": "old2"},
        {"id": 3, "seq": 1, "v": "new3"},
    ]
    # The stale change (id 2) is kept as it was by a last matched clause, which delta-rs counts as an update.
    from deltalake import DeltaTable

    metrics = DeltaTable(f"{root}/silver/states").history(1)[0]["operationMetrics"]
    assert (metrics["num_target_rows_updated"], metrics["num_target_rows_inserted"]) == (2, 1)


def test_merge_adding_a_column_first_keeps_stale_changes_and_evolves_the_schema(tmp_path):
    root = str(tmp_path / "lake")
    # The second batch adds a column, a field of the struct and one of the list's structs; id 2's change is stale.
    batches = iter(
        [
            {
                "id": [1, 2],
                "seq": [5, 5],
                "v": ["old1", "old2"],
                "info": [{"a": 1}, {"a": 2}],
                "parts": [[{"n": 1}], [{"n": 2}]],
            },
            {
                "note": ["n1", "n2"],
                "id": [1, 2],
                "seq": [6, 4],
                "v": ["new1", "stale2"],
                "info": [{"a": 10, "b": "x"}, {"a": 20, "b": "y"}],
                "parts": [[{"n": 10, "w": 1.5}], [{"n": 20, "w": 2.5}]],
            },
        ]
    )

    @asset(
        key=["silver", "notes"],
        metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq", schema_mode="merge"),
    )
    def notes() -> pa.Table:
        return pa.table(next(batches))

    for _ in range(2):
        assert materialize([notes], resources=_resources(root)).success
    assert rows(read_with_duckdb(f"{root}/silver/notes"), sort_by="id") == [
        {"id": 1, "seq": 6, "v": "new1", "info": {"a": 10, "b": "x"}, "parts": [{"n": 10, "w": 1.5}], "note": "n1"},
        {"id": 2, "seq": 5, "v": "old2", "info": {"a": 2, "b": None}, "parts": [{"n": 2, "w": None}], "note": None},
    ]


def test_merge_growing_the_structs_of_a_map_is_refused_and_commits_nothing(tmp_path):
    from deltalake import DeltaTable

    root = str(tmp_path / "lake")
    by_name = pa.map_(pa.string(), pa.struct([("n", pa.int64())]))
    grown = pa.map_(pa.string(), pa.struct([("n", pa.int64()), ("w", pa.float64())]))
    batches = iter(
        [
            pa.table({"id": [1], "seq": [1], "tags": pa.array([[("k", {"n": 1})]], by_name)}),
            pa.table({"id": [1], "seq": [2], "tags": pa.array([[("k", {"n": 2, "w": 0.5})]], grown)}),
        ]
    )

    @asset(
        key=["silver", "tagged"],
        metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq", schema_mode="merge"),
    )
    def tagged() -> pa.Table:
        return next(batches)

    assert materialize([tagged], resources=_resources(root)).success
    with pytest.raises(Exception, match=r"'tags' gains struct fields inside the values of map 'tags'.*silver/tagged"):
        materialize([tagged], resources=_resources(root))
    assert DeltaTable(f"{root}/silver/tagged").version() == 0
    assert rows(read_with_duckdb(f"{root}/silver/tagged")) == [{"id": 1, "seq": 1, "tags": [("k", {"n": 1})]}]


def test_merge_into_a_map_whose_structs_another_writer_grew_fails_saying_why_and_commits_nothing(tmp_path):
    from deltalake import DeltaTable

    root = str(tmp_path / "lake")
    path = f"{root}/silver/tagged"
    by_name = pa.map_(pa.string(), pa.struct([("n", pa.int64())]))
    grown = pa.map_(pa.string(), pa.struct([("n", pa.int64()), ("w", pa.float64())]))
    write_deltalake(path, pa.table({"id": [1], "seq": [1], "tags": pa.array([[("k", {"n": 1})]], by_name)}))
    # Another writer grows the map's structs; the file written before keeps the old ones.
    write_deltalake(
        path,
        pa.schema([("id", pa.int64()), ("seq", pa.int64()), ("tags", grown)]).empty_table(),
        mode="append",
        schema_mode="merge",
    )

    @asset(key=["silver", "tagged"], metadata=delta_table(write_mode="merge", merge_keys=["id"], sequence_column="seq"))
    def tagged() -> pa.Table:
        return pa.table({"id": [1], "seq": [2], "tags": pa.array([[("k", {"n": 2, "w": 0.5})]], grown)})

    with pytest.raises(Exception, match=r"map column's struct values gained fields.*delta-spark.*silver/tagged"):
        materialize([tagged], resources=_resources(root))
    assert DeltaTable(path).version() == 1
    assert rows(read_with_duckdb(path)) == [{"id": 1, "seq": 1, "tags": [("k", {"n": 1, "w": None})]}]


def test_merge_with_deletes_is_refused_naming_the_asset_mode_and_fix(tmp_path):
    @asset(key=["silver", "gone"], metadata=delta_table(write_mode="merge", merge_keys=["id"], delete_column="deleted"))
    def gone() -> pd.DataFrame:
        return pd.DataFrame({"id": [1], "deleted": [True]})

    with pytest.raises(Exception, match=r"silver/gone.*'merge' with delete_column.*return a Spark DataFrame"):
        materialize([gone], resources=_resources(str(tmp_path / "lake")))


def test_replace_keys_is_refused_for_pandas_naming_the_asset_mode_and_fix(tmp_path):
    @asset(key=["silver", "versions"], metadata=delta_table(write_mode="replace_keys", merge_keys=["id"]))
    def versions() -> pd.DataFrame:
        return pd.DataFrame({"id": [1], "v": ["a"]})

    with pytest.raises(Exception, match=r"silver/versions.*'replace_keys'.*return a Spark DataFrame"):
        materialize([versions], resources=_resources(str(tmp_path / "lake")))
    assert not (tmp_path / "lake" / "silver" / "versions").exists()


def test_deletion_vectors_are_refused_before_delta_rs_creates_a_table_it_could_not_read(tmp_path):
    from medallion_assets.io_manager import DELETION_VECTORS

    root = str(tmp_path / "lake")

    @asset(key=["silver", "marked"], metadata=delta_table(table_properties={DELETION_VECTORS: "true"}))
    def marked() -> pd.DataFrame:
        return pd.DataFrame({"id": [1, 2]})

    with pytest.raises(Exception, match=r"silver/marked.*deletion vectors.*delta-rs cannot read"):
        materialize([marked], resources=_resources(root))
    assert not (tmp_path / "lake" / "silver" / "marked").exists()


def test_pricing_summary_report_shares_of_a_gold_table_written_by_delta_rs(tmp_path):
    root = str(tmp_path / "lake")
    money = pa.decimal128(38, 4)
    write_deltalake(
        f"{root}/gold/pricing_summary",
        pa.table(
            {
                "l_returnflag": ["R", "A", "N"],
                "l_linestatus": ["F", "F", "O"],
                "sum_qty": pa.array([Decimal("10"), Decimal("20"), Decimal("30")], pa.decimal128(25, 2)),
                "sum_disc_price": pa.array([Decimal("250.0000"), Decimal("500.0000"), Decimal("250.0000")], money),
                "count_order": pa.array([2, 3, 5], pa.int64()),
            }
        ),
    )
    report = AssetKey(["gold", "pricing_summary_report"])
    runs = [
        materialize(
            [AssetSpec(["gold", "pricing_summary"]), pricing_summary_report],
            resources=_resources(root),
            selection=[report],
        )
        for _ in range(2)
    ]
    first, second = (run.asset_materializations_for_node("gold__pricing_summary_report")[0].metadata for run in runs)
    assert first["delta/version"].value == second["delta/version"].value == "0"
    # Its input's version did not change: the second run rewrote nothing (as on the Spark path).
    assert "delta/skipped" in second and "delta/skipped" not in first
    assert rows(read_with_duckdb(f"{root}/gold/pricing_summary_report")) == [
        {"l_returnflag": "A", "l_linestatus": "F", "line_items": 3, "revenue": 500.0, "revenue_share": 0.5},
        {"l_returnflag": "N", "l_linestatus": "O", "line_items": 5, "revenue": 250.0, "revenue_share": 0.25},
        {"l_returnflag": "R", "l_linestatus": "F", "line_items": 2, "revenue": 250.0, "revenue_share": 0.25},
    ]


def test_time_window_partition_is_replaced_and_read_alone(tmp_path):
    months = MonthlyPartitionsDefinition(start_date="2024-01-01", end_date="2024-04-01")
    runs = iter([10, 20, 30])
    seen = {}

    @asset(key=["silver", "daily"], partitions_def=months, metadata=delta_table(partition_expr="day"))
    def daily(context) -> pd.DataFrame:
        start, run = context.partition_time_window.start, next(runs)
        return pd.DataFrame({"day": [dt.date(start.year, start.month, d) for d in (1, 2)], "n": [run, run]})

    @asset(partitions_def=months, ins={"daily": AssetIn(key=["silver", "daily"])})
    def monthly(daily: pa.Table) -> None:
        seen["rows"] = daily.to_pylist()

    resources = _resources(str(tmp_path / "lake"))
    for month in ("2024-01-01", "2024-02-01", "2024-01-01"):
        materialize([daily], resources=resources, partition_key=month)
    materialize([daily, monthly], resources=resources, partition_key="2024-02-01", selection=[monthly.key])
    assert sorted(seen["rows"], key=lambda r: r["day"]) == [
        {"day": dt.date(2024, 2, 1), "n": 20},
        {"day": dt.date(2024, 2, 2), "n": 20},
    ]
    # January was replaced by its second run; February kept.
    assert rows(read_with_duckdb(str(tmp_path / "lake" / "silver" / "daily")), sort_by="day") == [
        {"day": dt.date(2024, 1, 1), "n": 30},
        {"day": dt.date(2024, 1, 2), "n": 30},
        {"day": dt.date(2024, 2, 1), "n": 20},
        {"day": dt.date(2024, 2, 2), "n": 20},
    ]


def test_a_changes_input_as_pandas_is_refused_naming_the_input_and_fix(tmp_path):
    root = str(tmp_path / "lake")
    _write_source(root)

    @asset(ins={"numbers": AssetIn(key=SOURCE, metadata={"delta/read": "changes"})})
    def increments(numbers: pd.DataFrame) -> None:
        raise AssertionError("the input must not load")

    with pytest.raises(Exception, match=r"silver/numbers of increments: delta/read 'changes' needs Spark.*annotate"):
        materialize([AssetSpec(SOURCE), increments], resources=_resources(root), selection=[AssetKey("increments")])
