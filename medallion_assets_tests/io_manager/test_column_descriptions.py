"""Column descriptions: declared with ``delta_table(column_descriptions=...)``, shown in ``dagster/column_schema``."""

from __future__ import annotations

import inspect

import pytest
from dagster import AssetKey, Output, asset, build_asset_context, materialize
from pyspark.sql.pandas.types import from_arrow_schema

from medallion_assets.io_manager import (
    COLUMN_DESCRIPTIONS,
    DeltaIOManager,
    TableRead,
    WriteSpec,
    delta_table,
    table_metadata,
)
from medallion_assets.resources import LakeResource, SparkResource
from medallion_assets.storage.client import DeltaTableClient


def _resources(tmp_path):
    lake = LakeResource(root=str(tmp_path / "lake"))
    spark = SparkResource(master="local[2]")
    return {"spark": spark, "lake": lake, "io_manager": DeltaIOManager(spark=spark, lake=lake)}


def _columns(metadata):
    schema = metadata["dagster/column_schema"]
    return getattr(schema, "value", schema).columns  # a materialization's metadata wraps it


def _descriptions(metadata) -> dict[str, str | None]:
    return {column.name: column.description for column in _columns(metadata)}


def _failure_message(result) -> str:
    [failure] = [event for event in result.all_events if event.is_step_failure]
    error = failure.step_failure_data.error
    return "\n".join(e.message for e in (error, error.cause) if e is not None)


def test_declared_descriptions_reach_the_column_schema_of_each_write(spark, tmp_path):
    @asset(
        key=["silver", "described"],
        metadata=delta_table(column_descriptions={"id": "Key of the thing.", "name": "What it is called."}),
    )
    def described():
        return spark.createDataFrame([(1, "a", 0.5)], "id long, name string, score double")

    resources = _resources(tmp_path)
    result = materialize([described], resources=resources)
    assert result.success
    metadata = result.asset_materializations_for_node("silver__described")[0].metadata
    # Undeclared columns keep no description.
    assert _descriptions(metadata) == {"id": "Key of the thing.", "name": "What it is called.", "score": None}
    assert [column.type for column in _columns(metadata)] == ["bigint", "string", "double"]

    # A rerun the IO manager skips (inputs unchanged) still describes the columns.
    skipped = materialize([described], resources=resources)
    assert _descriptions(skipped.asset_materializations_for_node("silver__described")[0].metadata)["id"] == (
        "Key of the thing."
    )


def test_a_description_of_a_column_the_table_lacks_fails_before_writing(spark, tmp_path):
    @asset(
        key=["silver", "misdescribed"],
        metadata=delta_table(column_descriptions={"id": "Key.", "nmae": "A typo of name.", "gone": "Dropped."}),
    )
    def misdescribed():
        return spark.createDataFrame([(1, "a")], "id long, name string")

    resources = _resources(tmp_path)
    result = materialize([misdescribed], resources=resources, raise_on_error=False)
    assert not result.success
    message = _failure_message(result)
    assert "silver/misdescribed" in message and "['gone', 'nmae']" in message
    assert "column_descriptions" in message and "id, name" in message
    assert not DeltaTableClient(spark).exists(resources["lake"].table_path(["silver", "misdescribed"]))


def test_table_metadata_takes_descriptions_and_refuses_unknown_columns(spark, tmp_path):
    """The route of the streaming bronze assets: ``MaterializeResult(metadata=table_metadata(...))``."""
    client = DeltaTableClient(spark)
    path = str(tmp_path / "bronze" / "lines")
    client.write(spark.createDataFrame([("x", 1)], "value string, n long"), path, WriteSpec())

    metadata = table_metadata(client, path, column_descriptions={"value": "The line as delivered."})
    assert _descriptions(metadata) == {"value": "The line as delivered.", "n": None}
    assert _descriptions(table_metadata(client, path)) == {"value": None, "n": None}
    with pytest.raises(ValueError, match=r"bronze/lines.*\['valeu'\].*its columns: value, n"):
        table_metadata(client, path, column_descriptions={"valeu": "A typo."})


def test_delta_table_stores_descriptions_and_refuses_empty_ones():
    metadata = delta_table(column_descriptions={"id": "Key."})
    assert metadata[COLUMN_DESCRIPTIONS] == {"id": "Key."}
    assert COLUMN_DESCRIPTIONS not in delta_table()
    with pytest.raises(ValueError, match=r"\['name'\]"):
        delta_table(column_descriptions={"id": "Key.", "name": "  "})


def _silver_frame(spark, key: AssetKey):
    from medallion_assets.pipelines.tpch.contract import TPCH_SCHEMAS

    table = {"customers": "customer"}.get(key.path[-1], key.path[-1])
    return spark.createDataFrame([], from_arrow_schema(TPCH_SCHEMAS[table], prefer_timestamp_ntz=False))


def _as_table_read(frame) -> TableRead:
    return TableRead(path="", version=None, rows=None, max_arrow_rows=0, _spark_frame=lambda: frame)


def test_every_column_of_every_gold_table_is_described(spark):
    """Each gold asset's declared descriptions name exactly the columns its output has.

    The assets are invoked on empty silver frames of the contract's schemas and
    stop at their first output: Spark only analyses the plans, nothing runs. An
    input annotated ``TableRead`` gets one that offers the frame alone, as for a
    table delta-rs cannot read.
    """
    from medallion_assets.pipelines.tpch.gold import gold_assets

    assert gold_assets
    for gold in gold_assets:
        parameters = inspect.signature(gold.op.compute_fn.decorated_fn).parameters
        inputs = {name: _silver_frame(spark, key) for name, key in gold.keys_by_input_name.items()}
        inputs = {
            name: _as_table_read(frame) if parameters[name].annotation in (TableRead, "TableRead") else frame
            for name, frame in inputs.items()
        }
        if "context" in parameters:
            partition = gold.partitions_def.get_first_partition_key() if gold.partitions_def else None
            produced = gold(build_asset_context(partition_key=partition), **inputs)
        else:
            produced = gold(**inputs)
        output = produced if isinstance(produced, Output) else next(iter(produced))
        declared = dict(gold.metadata_by_key[gold.key].get(COLUMN_DESCRIPTIONS) or {})
        name = gold.key.to_user_string()
        assert sorted(declared) == sorted(output.value.columns), name
        assert all(text.strip() for text in declared.values()), name
