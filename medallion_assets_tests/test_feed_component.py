"""A feed declared as a Dagster component in YAML is the feed the Python declaration makes.

Cheap: no Spark session, no run. The page's two forms (docs/adding-a-feed.md,
written as packages by ``support.feed_page.write_page_pipeline``) give equal
``Feed`` objects and the same assets, checks and sensors in the project's
definitions; the component's own ``build_defs`` builds the same pieces; the
scaffolded template is a feed; a YAML that cannot work names its file, the
attribute and the fix; and ``dg list components`` lists the type.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dagster import AssetKey, Definitions

from medallion_assets.components import COMPONENT_TYPE, FeedComponent, FeedYamlError, feed_from_yaml
from medallion_assets.definitions import build_definitions, resources_for
from medallion_assets_tests.support.feed_page import blocks, forget, write_page_pipeline

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def both_forms(tmp_path, monkeypatch):
    """The page's feed as two packages, ``forms_python`` and ``forms_yaml``, importable."""
    for form in ("python", "yaml"):
        write_page_pipeline(tmp_path, f"forms_{form}", form)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for form in ("python", "yaml"):
        forget(f"forms_{form}")


def _shown(packages: tuple[str, ...]):
    repo = build_definitions("local", simulator=False, kafka=False, pipelines=packages).get_repository_def()
    graph = repo.asset_graph
    return (
        {k.to_user_string() for k in graph.get_all_asset_keys()},
        {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys},
        {s.name for s in repo.sensor_defs},
        {
            k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
            for k in graph.materializable_asset_keys
        },
    )


def test_the_yaml_form_of_the_page_is_the_python_form(both_forms):
    from medallion_assets.project import project_feeds

    python_feed = importlib.import_module("forms_python.payments").PAYMENTS
    yaml_feed = feed_from_yaml(both_forms / "forms_yaml" / "payments" / "defs.yaml")
    assert yaml_feed == python_feed
    # Found by the definitions in the package's folders, next to its Python modules.
    assert project_feeds(("forms_yaml",)) == (python_feed,)

    # Each form adds exactly its feed's pieces and the gold table to TPC-H's (which the gold table reads).
    tpch = "medallion_assets.pipelines"
    python_form, yaml_form = _shown((tpch, "forms_python")), _shown((tpch, "forms_yaml"))
    assert yaml_form == python_form
    (assets, checks, sensors, parents), (demo_assets, demo_checks, demo_sensors, _) = yaml_form, _shown((tpch,))
    assert (
        assets - demo_assets
        == {
            "bronze/payments_raw",
            "silver/payments",
            "silver/payments_history",
            "quarantine/payments",
            "gold/order_payments",
        }
        and demo_assets < assets
    )
    assert checks - demo_checks == {
        ("bronze/payments_raw", "stream_health"),
        ("silver/payments", "payments_amount_positive"),
        ("silver/payments", "payments_key_unique"),
        ("silver/payments", "payments_rejected_rows"),
        ("silver/payments", "freshness_check"),
    }
    assert sensors - demo_sensors == {"payments_raw_checkpoint_sensor"}
    assert parents["silver/payments"] == {"bronze/payments_raw"}
    assert parents["gold/order_payments"] == {"silver/payments", "silver/orders"}

    # The component's own build_defs (a project that loads its defs/ folder itself) builds the same pieces.
    from dagster.components.core.component_tree import ComponentTree

    [declared] = blocks("yaml")
    component = FeedComponent.from_attributes_dict(attributes=yaml.safe_load(declared)["attributes"])
    assert component.feed() == python_feed
    # Its resources are the project's (a defs folder's components leave them to the top-level Definitions).
    own = Definitions.merge(
        component.build_defs(ComponentTree.for_test().load_context), Definitions(resources=resources_for("local"))
    )
    own_graph = own.resolve_asset_graph()
    assert {k.to_user_string() for k in own_graph.get_all_asset_keys()} == assets - demo_assets - {
        "gold/order_payments"
    }
    assert {(k.asset_key.to_user_string(), k.name) for k in own_graph.asset_check_keys} == {*(checks - demo_checks)}
    assert {s.name for s in own.sensors} == {"payments_raw_checkpoint_sensor"}


def test_the_page_shows_one_yaml_feed_and_its_python_twin():
    declaration, gold = blocks("python")
    [component] = blocks("yaml")
    assert "PAYMENTS = Feed(" in declaration and "@asset(" in gold and "PAYMENTS" not in gold
    assert component.startswith(f"type: {COMPONENT_TYPE}\n")


def test_the_scaffolded_template_is_a_feed(tmp_path):
    from dagster.components import ScaffoldRequest

    from medallion_assets.components import FeedScaffolder

    target = tmp_path / "invoices"
    target.mkdir()
    FeedScaffolder().scaffold(
        ScaffoldRequest(
            type_name=COMPONENT_TYPE, target_path=target, scaffold_format="yaml", project_root=tmp_path, params=None
        )
    )
    feed = feed_from_yaml(target / "defs.yaml")
    assert (feed.name, feed.silver_key.to_user_string(), feed.bronze_key) == (
        "invoices_raw",
        "silver/invoices",
        AssetKey(["bronze", "invoices_raw"]),
    )


def _page_yaml(**replace: str) -> str:
    [component] = blocks("yaml")
    for old, new in replace.items():
        assert old in component
        component = component.replace(old, new)
    return component


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "type: long",
            "type: bigint",
            "fields[order_key].type = 'bigint' is not a field type: use one of string, long, int, decimal(p,s), date, "
            "timestamp",
        ),
        (
            "keys: [payment_id]",
            "keys: [paymentid]",
            "feed 'payments_raw': silver.keys = ['paymentid'] cannot work: use declared fields: payment_id, order_key, "
            "amount, paid_at",
        ),
        (
            "history: true",
            "histroy: true",
            "silver.apply_changes has no attribute histroy: use table, keys, sequence_by",
        ),
        (
            "      action: drop",
            "      action: dorp",
            "expectations.0.action = 'dorp' cannot work: Input should be 'warn', 'drop' or 'fail'",
        ),
        (
            "    - name: amount\n",
            "    - nmae: amount\n",
            "fields.2.nmae is not an attribute here: remove it or correct its spelling",
        ),
        (
            "  source:\n    landing_files:",
            "  source:\n    landing_file:",
            "source = {'landing_file': {'folder': 'payments', 'format': 'ndjson'}} cannot work: give exactly one of "
            "landing_files, kafka_topic, landing_snapshots",
        ),
    ],
)
def test_a_yaml_feed_that_cannot_work_names_the_file_the_attribute_and_the_fix(tmp_path, old, new, message):
    path = tmp_path / "payments" / "defs.yaml"
    path.parent.mkdir()
    path.write_text(_page_yaml(**{old: new}))
    with pytest.raises(FeedYamlError) as caught:
        feed_from_yaml(path)
    assert f"{path}: {message}" in str(caught.value), str(caught.value)


def test_dg_lists_the_feed_component():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [str(Path(sys.executable).with_name("dg")), "list", "components", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f'"{COMPONENT_TYPE}"' in result.stdout
