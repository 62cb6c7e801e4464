"""The README's quickstart tried as a new user would, in headless Chromium.

Starts ``dg dev`` on a fresh lake, with ``DAGSTER_HOME`` holding the project's
``dagster_home/dagster.yaml`` as the quickstart sets it, opens the asset
lineage, clicks **Materialize all**, and checks that it is one run, that every
asset materialized and that no check of severity ERROR failed (the noisy
delivery's rejects and the rows its drop expectations set aside show as WARN,
as the README says). Then a command-line run with the same
``DAGSTER_HOME`` shows in the UI's run list beside it. Then a broken delivery
lands (a file of random bytes among the order events, a customer CSV whose
header is ``id,name,favourite_colour``, both written here with plain Python),
and a run of everything downstream of bronze fails: the Runs list and the
run's page show a failure tagged ``medallion/data_checks: failed``, the
rejected-rows checks are red (ERROR) naming the files, gold is not computed,
and quarantine's preview shows the new rejects. Screenshots of each step are kept in the test's temp folder (printed
on failure) so that a person can look at what the user saw.

Needs Chromium from Debian (``apt-get install chromium``; ``.ci/run`` installs
it); nothing is downloaded by Playwright.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from medallion_assets_tests.support.processes import stop_group

# Not in the both_engines set (the suite's time budget, 7 minutes on delta-spark): what the UI
# shows does not depend on the engine, and delta-spark runs the whole pipeline in
# test_deployments.py and test_engine_switch.py. Run it on delta-spark by hand with
# MEDALLION_TEST_ENGINE=delta-spark MEDALLION_DELTA_ENGINE=delta-spark pytest -m browser.
pytestmark = [pytest.mark.slow, pytest.mark.browser]

REPO_ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUN_TIMEOUT_S = 1500


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(base: str, query: str, variables: dict | None = None) -> dict:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{base}/graphql", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        payload = json.load(response)
    assert "errors" not in payload, payload
    return payload["data"]


def wait_until_serving(base: str, process: subprocess.Popen, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"dagster dev exited early:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{base}/server_info", timeout=5):
                return
        except OSError:
            time.sleep(2)
    raise AssertionError(f"dagster dev did not serve within {timeout}s:\n{log.read_text()[-4000:]}")


RUNS = """
query { runsOrError { ... on Runs { results { runId status tags { key value } } } } }
"""
FINISHED = ("SUCCESS", "FAILURE", "CANCELED")
ASSETS = """
query {
  assetNodes {
    assetKey { path }
    assetMaterializations(limit: 1) {
      runId
      timestamp
      metadataEntries { label ... on TextMetadataEntry { text } }
    }
    assetChecksOrError {
      ... on AssetChecks { checks { name executionForLatestMaterialization { status evaluation { severity } } } }
    }
  }
}
"""


CHECKS = """
query {
  assetNodes {
    assetKey { path }
    assetMaterializations(limit: 1) {
      runId
      metadataEntries { label ... on MarkdownMetadataEntry { mdStr } }
    }
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          executionForLatestMaterialization {
            runId status
            evaluation {
              severity description
              metadataEntries { label ... on JsonMetadataEntry { jsonString } ... on MarkdownMetadataEntry { mdStr } }
            }
          }
        }
      }
    }
  }
}
"""


def land(path: Path, data: bytes) -> None:
    """A whole file, written aside and renamed into place, as the landing contract asks of a producer."""
    aside = path.parent / f".{path.name}.tmp"
    aside.write_bytes(data)
    aside.rename(path)


def markdown_rows(markdown: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        for line in markdown.splitlines()[2:]
        if line.startswith("| ")
    ]


@pytest.fixture()
def dagster_dev(tmp_path):
    home, lake, log = tmp_path / "dagster_home", tmp_path / "lakehouse", tmp_path / "dagster_dev.log"
    home.mkdir()
    # The quickstart's instance settings (one run at a time), in a home of the test's own.
    shutil.copy(REPO_ROOT / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(home), "MEDALLION_LAKE_ROOT": str(lake), "PYSPARK_PYTHON": sys.executable}
    with log.open("w") as out:
        process = subprocess.Popen(
            [str(Path(sys.executable).parent / "dg"), "dev", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(base, process, log)
        yield base, tmp_path, log, env
    finally:
        stop_group(process, grace=60)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_materialize_all_from_the_ui_is_one_run_with_no_error_check_then_a_broken_delivery_is_red(dagster_dev):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    base, folder, log, env = dagster_dev
    shots = folder / "screenshots"
    shots.mkdir()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.goto(f"{base}/asset-groups")
        # "Materialize all" without an ellipsis: no partition dialog, the click launches the run.
        materialize_all = page.get_by_role("button").filter(has_text=re.compile(r"^Materialize all$"))
        materialize_all.wait_for(timeout=120_000)
        # Dagster greets a first visit with a newsletter dialog, a moment after the page shows.
        try:
            page.get_by_role("button", name="Skip").click(timeout=20_000)
        except PlaywrightTimeout:
            pass
        page.get_by_role("dialog").wait_for(state="detached", timeout=20_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=shots / "1-lineage.png")
        for group in ("landing", "bronze", "silver", "quarantine", "gold"):
            assert page.get_by_text(group, exact=True).first.is_visible(), f"asset group {group} not shown"

        materialize_all.click(timeout=120_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=shots / "2-launched.png")

        deadline = time.monotonic() + RUN_TIMEOUT_S
        runs = []
        while time.monotonic() < deadline:
            runs = graphql(base, RUNS)["runsOrError"]["results"]
            if runs and all(r["status"] in FINISHED for r in runs):
                break
            time.sleep(10)
        page.goto(f"{base}/runs")
        page.wait_for_timeout(3000)
        page.screenshot(path=shots / "3-runs.png")
        assert len(runs) == 1, f"Materialize all launched {len(runs)} runs: {runs}"
        assert runs[0]["status"] == "SUCCESS", (
            f"the run ended as {runs[0]['status']}; screenshots in {shots}; log tail:\n{log.read_text()[-3000:]}"
        )

        nodes = graphql(base, ASSETS)["assetNodes"]
        unmaterialized = ["/".join(n["assetKey"]["path"]) for n in nodes if not n["assetMaterializations"]]
        assert not unmaterialized, f"not materialized: {unmaterialized}"
        errors, warnings = [], []
        checked = 0
        for node in nodes:
            for check in (node["assetChecksOrError"] or {}).get("checks", []):
                execution = check["executionForLatestMaterialization"]
                checked += 1
                where = ("/".join(node["assetKey"]["path"]), check["name"])
                if execution is None or execution["status"] not in ("SUCCEEDED", "FAILED"):
                    errors.append((*where, execution))
                elif execution["status"] == "FAILED":
                    severity = (execution["evaluation"] or {}).get("severity")
                    (warnings if severity == "WARN" else errors).append((*where, severity))
        assert checked > 0
        assert not errors, f"checks failed with severity ERROR or did not run: {errors}"
        # The simulator's delivery is noisy by design: its rejects must show (amber), not hide behind green,
        # and so must "the expectations that dropped rows" (the README's quickstart).
        amber = {name for _, name, _ in warnings}
        assert {
            "orders_rejected_rows",
            "customers_rejected_rows",
            "orders_status_known",
            "lineitem_quantity_positive",
            "customers_segment_known",
        } <= amber, warnings

        # Every Delta table says which engine wrote it, the engine this session was started with
        # (a pandas asset's table: deltalake itself).
        from medallion_assets.io_manager.metadata import ENGINE_NAME

        engine = os.environ["MEDALLION_DELTA_ENGINE"]
        engines = {
            "/".join(n["assetKey"]["path"]): entry.get("text")
            for n in nodes
            if n["assetKey"]["path"][0] != "landing"
            for entry in n["assetMaterializations"][0]["metadataEntries"]
            if entry["label"] == "delta/engine" and entry.get("text") != ENGINE_NAME
        }
        assert engines and set(engines.values()) == {engine}, engines
        # And what the user sees of it on the asset's events page, on its latest materialization
        # (the newest events of silver/orders are the observations of gold's reads of it).
        [orders] = [n for n in nodes if n["assetKey"]["path"] == ["silver", "orders"]]
        page.goto(f"{base}/assets/silver/orders?view=events&time={orders['assetMaterializations'][0]['timestamp']}")
        page.get_by_text("delta/engine").first.wait_for(timeout=60_000)
        page.screenshot(path=shots / "5-silver-orders-engine.png")
        assert page.get_by_text(engine, exact=True).first.is_visible(), f"the engine {engine} is not shown"

        page.goto(f"{base}/assets/silver/orders?view=checks")
        page.wait_for_timeout(4000)
        page.screenshot(path=shots / "4-silver-orders-checks.png")

        # The quickstart's command-line run, with the same DAGSTER_HOME, is in the UI's history too.
        subprocess.run(
            [
                str(Path(sys.executable).parent / "dagster"),
                "asset",
                "materialize",
                "-m",
                "medallion_assets.definitions",
                "--select",
                "gold/pricing_summary",
            ],
            cwd=REPO_ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=600,
        )
        # The runs work by path: their session catalog names nothing until asked (docs/catalog.md), so
        # it makes no database folder in the lake.
        assert not (folder / "lakehouse" / "_warehouse").exists()
        runs = graphql(base, RUNS)["runsOrError"]["results"]
        assert len(runs) == 2 and all(r["status"] == "SUCCESS" for r in runs), runs
        page.goto(f"{base}/runs")
        for run in runs:  # the run list shows each run's short id
            page.get_by_text(run["runId"][:8]).first.wait_for(timeout=60_000)
        page.screenshot(path=shots / "6-runs-ui-and-cli.png")

        # ---- A broken delivery, landed as a producer would (plain Python, not the project's simulator).
        landing = folder / "lakehouse" / "landing"
        garbage = landing / "orders" / "broken-export.json"
        wrong_header = landing / "customers" / "wrong-export.csv"
        land(garbage, bytes(b for b in random.Random(73).randbytes(3000) if b != ord("\r")))
        land(wrong_header, b"id,name,favourite_colour\r\n1,Ada,green\r\n2,Bob,blue\r\n")
        broken = subprocess.run(
            [
                str(Path(sys.executable).parent / "dagster"),
                "asset",
                "materialize",
                "-m",
                "medallion_assets.definitions",
                "--select",
                "bronze/orders_raw*,bronze/customers_cdc*",
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert broken.returncode != 0, broken.stdout[-2000:]
        [run] = [
            r for r in graphql(base, RUNS)["runsOrError"]["results"] if r["runId"] not in {r["runId"] for r in runs}
        ]
        tags = {t["key"]: t["value"] for t in run["tags"]}
        assert run["status"] == "FAILURE" and tags.get("medallion/data_checks") == "failed", (
            run,
            broken.stderr[-3000:],
        )
        assert (
            tags["medallion/failed_checks"]
            == "silver/customers:customers_rejected_rows, silver/orders:orders_rejected_rows"
        )

        nodes = {"/".join(n["assetKey"]["path"]): n for n in graphql(base, CHECKS)["assetNodes"]}
        red = {}
        for asset, check in (
            ("silver/orders", "orders_rejected_rows"),
            ("silver/customers", "customers_rejected_rows"),
        ):
            [execution] = [
                c["executionForLatestMaterialization"]
                for c in nodes[asset]["assetChecksOrError"]["checks"]
                if c["name"] == check
            ]
            assert execution["runId"] == run["runId"] and execution["status"] == "FAILED", execution
            evaluation = execution["evaluation"]
            assert evaluation["severity"] == "ERROR", evaluation
            entries = {e["label"]: e.get("jsonString") or e.get("mdStr") for e in evaluation["metadataEntries"]}
            red[check] = (evaluation["description"], json.loads(entries["rejected_by_file"]))
        description, files = red["orders_rejected_rows"]
        assert "orders/broken-export.json" in description and "every line rejected" in description
        assert [f["file"].rsplit("/", 2)[-2:] for f in files if f["rejected_whole"]] == [
            ["orders", "broken-export.json"]
        ]
        description, files = red["customers_rejected_rows"]
        [whole] = [f for f in files if f["rejected_whole"]]
        assert whole["file"].endswith("customers/wrong-export.csv") and whole["input_rows"] == 2
        assert whole["reason"].startswith("header does not match the declaration: expected (op, c_custkey,")
        assert whole["reason"].endswith("found (id, name, favourite_colour)") and "wrong-export.csv" in description
        # Gold was not computed from the broken delivery.
        computed = [
            key
            for key, n in nodes.items()
            if key.startswith("gold/")
            and n["assetMaterializations"]
            and n["assetMaterializations"][0]["runId"] == run["runId"]
        ]
        assert not computed, computed
        # The quarantine's preview shows the newest rejects: this run's, not the first batch's.
        from medallion_assets_tests.support.readers import read_with_deltalake

        quarantined = read_with_deltalake(str(folder / "lakehouse" / "quarantine" / "orders")).to_pylist()
        newest = max(r["_quarantined_at"] for r in quarantined)
        assert {r["_source_file"].rsplit("/", 1)[1] for r in quarantined if r["_quarantined_at"] == newest} == {
            garbage.name
        }
        [preview] = [
            e["mdStr"]
            for e in nodes["quarantine/orders"]["assetMaterializations"][0]["metadataEntries"]
            if e["label"] == "preview"
        ]
        shown = markdown_rows(preview)
        assert shown and {row[-1] for row in shown} == {str(newest)}, preview

        # What the user sees. The Runs list: the run's row says Failure and shows the tag.
        page.goto(f"{base}/runs")
        page.get_by_text(run["runId"][:8]).first.wait_for(timeout=60_000)
        page.get_by_text("medallion/data_checks: failed").first.wait_for(timeout=60_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=shots / "7-runs-broken-delivery.png")
        listed = page.inner_text("body")
        (shots / "7-runs-broken-delivery.txt").write_text(listed)
        # The list reads row by row, newest first: the broken run's row is its text up to the next run's id.
        row = listed[listed.index(run["runId"][:8]) :]
        row = row[: min([row.find(r["runId"][:8]) for r in runs if r["runId"][:8] in row] or [len(row)])]
        assert "Failure" in row.split() and "medallion/data_checks: failed" in row, row
        # The run's page: Failure, the blocking check that failed the step, and the tags.
        page.goto(f"{base}/runs/{run['runId']}")
        page.get_by_text("Failure", exact=True).first.wait_for(timeout=60_000)
        page.wait_for_timeout(3000)
        page.screenshot(path=shots / "8-run-broken-delivery.png")
        (shots / "8-run-broken-delivery.txt").write_text(page.inner_text("body"))
        page.get_by_role("button", name="View tags and config").click()
        tags_shown = page.get_by_role("dialog")
        tags_shown.get_by_text("medallion/data_checks: failed").wait_for(timeout=30_000)
        page.wait_for_timeout(1000)  # the dialog fades in
        page.screenshot(path=shots / "9-run-broken-delivery-tags.png")
        assert "medallion/failed_checks: silver/customers:customers_rejected_rows" in tags_shown.inner_text()
        page.keyboard.press("Escape")
        # The check: red (failed, ERROR), blocking, the file named.
        page.goto(f"{base}/assets/silver/orders?view=checks")
        page.get_by_text("orders_rejected_rows").first.click(timeout=60_000)
        page.get_by_text("broken-export.json").first.wait_for(timeout=60_000)
        page.wait_for_timeout(2000)
        page.screenshot(path=shots / "10-orders-rejected-rows.png")
        shown = page.inner_text("body")
        (shots / "10-orders-rejected-rows.txt").write_text(shown)
        assert "This is a blocking asset check" in shown and "every line rejected" in shown
        print(f"screenshots in {shots}")
        browser.close()
