"""The engine choice, and the tests marked ``both_engines`` on the other engine.

One Python process holds one SparkContext, so the second engine's tests run in
a test session of their own: a ``pytest -m both_engines`` subprocess with
``MEDALLION_TEST_ENGINE`` set to the other engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from medallion_assets.storage.session import DELTA_SPARK_SESSION_CONFIG, plan_engine
from medallion_assets_tests.support.delta_spark import NO_DELTA_SPARK, delta_spark_source
from medallion_assets_tests.support.timing import DURATIONS_OUT_VARIABLE, NESTED_SESSION_PROPERTY

REPO = Path(__file__).resolve().parent.parent
#: Set (to anything): every slow test also runs on the other engine and every deployment on both.
EVERY_ENGINE_VARIABLE = "MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE"


def test_auto_without_jars_plans_the_delta_rs_engine():
    plan = plan_engine("auto")
    assert plan.source is None and plan.spark_config == {}
    assert "DELTA_SPARK_JARS" in plan.reason


def test_jars_folder_plans_delta_spark(tmp_path):
    (tmp_path / "b.jar").write_bytes(b"")
    (tmp_path / "a.jar").write_bytes(b"")
    plan = plan_engine("auto", jars=str(tmp_path))
    assert plan.source == "jars"
    assert plan.spark_config["spark.jars"] == f"{tmp_path / 'a.jar'},{tmp_path / 'b.jar'}"
    for key, value in DELTA_SPARK_SESSION_CONFIG.items():
        assert plan.spark_config[key] == value


def test_bad_jar_locations_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no .jar"):
        plan_engine("auto", jars=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="missing.jar"):
        plan_engine("delta-spark", jars=str(tmp_path / "missing.jar"))
    with pytest.raises(ValueError, match="MEDALLION_DELTA_ENGINE"):
        plan_engine("delta-lake")  # type: ignore[arg-type]


def test_maven_true_fetches_without_probing_and_false_never_fetches():
    # Unset (None) probes Maven: test_settings.py covers that offline and against a local repository.
    plan = plan_engine("auto", maven=True, delta_version="9.9.9")
    assert plan.spark_config["spark.jars.packages"] == "io.delta:delta-spark_2.13:9.9.9"
    assert "spark.jars.packages" not in plan_engine("auto", maven=False).spark_config


def test_session_runs_the_engine_it_was_built_for(spark, delta_engine):
    from medallion_assets.storage.engines import engine_for

    assert engine_for(spark).name == delta_engine


@pytest.mark.slow
@pytest.mark.timeout(4800)  # a whole test session: its own tests keep their own timeouts
def test_both_engines_suite_on_the_other_engine(spark, delta_engine, tmp_path, record_property):
    # ``spark``: so the check after each test also covers this one's long subprocess run.
    other = "delta-spark" if delta_engine == "delta-rs" else "delta-rs"
    env = dict(os.environ, MEDALLION_TEST_ENGINE=other, MEDALLION_DELTA_ENGINE=other)
    if other == "delta-spark":
        source = delta_spark_source()
        if source is None:
            pytest.skip(f"delta-spark engine not tested: {NO_DELTA_SPARK}")
        env.update(source)
    durations = tmp_path / "durations.json"
    env[DURATIONS_OUT_VARIABLE] = str(durations)
    # One session: this one runs beside another test worker already (-n 0: no workers of its own).
    # -rfEs: the closing summary names each failed test with its message (and each skip with its
    # reason); the output's tail below is what the report keeps, and a failure's own section,
    # with the captured logs of its Dagster runs, can be longer than that tail.
    # The suite's time budget: the slow both_engines tests (kill tests, continuous mode, schema drift,
    # blocking checks, the adding-a-feed page: 13 of this session's 24 minutes) run on the other
    # engine only when asked for; its fast ones (IO manager, sensors, maintenance, catalog, encoding) always.
    selection = "both_engines" if os.environ.get(EVERY_ENGINE_VARIABLE) else "both_engines and not slow"
    command = [sys.executable, "-m", "pytest", "-m", selection, "-n", "0", "-p", "no:cacheprovider", "-q", "-rfEs"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=4700)
    summary = result.stdout[-12000:]
    print(summary)
    if durations.exists():  # the suite's closing report counts its modules under the engine's name
        record_property(NESTED_SESSION_PROPERTY, (other, json.loads(durations.read_text())))
    assert result.returncode == 0, f"the both_engines tests failed on {other}:\n{summary}\n{result.stderr[-4000:]}"


# A fresh clone's defaults in a process of its own: MEDALLION_DELTA_ENGINE unset (auto), no
# DELTA_SPARK_JARS, MEDALLION_DELTA_SPARK_MAVEN unset (probe). One table through the IO manager,
# written by the session's engine (arrow_write_max_rows=0: not by deltalake's small-write route).
_FRESH_CLONE = """
import json, sys
from dagster import asset, materialize
from medallion_assets.io_manager import DeltaIOManager, delta_table
from medallion_assets.resources import LakeResource, SparkResource

spark_resource = SparkResource(master="local[1]")
lake = LakeResource(root=sys.argv[1])

@asset(key=["silver", "fresh_clone"], metadata=delta_table(write_mode="overwrite"))
def fresh_clone(spark: SparkResource):
    return spark.spark_session.range(5).selectExpr("id", "id * 3 AS tripled")

result = materialize([fresh_clone], resources={
    "spark": spark_resource, "lake": lake,
    "io_manager": DeltaIOManager(spark=spark_resource, lake=lake, arrow_write_max_rows=0)})
written = result.asset_materializations_for_node("silver__fresh_clone")[0].metadata
session = spark_resource.spark_session
print(json.dumps({"success": result.success, "engine": written["delta/engine"].value,
                  "reason": spark_resource.delta_engine_in_use.reason,
                  "packages": session.conf.get("spark.jars.packages", ""),
                  "path": lake.table_path(["silver", "fresh_clone"])}))
session.stop()
"""


@pytest.mark.slow
def test_a_fresh_clone_on_auto_writes_with_delta_spark_from_maven(tmp_path):
    from deltalake import DeltaTable

    from medallion_assets.settings import VARIABLES
    from medallion_assets.storage.session import DELTA_SPARK_MAVEN_PACKAGE

    if os.environ.get("MEDALLION_DELTA_SPARK_MAVEN") != "true":
        pytest.skip("Maven not used by these tests (unreachable, or DELTA_SPARK_JARS names the jars)")
    env = {k: v for k, v in os.environ.items() if k not in {v.name for v in VARIABLES}}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_CLONE, str(tmp_path / "lake")],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    from importlib.metadata import version

    artifact = DELTA_SPARK_MAVEN_PACKAGE.format(version=version("delta-spark"))
    assert report["success"] and report["engine"] == "delta-spark", report
    assert (
        report["reason"].startswith(f"delta-spark {version('delta-spark')} from Maven (")
        and artifact in report["reason"]
    )
    assert report["packages"] == artifact  # no Kafka connector unless asked for (MEDALLION_KAFKA_MAVEN)
    # Read back by delta-rs: delta-spark's commit, with the rows the asset computed.
    table = DeltaTable(report["path"])
    assert (
        table.history(1)[0]["engineInfo"].startswith("Apache-Spark/")
        and "Delta-Lake/" in table.history(1)[0]["engineInfo"]
    )
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"]) == [
        {"id": i, "tripled": 3 * i} for i in range(5)
    ]
