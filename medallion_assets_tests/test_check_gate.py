"""``medallion-assets check`` (docs/ci-checks.md): the asset checks as a CI gate, with a JUnit file.

On the simulator's sample every check of the definitions is in the JUnit file
and none fails (in process, on the test session's Spark). A pipeline package
the test writes (named by ``MEDALLION_PIPELINES``) adds a tiny gold table whose
blocking ERROR check fails on the rows it stored, and a tiny feed whose landed
file of random bytes makes its non-blocking rejected-rows check an ERROR; the
real command, narrowed with ``--select`` to them, exits 1 and its stderr and
JUnit file name the checks (and the file).
The JUnit files are read with ``xml.etree``, the writer under test being the
command.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from medallion_assets import check_gate, cli

PROBE_PACKAGE = "gate_probe_pipelines"

#: A pipeline package, as a user would write one: a gold table with a blocking ERROR check that
#: fails on one stored row, a WARN check that fails, a passing check, and a table downstream
#: whose check cannot run once the blocking check failed.
PROBE_MODULE = """
from dagster import AssetCheckResult, AssetCheckSeverity, AssetIn, AssetKey, asset, asset_check
from pyspark.sql import DataFrame

from pyspark.sql.types import TimestampType

from medallion_assets.feeds import ApplyChanges, Feed, Field, LandingFiles
from medallion_assets.resources import SparkResource

PROBE = AssetKey(["gold", "gate_probe"])
TOTAL = AssetKey(["gold", "gate_probe_total"])


@asset(key=PROBE, group_name="gate_probe")
def gate_probe(spark: SparkResource) -> DataFrame:
    return spark.spark_session.createDataFrame([(1, 5), (2, -3)], "id long, amount long")


@asset(key=TOTAL, group_name="gate_probe", ins={"probe": AssetIn(key=PROBE)})
def gate_probe_total(probe: DataFrame) -> DataFrame:
    return probe.groupBy().sum("amount")


def _result(stored: DataFrame, bad: str, severity: AssetCheckSeverity) -> AssetCheckResult:
    failing = stored.filter(bad).count()
    return AssetCheckResult(passed=failing == 0, severity=severity,
                            metadata={"failing_rows": failing, "passing_rows": stored.count() - failing})


@asset_check(asset=PROBE, blocking=True, description="No negative amount.")
def amounts_non_negative(stored: DataFrame) -> AssetCheckResult:
    return _result(stored, "amount < 0", AssetCheckSeverity.ERROR)


@asset_check(asset=PROBE)
def amounts_below_five(stored: DataFrame) -> AssetCheckResult:
    return _result(stored, "amount >= 5", AssetCheckSeverity.WARN)


@asset_check(asset=PROBE)
def ids_present(stored: DataFrame) -> AssetCheckResult:
    return _result(stored, "id IS NULL", AssetCheckSeverity.ERROR)


@asset_check(asset=TOTAL)
def total_present(stored: DataFrame) -> AssetCheckResult:
    return _result(stored, "`sum(amount)` IS NULL", AssetCheckSeverity.ERROR)


# A feed of landed NDJSON: a file of random bytes makes its (non-blocking) rejected-rows check an ERROR.
GATE_PROBE_FEED = Feed(
    name="gate_probe_raw", description="Probe items.", source=LandingFiles(folder="gate_probe", format="ndjson"),
    fields=(Field("item_id", description="The item."), Field("updated_at", TimestampType(), description="When.")),
    silver=ApplyChanges(table="gate_probe_items", keys=("item_id",), sequence_by=("updated_at",)),
)
"""


def junit_cases(path: Path) -> dict[tuple[str, str], ET.Element]:
    """(classname, name) -> ``<testcase>`` of a JUnit file."""
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"
    cases = {(case.get("classname"), case.get("name")): case for case in root.iter("testcase")}
    assert int(root.get("tests")) == len(cases)
    return cases


# Slow, and on the session's engine only (not both_engines): the gate is engine-blind, and the whole
# pipeline runs on delta-spark in test_deployments.py and test_engine_switch.py.
@pytest.mark.slow
def test_the_sample_passes_every_check_of_the_definitions(spark, tmp_path, capsys):
    from medallion_assets.definitions import build_definitions

    junit = tmp_path / "reports" / "checks.xml"
    code = cli.main(["check", "--junit-xml", str(junit), "--lake", str(tmp_path / "lake")])
    out, err = capsys.readouterr()

    assert code == check_gate.EXIT_PASSED, err[-3000:]
    from medallion_assets.settings import read_settings

    kafka = read_settings().kafka  # as the gate builds them: Kafka feeds only where Kafka is configured
    graph = build_definitions("local", simulator=False, kafka=kafka).get_repository_def().asset_graph
    expected = {(key.asset_key.to_user_string(), key.name) for key in graph.asset_check_keys}
    cases = junit_cases(junit)
    assert set(cases) == expected
    assert not [
        name for name, case in cases.items() if case.find("failure") is not None or case.find("error") is not None
    ]
    # Every check ran; the noisy sample may fail WARN checks (rejected rows), which stay out of the verdict.
    skipped = {
        name: case.find("skipped").get("message") for name, case in cases.items() if case.find("skipped") is not None
    }
    assert all(message.startswith("WARN check failed") for message in skipped.values()), skipped
    # The README's quickstart: "the expectations that dropped rows turn amber", each with the rows the
    # contract's reference says it drops from the sample (one batch: one run judges every row).
    from medallion_assets_tests.support import contract_reference

    drops = contract_reference.expected_drops(tmp_path / "lake" / "landing")
    amber = {
        ("silver/orders", "orders_status_known"),
        ("silver/lineitem", "lineitem_quantity_positive"),
        ("silver/customers", "customers_segment_known"),
    }
    assert {name for _, name in amber} == set(drops), drops
    for asset, check in amber:
        message = skipped.get((asset, check), "")
        failing = re.search(r"failing_rows=(\d+)", message)
        assert message.startswith("WARN check failed") and failing and int(failing[1]) == drops[check], (check, message)
    # The key checks carry their counts, as the check wrote them.
    rows = cases[("silver/orders", "orders_key_unique")].find("system-out").text
    assert "failing_rows: 0" in rows and "passing_rows: " in rows
    assert f"{len(expected)} checks: {len(expected) - len(skipped)} passed, 0 failed (ERROR)" in out
    assert (tmp_path / "lake" / "silver" / "orders" / "_delta_log").is_dir(), "--lake keeps the lake"


@pytest.mark.slow
def test_a_failed_error_check_fails_the_gate_and_is_named(tmp_path):
    package = tmp_path / "pipelines" / PROBE_PACKAGE
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "probe.py").write_text(textwrap.dedent(PROBE_MODULE))
    landing = tmp_path / "landing"  # the probe's feed gets a file of random bytes, written with plain Python
    (landing / "gate_probe").mkdir(parents=True)
    (landing / "gate_probe" / "batch-00001.json").write_bytes(random.Random(72).randbytes(3000))
    temp = tmp_path / "temp"
    temp.mkdir()
    junit = tmp_path / "checks.xml"
    env = {
        **os.environ,
        "MEDALLION_PIPELINES": PROBE_PACKAGE,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "pipelines"), os.environ.get("PYTHONPATH")])),
        "TMPDIR": str(temp),
    }
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "medallion_assets.cli",
            "check",
            "--select",
            'key:"gold/gate_probe"+ or key:"bronze/gate_probe_raw" or key:"silver/gate_probe_items"',
            "--landing",
            str(landing),
            "--junit-xml",
            str(junit),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    assert finished.returncode == check_gate.EXIT_CHECK_FAILED, finished.stderr[-3000:]
    # The run's log from INFO up: the session's start and readiness, none of Dagster's DEBUG events.
    assert " - DEBUG - " not in finished.stderr and "Spark session ready after " in finished.stderr
    assert "ERROR check gold/gate_probe amounts_non_negative failed: failing_rows=1" in finished.stderr
    # The non-blocking rejected-rows check of a file rejected whole fails the gate too, the file named.
    rejected = [
        line
        for line in finished.stderr.splitlines()
        if line.startswith("medallion-assets check: ERROR check silver/gate_probe_items gate_probe_items_rejected_rows")
    ]
    assert rejected and "files_rejected_whole=1" in rejected[0] and "gate_probe/batch-00001.json" in rejected[0]
    cases = junit_cases(junit)
    assert {
        ("gold/gate_probe", "amounts_non_negative"),
        ("gold/gate_probe", "amounts_below_five"),
        ("gold/gate_probe", "ids_present"),
        ("gold/gate_probe_total", "total_present"),
        ("silver/gate_probe_items", "gate_probe_items_rejected_rows"),
    } <= set(cases)
    assert cases[("silver/gate_probe_items", "gate_probe_items_rejected_rows")].find("failure") is not None
    failure = cases[("gold/gate_probe", "amounts_non_negative")].find("failure")
    assert (
        failure is not None
        and "failing_rows=1" in failure.get("message")
        and "passing_rows=1" in failure.get("message")
    )
    warned = cases[("gold/gate_probe", "amounts_below_five")]
    assert warned.find("failure") is None and warned.find("skipped").get("message").startswith("WARN check failed")
    passed = cases[("gold/gate_probe", "ids_present")]
    assert passed.find("failure") is None and passed.find("skipped") is None
    blocked = cases[("gold/gate_probe_total", "total_present")]
    assert blocked.find("skipped").get("message").startswith("not evaluated")
    assert not list(temp.glob("medallion-check-*")), "the throwaway lake is removed"


def test_a_step_error_outranks_failed_checks_and_is_a_junit_error(tmp_path):
    """No Spark: a report as a run leaves it, written and read back (the slow tests make real ones)."""
    from medallion_assets.check_gate import CheckOutcome, GateReport, StepError, write_junit

    failed = CheckOutcome(
        asset="silver/t",
        check="key_unique",
        severity="ERROR",
        status="failed",
        metadata={"failing_rows": "2", "top_reasons": "| reason |\n|---|\n| bad |"},
    )
    warned = CheckOutcome(
        asset="silver/t", check="in_range", severity="WARN", status="failed", metadata={"failing_rows": "1"}
    )
    report = GateReport(
        outcomes=(failed, warned),
        seconds=1.0,
        step_errors=(
            StepError(step="gold__t", error_type="ValueError", message="no such column", trace="Traceback ..."),
        ),
    )
    assert report.exit_code == check_gate.EXIT_RUN_FAILED
    assert GateReport(outcomes=(failed, warned), step_errors=(), seconds=1.0).exit_code == check_gate.EXIT_CHECK_FAILED
    assert GateReport(outcomes=(warned,), step_errors=(), seconds=1.0).exit_code == check_gate.EXIT_PASSED

    write_junit(report, path=tmp_path / "checks.xml")
    cases = junit_cases(tmp_path / "checks.xml")
    error = cases[(check_gate.RUN_SUITE, "gold__t")].find("error")
    assert error.get("type") == "ValueError" and error.get("message") == "no such column"
    # A Markdown table stays a table: out of the one-line message, whole in the body.
    assert cases[("silver/t", "key_unique")].find("failure").get("message") == "ERROR check failed: failing_rows=2"
    assert "top_reasons: | reason |\n|---|\n| bad |" in cases[("silver/t", "key_unique")].find("failure").text
    assert failed.tables() == "  top_reasons:\n    | reason |\n    |---|\n    | bad |"
    root = ET.parse(tmp_path / "checks.xml").getroot()
    assert (root.get("failures"), root.get("errors"), root.get("skipped")) == ("1", "1", "1")


def test_a_selection_is_widened_to_whole_steps():
    from dagster import AssetKey

    from medallion_assets.definitions import build_definitions

    definitions = build_definitions("local", simulator=False, kafka=False)
    graph = definitions.get_repository_def().asset_graph
    selected = check_gate.resolve_selection(definitions, select='key:"silver/orders"').resolve(graph)
    # silver/orders is written by the step that also writes silver/lineitem and quarantine/orders.
    assert {AssetKey(["silver", "lineitem"]), AssetKey(["quarantine", "orders"])} <= selected
    assert AssetKey(["gold", "pricing_summary"]) not in selected
