"""Feed declarations: the machinery names no feed, a bad declaration says what to fix, the demo stays a demo."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from dagster import AssetKey
from pyspark.sql.types import DecimalType, TimestampType

import medallion_assets
from medallion_assets.feeds import (
    ApplyChanges,
    Feed,
    FeedDeclarationError,
    Field,
    LandingFiles,
    LandingSnapshots,
    Replace,
)
from medallion_assets.project import feeds_in, pipeline_hooks

PACKAGE = Path(medallion_assets.__file__).parent
#: What is not machinery: the pipelines (TPC-H's with its landing contract, demo landing and simulator).
NOT_MACHINERY = ("pipelines/",)


def machinery_modules() -> list[Path]:
    return [
        path for path in sorted(PACKAGE.rglob("*.py")) if not str(path.relative_to(PACKAGE)).startswith(NOT_MACHINERY)
    ]


def tpch_names() -> set[str]:
    """TPC-H's feed names and silver tables, from its declarations and its own silver step."""
    from medallion_assets.pipelines.tpch import feeds, silver

    declared = feeds_in([feeds])
    tables = {f.silver_table for f in declared if f.silver_table} | {
        k.path[-1] for k in silver.orders_and_lineitem.keys
    }
    return {f.name for f in declared} | tables


def names_in_code(path: Path) -> tuple[set[str], set[str]]:
    """A module's string constants (docstrings aside: what code can branch on) and its identifiers."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    strings, identifiers = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            strings.add(node.value)
        elif isinstance(node, ast.Name):
            identifiers.add(node.id)
        elif isinstance(node, ast.Attribute):
            identifiers.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            identifiers.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            identifiers |= {alias.name for alias in node.names} | {getattr(node, "module", None) or ""}
    return strings, identifiers


def test_no_machinery_module_names_a_tpch_feed_or_imports_tpch():
    tpch = tpch_names()
    assert {"orders_raw", "orders_kafka", "customers_cdc", "customers", "orders", "lineitem", "nation"} <= tpch
    modules = machinery_modules()
    assert len(modules) > 30, "the scan sees the package"
    offenders = {}
    for path in modules:
        strings, identifiers = names_in_code(path)
        # Any string equal to a TPC-H name; identifiers only when unmistakable (a local
        # variable called ``part`` is not the TPC-H table).
        hits = (
            sorted(strings & tpch)
            + sorted(identifiers & {n for n in tpch if "_" in n})
            + sorted(n for n in identifiers if n.startswith("medallion_assets.pipelines.tpch"))
        )
        if hits:
            offenders[str(path.relative_to(PACKAGE))] = hits
    assert not offenders, f"machinery that names TPC-H: {offenders}"


def test_a_hook_re_exported_by_its_package_is_found_once():
    import types

    def land_sample(landing, *, scale_factor, seed):
        return None

    package, module, other = types.ModuleType("p"), types.ModuleType("p.m"), types.ModuleType("p.o")
    package.land_sample = module.land_sample = land_sample
    other.land_sample = "not a function"
    assert pipeline_hooks([package, module, other], "land_sample") == (land_sample,)
    assert pipeline_hooks([other], "land_sample") == ()


def test_the_scan_would_see_a_feed_name():
    """The check above can fail: a branch on a feed's name is seen."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        module = Path(folder) / "branchy.py"
        module.write_text(
            'def read(stream):\n    """orders_raw in a docstring is fine."""\n'
            '    return "text" if stream == "orders_raw" else "csv"\n'
        )
        assert "orders_raw" in names_in_code(module)[0]
        module.write_text('def read(stream):\n    """orders_raw in a docstring is fine."""\n')
        assert "orders_raw" not in names_in_code(module)[0]


def _payments(**changes) -> Feed:
    declared = dict(
        name="payments_raw",
        description="Payments.",
        source=LandingFiles(folder="payments", format="ndjson"),
        fields=(Field("payment_id"), Field("amount", DecimalType(12, 2)), Field("paid_at", TimestampType())),
        silver=ApplyChanges(table="payments", keys=("payment_id",), sequence_by=("paid_at",)),
    )
    return Feed(**{**declared, **changes})


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        (
            {"silver": ApplyChanges(table="payments", keys=("paymentid",), sequence_by=("paid_at",))},
            "silver.keys = ['paymentid'] cannot work: use declared fields: payment_id, amount, paid_at",
        ),
        (
            {"silver": ApplyChanges(table="payments", keys=("payment_id",), sequence_by=())},
            "silver.sequence_by = () cannot work",
        ),
        ({"name": "payments-raw"}, "name = 'payments-raw' cannot work"),
        (
            {"source": LandingFiles(folder="payments", format="xml")},
            "source.format = 'xml' cannot work: use 'ndjson' or 'csv'",
        ),
        (
            {"fields": (Field("payment_id"), Field("payment_id"))},
            "fields = ['payment_id'] cannot work: declare each field once",
        ),
        (
            {"silver": ApplyChanges(table="payments", keys=("payment_id",), sequence_by=("payment_id",), history=True)},
            "silver.history = True cannot work",
        ),
        (
            {
                "silver": ApplyChanges(
                    table="payments", keys=("payment_id",), sequence_by=("paid_at",), deletion_vectors="yes"
                )
            },
            "silver.deletion_vectors = 'yes' cannot work: say True",
        ),
        (
            {
                "silver": ApplyChanges(
                    table="payments", keys=("payment_id",), sequence_by=("paid_at",), filtered_by=("paidat",)
                )
            },
            "silver.filtered_by = ['paidat'] cannot work: use declared fields",
        ),
        (
            {
                "silver": ApplyChanges(
                    table="payments",
                    keys=("payment_id",),
                    sequence_by=("paid_at",),
                    except_fields=("paid_at",),
                    filtered_by=("paid_at",),
                )
            },
            "silver.filtered_by = ['paid_at'] cannot work: filter on fields the silver table keeps",
        ),
        (
            {"silver": Replace(table="payments")},
            "silver = Replace(table='payments', keys=()) cannot work: Replace(...) is for snapshots",
        ),
        (
            {"source": LandingSnapshots(folder="payments")},
            "silver.sequence_by = ('paid_at',) cannot work: leave it out: a snapshot feed's changes are ordered by",
        ),
        (
            {
                "source": LandingSnapshots(folder="payments"),
                "silver": ApplyChanges(table="payments", keys=("payment_id",), delete_when=("amount", "0")),
            },
            "silver.delete_when = ('amount', '0') cannot work: leave it out: a key absent from a newer snapshot",
        ),
        (
            {
                "source": LandingSnapshots(folder="payments"),
                "fields": (Field("payment_id"), Field("_snapshot")),
                "silver": ApplyChanges(table="payments", keys=("payment_id",)),
            },
            "fields = ['_snapshot'] cannot work: rename them",
        ),
        (
            {"source": LandingSnapshots(folder="payments"), "silver": ApplyChanges(table="payments", keys=())},
            "silver.keys = () cannot work",
        ),
        (
            {"source": LandingSnapshots(folder="payments"), "silver": None},
            "silver = None cannot work: snapshots (LandingSnapshots) declare Replace(...)",
        ),
    ],
)
def test_a_declaration_that_cannot_work_says_the_setting_the_value_and_the_fix(changes, says):
    with pytest.raises(FeedDeclarationError) as raised:
        _payments(**changes)
    assert str(raised.value).startswith("feed ")
    assert says in str(raised.value)


def test_a_snapshot_feed_with_keys_is_applied_as_changes_ordered_by_its_snapshots():
    snapshots = _payments(
        source=LandingSnapshots(folder="payments"),
        silver=ApplyChanges(table="payments", keys=("payment_id",), history=True),
    )
    assert snapshots.applies_snapshots and not _payments().applies_snapshots
    changes = snapshots.change_feed
    assert changes.field_names == (*snapshots.field_names, "_snapshot_at", "_snapshot", "_change")
    assert changes.silver.sequence_by == ("_snapshot_at", "_snapshot")
    assert changes.silver.delete_when == ("_change", "delete")
    assert [f.name for f in changes.silver_fields] == list(snapshots.field_names)
    assert changes.change_feed is changes and _payments().change_feed.field_names == snapshots.field_names


def test_a_change_feed_declared_with_deletion_vectors_creates_its_silver_table_with_them():
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.io_manager import DELETION_VECTORS, WriteSpec, write_spec_from_metadata

    def silver_spec(feed: Feed) -> WriteSpec:
        [step] = silver_assets([feed])
        return write_spec_from_metadata(step.specs_by_key[AssetKey(["silver", "payments"])].metadata)

    plain = _payments()
    with_vectors = _payments(
        silver=ApplyChanges(table="payments", keys=("payment_id",), sequence_by=("paid_at",), deletion_vectors=True)
    )
    assert DELETION_VECTORS not in silver_spec(plain).table_properties
    assert silver_spec(with_vectors).table_properties == {DELETION_VECTORS: "true"}


def test_a_change_feed_declares_the_fields_its_silver_table_is_filtered_by():
    from medallion_assets.assets.silver import silver_assets
    from medallion_assets.io_manager import write_spec_from_metadata

    def filtered_by(feed: Feed) -> tuple[str, ...] | None:
        [step] = silver_assets([feed])
        return write_spec_from_metadata(step.specs_by_key[AssetKey(["silver", "payments"])].metadata).filtered_by

    assert filtered_by(_payments()) is None  # the default: every date and timestamp column
    assert filtered_by(
        _payments(
            silver=ApplyChanges(
                table="payments", keys=("payment_id",), sequence_by=("paid_at",), filtered_by=("amount",)
            )
        )
    ) == ("amount",)
    assert (
        filtered_by(
            _payments(
                silver=ApplyChanges(table="payments", keys=("payment_id",), sequence_by=("paid_at",), filtered_by=())
            )
        )
        == ()
    )


def test_two_feeds_of_one_name_are_refused_when_the_pipelines_are_read():
    import types

    first, second = types.ModuleType("first"), types.ModuleType("second")
    first.PAYMENTS, second.PAYMENTS_AGAIN = _payments(), _payments(silver=None)
    with pytest.raises(FeedDeclarationError, match="two feeds are named 'payments_raw'"):
        feeds_in([first, second])
    assert feeds_in([first, first]) == (first.PAYMENTS,)


def test_without_the_simulator_the_graph_has_no_trace_of_it():
    from medallion_assets.definitions import build_definitions

    demo = AssetKey(["landing", "simulated_batch"])
    graph = build_definitions("local", simulator=False).get_repository_def().asset_graph
    assert demo not in graph.get_all_asset_keys()
    assert not any(demo in graph.get(key).parent_keys for key in graph.get_all_asset_keys())
    with_demo = build_definitions("local", simulator=True).get_repository_def().asset_graph
    assert demo in with_demo.get(AssetKey(["bronze", "orders_raw"])).parent_keys
