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

The runs share a Hive metastore on a real PostgreSQL that asks for a password
(``MEDALLION_CATALOG=hive``): the delta-spark run registers the lake's tables
(its tombstones tables too); then two runs at once read ``gold.pricing_summary``
by name and register a table each; Spark's Thrift server, started exactly as
docs/catalog.md says (its ``metastore.conf`` and commands, read from the page),
sets a property and a comment on one entry and reads the three tables by name
through the page's ``beeline`` command, with DuckDB's TPC-H answer; a second
write of that table keeps its entry (the same ``TBL_ID`` in PostgreSQL, read
with psql, and the property). All along, no process's command line, no log,
no Spark event log and nothing in Dagster's storage holds the password.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from medallion_assets_tests.support import contract_reference
from medallion_assets_tests.support.delta_spark import NO_DELTA_SPARK, delta_spark_jar_folder, delta_spark_source
from medallion_assets_tests.support.deployments import (
    documented_metastore_conf,
    documented_thrift_server,
    spark_conf_with_event_logs,
    standalone_cluster,
)
from medallion_assets_tests.support.pipeline_checks import (
    SEED,
    TPCH_GOLD,
    assert_gold_matches_duckdb,
    assert_history_is_closed,
    assert_silver_matches_contract,
    duckdb_tpch_answers,
    landed_lines,
)
from medallion_assets_tests.support.pipeline_runner import assert_the_first_minute_is_explained, pipeline_command
from medallion_assets_tests.support.postgres import jdbc_jar, postgres_bin, postgres_cluster
from medallion_assets_tests.support.processes import process_list_watch
from medallion_assets_tests.support.readers import read_with_deltalake

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
        pytest.skip(
            "needs PostgreSQL's server and its JDBC driver (Debian: postgresql, libpostgresql-jdbc-java; "
            ".ci/run installs the driver)"
        )
    with postgres_cluster() as metastore, process_list_watch(metastore.password) as command_lines:
        outputs = _alternate_engines_on_a_shared_metastore(tmp_path, source, metastore)
    # The password reached the metastore (every session above opened it) and nothing else.
    assert command_lines == [], command_lines
    assert not [name for name, text in outputs.items() if metastore.password in text]
    assert list((tmp_path / "events").iterdir()), "no Spark event log was written"
    holding = [
        str(path)
        for path in [*tmp_path.rglob("*"), *Path(outputs["dagster_home"]).rglob("*")]
        if path.is_file() and path.name != "metastore.conf" and metastore.password.encode() in path.read_bytes()
    ]
    assert holding == [], holding


def _entries(metastore) -> dict[str, str]:
    """``database.table`` -> ``TBL_ID`` of every entry of the metastore, read from its database."""
    rows = metastore.query(
        'SELECT d."NAME", t."TBL_NAME", t."TBL_ID" FROM "TBLS" t JOIN "DBS" d ON t."DB_ID" = d."DB_ID"'
    )
    return {f"{database}.{table}": table_id for database, table, table_id in rows}


def _alternate_engines_on_a_shared_metastore(tmp_path: Path, source: dict[str, str], metastore) -> dict[str, str]:
    """The runs; returns every run's output (and the Dagster home's folder) for the password check."""
    lake, home = tmp_path / "lake", tmp_path / "dagster_home"
    home.mkdir()
    catalog = {
        "MEDALLION_CATALOG": "hive",
        "MEDALLION_METASTORE_URL": metastore.jdbc_url,
        "MEDALLION_METASTORE_USER": metastore.user,
        "MEDALLION_METASTORE_PASSWORD": metastore.password,
        "MEDALLION_METASTORE_JARS": jdbc_jar(),
    }
    spark_conf = spark_conf_with_event_logs(tmp_path)
    outputs = {"dagster_home": str(home)}
    batches = len(RUNS)
    for run, (engine, deployment) in enumerate(RUNS, start=1):
        env = dict(
            os.environ,
            MEDALLION_LAKE_ROOT=str(lake),
            DAGSTER_HOME=str(home),
            SPARK_CONF_DIR=str(spark_conf),
            MEDALLION_DELTA_ENGINE=engine,
            **source,
            **catalog,
        )
        command = pipeline_command(SCALE_FACTOR, batches, SEED)
        with contextlib.ExitStack() as stack:
            if deployment == "cluster":
                (tmp_path / f"cluster-{run}").mkdir()
                master = stack.enter_context(standalone_cluster(tmp_path / f"cluster-{run}"))
                env.update(MEDALLION_DEPLOYMENT="cluster", SPARK_MASTER_URL=master, PYSPARK_PYTHON=sys.executable)
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, f"run {run} on {engine} ({deployment}) failed:\n{done.stderr[-6000:]}"
        outputs[f"run {run}"] = done.stdout + done.stderr
        if deployment == "cluster":  # the run's executors were the worker's: it kept a folder for the application
            assert list((tmp_path / f"cluster-{run}" / "work").glob("app-*")), f"run {run} started no executor"
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["engines"] and set(report["engines"].values()) == {engine}, report["engines"]
        assert report["failed_checks"] == [], f"run {run} on {engine}: {report['failed_checks']}"
        assert_the_first_minute_is_explained(
            report, engine=engine, deployment="cluster at spark://" if deployment == "cluster" else "embedded"
        )
        assert_silver_matches_contract(lake)
        assert_gold_matches_duckdb(lake)
        if engine == "delta-spark":
            _assert_every_table_registered_once(lake, metastore, home)
    assert_history_is_closed(lake)
    bronze = read_with_deltalake(lake / "bronze" / "orders_raw")
    per_file: dict[str, int] = {}
    for source_file in bronze.column("_source_file").to_pylist():
        name = Path(source_file.replace("file:", "")).name
        per_file[name] = per_file.get(name, 0) + 1
    assert per_file == landed_lines(sorted((lake / "landing" / "orders").glob("*.json")))
    # Silver took each increment in once: every rejected line is quarantined exactly once,
    # although each run read what the one before, on the other engine, had consumed.
    assert _quarantined_rejects(lake) == sorted(contract_reference.expected_reject_reasons(lake / "landing"))

    _tables_by_name_from_every_client(
        tmp_path,
        lake,
        metastore,
        outputs,
        dict(
            os.environ,
            MEDALLION_LAKE_ROOT=str(lake),
            DAGSTER_HOME=str(home),
            SPARK_CONF_DIR=str(spark_conf),
            MEDALLION_DELTA_ENGINE="delta-spark",
            **source,
            **catalog,
        ),
    )
    return outputs


def _assert_every_table_registered_once(lake: Path, metastore, home: Path) -> None:
    """Every Delta table of the lake, its tombstones too, has an entry; the run said so once per table."""
    from dagster import DagsterInstance

    tables = {
        f"{layer.name}.{table.name}"
        for layer in lake.iterdir()
        if layer.name in ("bronze", "silver", "gold", "quarantine")
        for table in layer.iterdir()
        if (table / "_delta_log").is_dir()
    }
    assert any(name.endswith("__tombstones") for name in tables), sorted(tables)
    assert tables <= set(_entries(metastore)), sorted(tables - set(_entries(metastore)))
    with DagsterInstance.from_config(str(home)) as instance:
        [newest] = instance.get_runs(limit=1)
        said = [event.user_message for event in instance.all_logs(newest.run_id) if "catalog: " in event.user_message]
    for table in tables:
        lines = [line for line in said if re.search(rf"catalog: (registered|updated) {re.escape(table)}\b", line)]
        assert len(lines) <= 1, lines
    assert any(line.startswith("catalog: registered gold.pricing_summary at file:") for line in said), said


def _tables_by_name_from_every_client(tmp_path: Path, lake: Path, metastore, outputs: dict, env: dict) -> None:
    q1 = duckdb_tpch_answers(lake)[TPCH_GOLD["pricing_summary"]]
    expected = sorted((r["l_returnflag"], r["l_linestatus"], r["count_order"]) for r in q1)

    # Two runs at once: each reads gold.pricing_summary by name and registers a table of its own.
    command = [sys.executable, "-m", "medallion_assets_tests.support.metastore_clients", "run"]
    runs = {
        name: subprocess.Popen([*command, name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("run_a", "run_b")
    }
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"concurrent run {name} failed:\n{err[-6000:]}"
        report = json.loads(out.strip().splitlines()[-1])
        assert report["table_name"] == f"spark_catalog.gold.{name}"
        assert [tuple(row) for row in report["rows"]] == expected

    # Spark's Thrift JDBC server, started as docs/catalog.md says with its metastore.conf: the
    # metastore's settings and delta-spark, nothing of this project, as a BI tool would have.
    conf = documented_metastore_conf(
        values={
            "spark.hadoop.javax.jdo.option.ConnectionURL": metastore.jdbc_url,
            "spark.hadoop.javax.jdo.option.ConnectionUserName": metastore.user,
            "spark.hadoop.javax.jdo.option.ConnectionPassword": metastore.password,
        },
        class_path={
            "/usr/share/java/postgresql.jar": jdbc_jar(),
            "/opt/delta-spark/*": delta_spark_jar_folder(tmp_path),
        },
    )
    (tmp_path / "thrift").mkdir()
    query = " UNION ALL ".join(
        f"SELECT '{table}' AS source, l_returnflag, l_linestatus, count_order FROM gold.{table}"
        for table in ("pricing_summary", "run_a", "run_b")
    )
    with documented_thrift_server(tmp_path / "thrift", conf) as (_, ask):
        asked = subprocess.run(
            ["bash", "-c", ask.replace("'SELECT * FROM gold.pricing_summary'", shlex.quote(query))],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ["PATH"]])},
        )
    outputs["beeline"] = asked.stdout + asked.stderr
    assert asked.returncode == 0, f"beeline failed:\n{asked.stdout[-2000:]}\n{asked.stderr[-4000:]}"
    answered = _table_rows(asked.stdout)
    for table in ("pricing_summary", "run_a", "run_b"):
        rows = [r for r in answered if r["source"] == table]
        assert sorted((r["l_returnflag"], r["l_linestatus"], int(r["count_order"])) for r in rows) == expected, table

    # A property of the entry itself, as another metastore client (Trino, Hive) sets one: delta-spark
    # keeps its own TBLPROPERTIES and comments in the table's log, not in the entry.
    ids = _entries(metastore)
    metastore.query(
        'INSERT INTO "TABLE_PARAMS" ("TBL_ID", "PARAM_KEY", "PARAM_VALUE") '
        f"VALUES ({ids['gold.run_a']}, 'team.owner', 'finance') RETURNING 1"
    )
    # A second write of gold.run_a, in a new process: the entry is kept, not made again.
    again = subprocess.run([*command, "run_a"], env=env, capture_output=True, text=True, timeout=600)
    outputs["run_a again"] = again.stdout + again.stderr
    assert again.returncode == 0, f"second run_a failed:\n{again.stderr[-6000:]}"
    assert _entries(metastore) == ids
    params = dict(
        metastore.query(f'SELECT "PARAM_KEY", "PARAM_VALUE" FROM "TABLE_PARAMS" WHERE "TBL_ID" = {ids["gold.run_a"]}')
    )
    assert params.get("team.owner") == "finance", params
    assert not re.search(r"catalog: (registered|updated) gold\.run_a", again.stderr), "the unchanged entry was touched"


def _table_rows(output: str) -> list[dict[str, str]]:
    """The rows of the last table beeline drew (``| a | b |`` lines under a header), as text by column name."""
    tables, current = [], None
    for line in output.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if current is None:
                current = {"header": cells, "rows": []}
                tables.append(current)
            else:
                current["rows"].append(dict(zip(current["header"], cells, strict=False)))
        elif not line.startswith("+"):
            current = None
    assert tables, f"beeline drew no table:\n{output[-2000:]}"
    return tables[-1]["rows"]


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
