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
from medallion_assets.io_manager.manager import CHECKED_VERSIONS, REUSED_FROM_RUN
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


def test_a_check_whose_tables_did_not_change_is_not_evaluated_again(spark, tmp_path):
    """Decision 0008: a run that reads the versions a check's latest evaluation read repeats that result.

    The repeated result names the run that computed it, through any number of repeats; a table that
    gained a version is checked again, and the check of the tables that did not change is still repeated.
    """
    _write_tables(tmp_path)
    lake = LakeResource(root=str(tmp_path))
    resource = SparkResource(master="local[1]")
    checks = [unique_key_check("keyed", ["k"]), reference_check("children", ["fk"], "parents", ["pk"])]
    instance = DagsterInstance.ephemeral()

    def evaluate() -> tuple[str, dict]:
        result = materialize(
            [*(AssetSpec(["silver", table]) for table in ("keyed", "parents", "children")), *checks],
            selection=AssetSelection.all_asset_checks(),
            resources={"spark": resource, "lake": lake, "io_manager": DeltaIOManager(spark=resource, lake=lake)},
            instance=instance,
            raise_on_error=False,  # the key check is blocking, and fails
        )
        return result.run_id, {e.check_name: e for e in result.get_asset_check_evaluations()}

    first_run, first = evaluate()
    assert all(REUSED_FROM_RUN not in e.metadata for e in first.values())
    for _ in range(2):
        _, again = evaluate()
        for name, evaluation in again.items():
            assert evaluation.metadata[REUSED_FROM_RUN].value == first_run, name
            assert evaluation.passed == first[name].passed
            assert evaluation.metadata["failing_rows"] == first[name].metadata["failing_rows"]

    # The duplicate removed by a new version of the keyed table: its check runs again and now passes.
    write_deltalake(
        str(tmp_path / "silver" / "keyed"),
        pa.table({"k": pa.array([1, 2, 3], pa.int64()), "name": ["a", "b", "c"]}),
        mode="overwrite",
    )
    _, changed = evaluate()
    unique, references = changed["keyed_key_unique"], changed["children_references_parents"]
    assert REUSED_FROM_RUN not in unique.metadata and unique.passed
    assert unique.metadata[CHECKED_VERSIONS].value == {"silver/keyed": {"version": 1}}
    assert references.metadata[REUSED_FROM_RUN].value == first_run and not references.passed
