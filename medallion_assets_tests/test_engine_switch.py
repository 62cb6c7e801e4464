"""One lake, either engine: runs alternate between delta-rs and delta-spark on the same lake.

Each run is a process of its own (one SparkContext per process) on the same
Dagster instance. The delta-spark run is also the suite's whole pipeline on
delta-spark on a standalone cluster (the pyspark wheel's master and a worker on
127.0.0.1): its executors write the files, and its driver registers the tables in
the metastore (test_deployments.py runs the cluster on delta-rs). After every
run silver equals the landing contract's state computed independently and gold
equals DuckDB's TPC-H answers; at the end bronze holds every landed line once:
the increments, the checkpoints and the tombstones of one engine are carried on
by the other without reprocessing or losing a row.

The runs share a Hive metastore on a real PostgreSQL (``MEDALLION_CATALOG=hive``):
the delta-spark run registers the lake's tables; then two runs at once read
``gold.pricing_summary`` by name and register a table each; Spark's Thrift server, configured only with the metastore and delta-spark, reads
the three tables by name through ``beeline`` and gets DuckDB's TPC-H answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medallion_assets.catalog import LakeCatalog
from medallion_assets.engine import plan_engine
from medallion_assets_tests import contract_reference
from medallion_assets_tests.deployments import beeline, standalone_cluster, thrift_server
from medallion_assets_tests.pipeline_runner import assert_the_first_minute_is_explained
from medallion_assets_tests.postgres import jdbc_jar, postgres_bin, postgres_cluster
from medallion_assets_tests.delta.readers import read_with_deltalake
from medallion_assets_tests.test_end_to_end import (
    SEED,
    TPCH_GOLD,
    _duckdb_tpch_answers,
    assert_gold_matches_duckdb,
    assert_history_is_closed,
    assert_silver_matches_contract,
    landed_lines,
)
from medallion_assets_tests.test_engines import (NO_DELTA_SPARK, _delta_spark_jars, delta_spark_jars_from_maven,
                                                 delta_spark_source)

pytestmark = pytest.mark.slow

SCALE_FACTOR = 0.01
#: (engine, deployment) per run: both switches, and delta-spark on a cluster once in
#: the suite without a run of its own (the suite's time budget).
RUNS = (("delta-rs", "local"), ("delta-spark", "cluster"), ("delta-rs", "local"))


@pytest.mark.timeout(3000)  # three whole-graph runs, each in a process of its own
def test_runs_alternating_engines_lose_and_repeat_nothing(tmp_path):
    source = delta_spark_source()
    if source is None:
        pytest.skip(f"engine switch not tested: {NO_DELTA_SPARK}")
    if postgres_bin() is None or jdbc_jar() is None:
        pytest.skip("needs PostgreSQL's server and its JDBC driver (Debian: postgresql, libpostgresql-jdbc-java; "
                    ".ci/run installs the driver)")
    with postgres_cluster() as metastore:
        _alternate_engines_on_a_shared_metastore(tmp_path, source, metastore)


def _alternate_engines_on_a_shared_metastore(tmp_path: Path, source: dict[str, str], metastore) -> None:
    lake, home = tmp_path / "lake", tmp_path / "dagster_home"
    home.mkdir()
    catalog = {"MEDALLION_CATALOG": "hive", "MEDALLION_METASTORE_URL": metastore.jdbc_url,
               "MEDALLION_METASTORE_USER": metastore.user, "MEDALLION_METASTORE_PASSWORD": metastore.password,
               "MEDALLION_METASTORE_JARS": jdbc_jar()}
    batches = len(RUNS)
    for run, (engine, deployment) in enumerate(RUNS, start=1):
        env = dict(os.environ, MEDALLION_LAKE_ROOT=str(lake), DAGSTER_HOME=str(home),
                   MEDALLION_DELTA_ENGINE=engine, **source, **catalog)
        command = [sys.executable, "-m", "medallion_assets_tests.pipeline_runner", str(SCALE_FACTOR), str(batches), str(SEED)]
        with contextlib.ExitStack() as stack:
            if deployment == "cluster":
                (tmp_path / f"cluster-{run}").mkdir()
                master = stack.enter_context(standalone_cluster(tmp_path / f"cluster-{run}"))
                env.update(MEDALLION_DEPLOYMENT="cluster", SPARK_MASTER_URL=master, PYSPARK_PYTHON=sys.executable)
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, f"run {run} on {engine} ({deployment}) failed:\n{done.stderr[-6000:]}"
        if deployment == "cluster":  # the run's executors were the worker's: it kept a folder for the application
            assert list((tmp_path / f"cluster-{run}" / "work").glob("app-*")), f"run {run} started no executor"
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["engines"] and set(report["engines"].values()) == {engine}, report["engines"]
        assert report["failed_checks"] == [], f"run {run} on {engine}: {report['failed_checks']}"
        assert_the_first_minute_is_explained(report, engine=engine,
                                             deployment="cluster at spark://" if deployment == "cluster" else "embedded")
        assert_silver_matches_contract(lake)
        assert_gold_matches_duckdb(lake)
    assert_history_is_closed(lake)
    bronze = read_with_deltalake(lake / "bronze" / "orders_raw")
    per_file: dict[str, int] = {}
    for source in bronze.column("_source_file").to_pylist():
        name = Path(source.replace("file:", "")).name
        per_file[name] = per_file.get(name, 0) + 1
    assert per_file == landed_lines(sorted((lake / "landing" / "orders").glob("*.json")))
    # Silver took each increment in once: every rejected line is quarantined exactly once,
    # although each run read what the one before, on the other engine, had consumed.
    assert _quarantined_rejects(lake) == sorted(contract_reference.expected_reject_reasons(lake / "landing"))
    # The password reached the metastore and no log.
    assert metastore.password not in done.stderr + done.stdout

    _tables_by_name_from_every_client(tmp_path, lake, metastore,
                                      dict(os.environ, MEDALLION_LAKE_ROOT=str(lake), DAGSTER_HOME=str(home),
                                           MEDALLION_DELTA_ENGINE="delta-spark", **source, **catalog))


def _tables_by_name_from_every_client(tmp_path: Path, lake: Path, metastore, env: dict) -> None:
    q1 = _duckdb_tpch_answers(lake)[TPCH_GOLD["pricing_summary"]]
    expected = sorted((r["l_returnflag"], r["l_linestatus"], r["count_order"]) for r in q1)

    # Two runs at once: each reads gold.pricing_summary by name and registers a table of its own.
    command = [sys.executable, "-m", "medallion_assets_tests.metastore_clients", "run"]
    runs = {name: subprocess.Popen([*command, name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("run_a", "run_b")}
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"concurrent run {name} failed:\n{err[-6000:]}"
        report = json.loads(out.strip().splitlines()[-1])
        assert report["table_name"] == f"spark_catalog.gold.{name}"
        assert [tuple(row) for row in report["rows"]] == expected

    # Spark's Thrift JDBC server: the metastore's settings and delta-spark, nothing of this
    # project, as a plain PySpark session or a BI tool would have; asked through beeline.
    settings = {
        # As jar files (Maven's, where the tests use Maven): the server opens each JDBC session's
        # catalog with the JVM's class path, which spark.jars.packages does not reach.
        **plan_engine("delta-spark", jars=_delta_spark_jars() or delta_spark_jars_from_maven()).spark_config,
        **LakeCatalog(
            kind="hive", metastore_url=metastore.jdbc_url, metastore_user=metastore.user,
            metastore_password=metastore.password, metastore_jars=jdbc_jar(),
            warehouse_dir=str(tmp_path / "warehouse"),
        ).spark_config(),
    }
    query = " UNION ALL ".join(
        f"SELECT '{table}' AS source, l_returnflag, l_linestatus, count_order FROM gold.{table}"
        for table in ("pricing_summary", "run_a", "run_b")
    )
    with thrift_server(tmp_path, spark_config=settings) as url:
        answered = beeline(url, query)
    for table in ("pricing_summary", "run_a", "run_b"):
        rows = [r for r in answered if r["source"] == table]
        assert sorted((r["l_returnflag"], r["l_linestatus"], int(r["count_order"])) for r in rows) == expected, table


def _quarantined_rejects(lake: Path) -> list[tuple[str, str]]:
    """``(file relative to landing, reason)`` of the quarantined lines the parsers rejected."""
    parse_reasons = {reason for _, reason in contract_reference.expected_reject_reasons(lake / "landing")}
    found = []
    for table in ("orders", "customers"):
        for row in read_with_deltalake(lake / "quarantine" / table).to_pylist():
            if row["reason"] in parse_reasons:
                match = re.search(r"((orders|customers)/[^/]+)$", row["_source_file"] or "")
                found.append((match.group(1) if match else str(row["_source_file"]), row["reason"]))
    return sorted(found)
