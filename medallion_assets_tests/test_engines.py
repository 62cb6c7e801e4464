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

from medallion_assets.engine import DELTA_SPARK_SESSION_CONFIG, delta_spark_jar_files, plan_engine
from medallion_assets_tests.timing import DURATIONS_OUT_VARIABLE, NESTED_SESSION_PROPERTY

REPO = Path(__file__).resolve().parent.parent
#: Set (to anything): every slow test also runs on the other engine and every deployment on both.
EVERY_ENGINE_VARIABLE = "MEDALLION_TEST_EVERY_DEPLOYMENT_ENGINE"


def _delta_spark_jars() -> str | None:
    location = os.environ.get("DELTA_SPARK_JARS")
    if not location:
        return None
    try:
        delta_spark_jar_files(location)
    except FileNotFoundError:
        return None
    return location


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
    plan = plan_engine("auto", maven=True, delta_version="4.4.1")
    assert plan.spark_config["spark.jars.packages"] == "io.delta:delta-spark_2.13:4.4.1"
    assert "spark.jars.packages" not in plan_engine("auto", maven=False).spark_config


def test_session_runs_the_engine_it_was_built_for(spark, delta_engine):
    from medallion_assets.engine import engine_for

    assert engine_for(spark).name == delta_engine


@pytest.mark.slow
@pytest.mark.timeout(4800)  # a whole test session: its own tests keep their own timeouts
def test_both_engines_suite_on_the_other_engine(spark, delta_engine, tmp_path, record_property):
    # ``spark``: so the check after each test also covers this one's long subprocess run.
    other = "delta-spark" if delta_engine == "delta-rs" else "delta-rs"
    env = dict(os.environ, MEDALLION_TEST_ENGINE=other, MEDALLION_DELTA_ENGINE=other)
    if other == "delta-spark":
        jars = _delta_spark_jars()
        if jars is None:
            pytest.skip("delta-spark engine not tested: DELTA_SPARK_JARS does not name a folder of delta-spark jars")
        env["DELTA_SPARK_JARS"] = jars
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
