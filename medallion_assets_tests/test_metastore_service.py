"""The lake by name through a Hive metastore service: the pipeline registers, Trino and a plain PySpark read.

The deployment ``MEDALLION_CATALOG=hive`` with ``MEDALLION_METASTORE_URIS``: Hive's
standalone metastore service (Thrift, on 127.0.0.1) in front of a PostgreSQL that
asks for a password, with its schema made by Hive's ``schematool``
(``support/hive_metastore.py``). The project's process is given the service's URI and no
database setting at all: no JDBC URL, user, password or driver. One whole-graph
run of the TPC-H pipeline on delta-spark registers the lake's tables through the
service. Then two readers that know nothing of this project read the four gold
tables by name and get DuckDB's TPC-H answers over the silver tables:

* Trino 476 (``support/trino_server.py``), its Delta Lake connector reading the
  service's entries (``lake.gold.pricing_summary``);
* a plain PySpark session whose only catalog setting is the service's URI,
  handed over in a properties file.

Both read their configuration from docs/catalog.md (Trino's catalog file and
``by-name.conf``), changing only the service's address and the jars' folder.

All along no process's command line (``ps -eo args``, every half second) holds
the database password, and neither does any output, log or file of the run but
the service's own ``metastore-site.xml``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from xml.etree import ElementTree

import pytest

from medallion_assets_tests.support.delta_spark import NO_DELTA_SPARK, delta_spark_jar_folder, delta_spark_source
from medallion_assets_tests.support.deployments import CATALOG_PAGE, documented_metastore_conf, page_blocks
from medallion_assets_tests.support.hive_metastore import metastore_jars, metastore_service
from medallion_assets_tests.support.pipeline_checks import (
    SEED,
    TPCH_GOLD,
    assert_gold_matches_duckdb,
    assert_same_rows,
    duckdb_tpch_answers,
)
from medallion_assets_tests.support.pipeline_runner import pipeline_command
from medallion_assets_tests.support.postgres import jdbc_jar, postgres_bin, postgres_cluster
from medallion_assets_tests.support.processes import process_list_watch
from medallion_assets_tests.support.trino_server import CATALOG, query, trino_home, trino_java, trino_server

pytestmark = pytest.mark.slow

SCALE_FACTOR = 0.01
#: The variables that would have the project's process open the metastore's database itself.
DATABASE_VARIABLES = (
    "MEDALLION_METASTORE_URL",
    "MEDALLION_METASTORE_USER",
    "MEDALLION_METASTORE_PASSWORD",
    "MEDALLION_METASTORE_DRIVER",
    "MEDALLION_METASTORE_JARS",
)

# A PySpark session that never imports this project: its catalog comes from the properties file
# of PYSPARK_SUBMIT_ARGS. Prints each table's rows as JSON (decimals and dates as text).
_PLAIN_PYSPARK = """
import json, sys
from pyspark.sql import SparkSession

spark = SparkSession.builder.master("local[2]").getOrCreate()
out = {}
for table in sys.argv[1:]:
    out[table] = [row.asDict() for row in spark.table(f"gold.{table}").collect()]
print(json.dumps(out, default=str))
"""


@pytest.mark.timeout(2400)  # a whole-graph run, the metastore service, Trino and a second Spark
def test_trino_and_plain_pyspark_read_gold_by_name_through_the_metastore_service(tmp_path):
    source = delta_spark_source()
    if source is None:
        pytest.skip(f"metastore service not tested: {NO_DELTA_SPARK}")
    if postgres_bin() is None or jdbc_jar() is None:
        pytest.skip("needs PostgreSQL's server and its JDBC driver (Debian: postgresql, libpostgresql-jdbc-java)")
    jars, why_not = metastore_jars()
    if jars is None:
        pytest.skip(f"Hive's metastore service is not available: {why_not}")
    java, why_not = trino_java()
    if java is None:
        pytest.skip(why_not)
    home, why_not = trino_home()
    if home is None:
        pytest.skip(f"Trino is not available: {why_not}")

    timings: dict[str, float] = {}
    with (
        postgres_cluster() as database,
        process_list_watch(database.password) as command_lines,
    ):
        started = time.monotonic()
        with metastore_service(
            database, tmp_path / "metastore", jdbc_jar=jdbc_jar(), jars=jars, site=documented_metastore_site()
        ) as service:
            timings["metastore service"] = time.monotonic() - started
            outputs = _read_by_name_through(service.uris, tmp_path, source, home, java, database, timings)
        outputs["metastore log"] = service.log.read_text(errors="replace")
    print(f"timings (s): { {step: round(seconds) for step, seconds in timings.items()} }")

    # The service opened the database with the password (it answered); nothing else had it.
    assert command_lines == [], command_lines
    assert not [name for name, text in outputs.items() if database.password in text]
    holding = [
        str(path)
        for path in tmp_path.rglob("*")
        if path.is_file() and path.name != "metastore-site.xml" and database.password.encode() in path.read_bytes()
    ]
    assert holding == [], holding
    assert (tmp_path / "metastore" / "conf" / "metastore-site.xml").stat().st_mode & 0o077 == 0


def _read_by_name_through(
    uris: str, tmp_path: Path, source: dict, home: Path, java: str, database, timings: dict
) -> dict[str, str]:
    """The pipeline's run registering through the service at ``uris``, then Trino and a plain PySpark reading
    gold by name; returns every output for the password check."""
    lake, dagster_home = tmp_path / "lake", tmp_path / "dagster_home"
    dagster_home.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in DATABASE_VARIABLES}
    env.update(
        MEDALLION_LAKE_ROOT=str(lake),
        DAGSTER_HOME=str(dagster_home),
        MEDALLION_DELTA_ENGINE="delta-spark",
        MEDALLION_CATALOG="hive",
        MEDALLION_METASTORE_URIS=uris,
        **source,
    )
    started = time.monotonic()
    command = pipeline_command(SCALE_FACTOR, 1, SEED)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1500)
    timings["pipeline run"] = time.monotonic() - started
    outputs = {"pipeline run": done.stdout + done.stderr}
    assert done.returncode == 0, f"the run failed:\n{done.stderr[-6000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["engines"] and set(report["engines"].values()) == {"delta-spark"}, report["engines"]
    assert report["failed_checks"] == [], report["failed_checks"]
    assert_gold_matches_duckdb(lake)

    # Each gold table has one entry in the metastore's database, at its folder.
    entries = database.query(
        'SELECT t."TBL_NAME", p."PARAM_VALUE" FROM "TBLS" t JOIN "DBS" d ON t."DB_ID" = d."DB_ID" '
        'JOIN "SERDE_PARAMS" p ON p."SERDE_ID" = (SELECT s."SERDE_ID" FROM "SDS" s WHERE s."SD_ID" = t."SD_ID") '
        "WHERE d.\"NAME\" = 'gold' AND p.\"PARAM_KEY\" = 'path'"
    )
    located = dict(entries)
    for table in TPCH_GOLD:
        assert located.get(table) == f"file:{lake / 'gold' / table}", (table, located)

    answers = duckdb_tpch_answers(lake)
    started = time.monotonic()
    with trino_server(tmp_path / "trino", catalog=documented_trino_catalog(uris), home=home, java=java) as url:
        timings["trino start"] = time.monotonic() - started
        started = time.monotonic()
        for table, number in TPCH_GOLD.items():
            rows = query(url, f"SELECT * FROM {CATALOG}.gold.{table}")
            assert_same_rows(rows, answers[number], f"Trino's {CATALOG}.gold.{table} vs TPC-H Q{number}")
        timings["trino queries"] = time.monotonic() - started
    outputs["trino log"] = (tmp_path / "trino" / "trino.log").read_text(errors="replace")

    # A plain PySpark session: the service's URI and delta-spark, in the page's properties file.
    conf = tmp_path / "by-name.conf"
    conf.write_text(
        documented_metastore_conf(
            name="by-name.conf",
            values={"spark.hadoop.hive.metastore.uris": uris},
            class_path={"/opt/delta-spark/*": delta_spark_jar_folder(tmp_path)},
        )
    )
    started = time.monotonic()
    plain_env = {key: value for key, value in env.items() if not key.startswith(("MEDALLION_", "DELTA_SPARK"))}
    plain_env["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {conf} pyspark-shell"
    read = subprocess.run(
        [sys.executable, "-c", _PLAIN_PYSPARK, *TPCH_GOLD],
        env=plain_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    timings["plain pyspark"] = time.monotonic() - started
    outputs["plain pyspark"] = read.stdout + read.stderr
    assert read.returncode == 0, f"the plain PySpark session failed:\n{read.stderr[-6000:]}"
    tables = json.loads(read.stdout.strip().splitlines()[-1])
    for table, number in TPCH_GOLD.items():
        example = answers[number][0]
        got = [{column: _like(value, example.get(column)) for column, value in row.items()} for row in tables[table]]
        assert_same_rows(got, answers[number], f"plain PySpark's gold.{table} vs TPC-H Q{number}")
    return outputs


def documented_metastore_site() -> dict[str, str]:
    """docs/catalog.md's ``metastore-site.xml``, as settings (the fixture puts this machine's database, port
    and warehouse folder in place of the page's).

    Raises:
        AssertionError: the page has no such file, or it lacks a setting the fixture replaces.
    """
    [block] = [b for b in page_blocks(CATALOG_PAGE, "xml") if b.startswith("<!-- conf/metastore-site.xml -->")]
    settings = {
        prop.findtext("name"): prop.findtext("value") for prop in ElementTree.fromstring(block).iter("property")
    }
    replaced = {"javax.jdo.option.ConnectionURL", "javax.jdo.option.ConnectionPassword", "metastore.thrift.port"}
    assert replaced <= set(settings), sorted(settings)
    return settings


def documented_trino_catalog(uris: str) -> str:
    """docs/catalog.md's Trino catalog file, its metastore the service at ``uris`` (Trino takes one URI).

    Raises:
        AssertionError: the page has no such file or it names no metastore (the test must follow the page).
    """
    [block] = [b for b in page_blocks(CATALOG_PAGE, "properties") if b.startswith("# etc/catalog/lake.properties\n")]
    assert "\nhive.metastore.uri=" in block, block
    return re.sub(r"^hive\.metastore\.uri=.*$", f"hive.metastore.uri={uris.split(',')[0]}", block, flags=re.MULTILINE)


def _like(value, example):
    """A value the plain session printed as JSON (decimals and dates as text) in the type of DuckDB's answer."""
    if value is None or example is None:
        return value
    if isinstance(example, Decimal):
        return Decimal(str(value))
    if isinstance(example, datetime.date):
        return datetime.date.fromisoformat(value)
    return type(example)(value)
