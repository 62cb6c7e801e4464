"""The key and reference checks in a Dagster run: DataFusion over delta-rs' read, Spark past DataFusion's memory bound.

The tables are written by ``write_deltalake`` (not by the IO manager), with
a duplicated key, a null key and two orphans; both ways must find them, say
which way counted, and record the versions they read.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from dagster import AssetSelection, AssetSpec, DagsterInstance, materialize
from deltalake import write_deltalake

from medallion_assets.assets import checks as table_checks
from medallion_assets.assets.checks import COMPUTED_WITH, reference_check, unique_key_check
from medallion_assets.io_manager import DeltaIOManager
from medallion_assets.io_manager.manager import CHECKED_VERSIONS
from medallion_assets.resources import LakeResource, SparkResource


def _write_tables(root) -> None:
    write_deltalake(
        str(root / "silver" / "keyed"),
        pa.table({"k": pa.array([1, 2, 2, 3, None], pa.int64()), "name": ["a", "b", "b again", "c", "?"]}),
    )
    write_deltalake(str(root / "silver" / "parents"), pa.table({"pk": pa.array([1, 2, 3], pa.int64())}))
    write_deltalake(
        str(root / "silver" / "children"),
        pa.table({"fk": pa.array([1, 1, 3, 4, None, 5], pa.int64()), "n": list(range(6))}),
    )


@pytest.mark.parametrize(
    "datafusion_memory_bytes, way", [(table_checks.DATAFUSION_MEMORY_BYTES, "DataFusion"), (1_024, "Spark")]
)
def test_key_and_reference_checks_count_the_same_either_way(spark, tmp_path, monkeypatch, datafusion_memory_bytes, way):
    _write_tables(tmp_path)
    # A kilobyte is too little for either count: both fall back to Spark.
    monkeypatch.setattr(table_checks, "DATAFUSION_MEMORY_BYTES", datafusion_memory_bytes)
    lake = LakeResource(root=str(tmp_path))
    resource = SparkResource(master="local[1]")
    # The key check blocks what reads its table, so it guards a table of its own.
    checks = [unique_key_check("keyed", ["k"]), reference_check("children", ["fk"], "parents", ["pk"])]
    result = materialize(
        [*(AssetSpec(["silver", table]) for table in ("keyed", "parents", "children")), *checks],
        selection=AssetSelection.all_asset_checks(),
        resources={"spark": resource, "lake": lake, "io_manager": DeltaIOManager(spark=resource, lake=lake)},
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,  # the key check is blocking, and fails
    )
    found = {e.check_name: e for e in result.get_asset_check_evaluations()}
    unique, references = found["keyed_key_unique"], found["children_references_parents"]
    # k 2 twice and the null key: 3 failing rows of 5, two bad keys.
    assert not unique.passed
    assert {k: unique.metadata[k].value for k in ("passing_rows", "failing_rows", "duplicated_or_null_keys")} == {
        "passing_rows": 2,
        "failing_rows": 3,
        "duplicated_or_null_keys": 2,
    }
    # fk 4, 5 and the null have no parent.
    assert not references.passed
    assert (references.metadata["passing_rows"].value, references.metadata["failing_rows"].value) == (3, 3)
    assert unique.metadata[COMPUTED_WITH].value == references.metadata[COMPUTED_WITH].value == way
    assert unique.metadata[CHECKED_VERSIONS].value == {"silver/keyed": {"version": 0}}
    assert references.metadata[CHECKED_VERSIONS].value == {
        "silver/children": {"version": 0},
        "silver/parents": {"version": 0},
    }
