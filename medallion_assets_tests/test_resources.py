"""Resources: validated at construction, lazy, paths resolved when used."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from medallion_assets.pipelines.tpch.feeds import CUSTOMERS_CDC
from medallion_assets.resources import (
    _JVM_OPTION_VARIABLES,
    LakeResource,
    SparkResource,
    default_java_options_set_elsewhere,
    embedded_driver_java_options,
    garbage_collector_chosen_elsewhere,
)


def test_lake_layout(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    assert lake.table_path(["silver", "orders"]) == str(tmp_path / "silver" / "orders")
    assert lake.checkpoint_dir("orders_raw") == str(tmp_path / "_checkpoints" / "orders_raw")
    assert lake.landing_folder(CUSTOMERS_CDC) == str(tmp_path / "landing" / "customers")
    with pytest.raises(ValueError):
        lake.table_path(["orders"])


def test_lake_lists_table_folders(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    assert lake.table_paths("gold") == []  # no layer folder yet
    for name in ("orders", "lineitem"):
        (tmp_path / "silver" / name / "_delta_log").mkdir(parents=True)
    (tmp_path / "silver" / "README").write_text("not a table")
    assert lake.table_paths("silver") == [str(tmp_path / "silver" / "lineitem"), str(tmp_path / "silver" / "orders")]


def test_lake_root_must_not_be_blank():
    with pytest.raises(ValidationError):
        LakeResource(root="  ")


def test_spark_needs_master_or_remote():
    with pytest.raises(ValidationError):
        SparkResource(master=None, remote=None)


def test_an_embedded_session_leaves_a_garbage_collector_chosen_elsewhere(tmp_path, monkeypatch):
    # The JVM refuses to start with two collectors, so the resource adds its own only when none is chosen.
    for name in (*_JVM_OPTION_VARIABLES, "SPARK_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert garbage_collector_chosen_elsewhere({}) is None
    assert garbage_collector_chosen_elsewhere({"spark.driver.extraJavaOptions": "-Xss4m -XX:+UseG1GC"}) == (
        "the session setting spark.driver.extraJavaOptions"
    )
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:+UseZGC")
    assert garbage_collector_chosen_elsewhere({}) == "the environment variable JAVA_TOOL_OPTIONS"
    monkeypatch.delenv("JAVA_TOOL_OPTIONS")
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.executor.extraJavaOptions -XX:+UseG1GC\nspark.driver.extraJavaOptions -XX:+UseSerialGC\n"
    )
    assert garbage_collector_chosen_elsewhere({}) == str(tmp_path / "spark-defaults.conf")
    # The JIT's thresholds do not depend on it: only the collector is left out.
    options = embedded_driver_java_options({})
    assert "-XX:Tier4InvocationThreshold=20000" in options and "GC" not in options
    (tmp_path / "spark-defaults.conf").unlink()
    assert embedded_driver_java_options({}).split()[0] == "-XX:+UseParallelGC"


def test_an_embedded_session_keeps_default_java_options_set_elsewhere(tmp_path, monkeypatch):
    # The session's own spark.driver.defaultJavaOptions would replace the user's, flags and all.
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert default_java_options_set_elsewhere({}) is None
    assert default_java_options_set_elsewhere({"spark.driver.defaultJavaOptions": "-Xss4m"}) == (
        "the session setting spark.driver.defaultJavaOptions"
    )
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Xss4m\n")
    assert default_java_options_set_elsewhere({}) is None
    (tmp_path / "spark-defaults.conf").write_text("spark.driver.defaultJavaOptions=-Xss4m\n")
    assert default_java_options_set_elsewhere({}) == str(tmp_path / "spark-defaults.conf")
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.driver.defaultJavaOptions=-Xss4m pyspark-shell")
    assert default_java_options_set_elsewhere({}) == "the environment variable PYSPARK_SUBMIT_ARGS"


def test_spark_session_is_shared_and_delta_enabled(spark):
    resource = SparkResource(master="local[2]")
    assert resource.spark_session is spark  # getOrCreate: one JVM for the test session


_SIZING_OF_AN_EMBEDDED_SESSION = """
import json, os, sys, tempfile
import pyarrow as pa
from deltalake import write_deltalake
from medallion_assets.resources import SparkResource

resource = SparkResource(
    master="local[2]", delta_engine=sys.argv[1], delta_spark_jars=os.environ.get("DELTA_SPARK_JARS")
)
spark = resource.spark_session
runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
management = spark.sparkContext._jvm.java.lang.management.ManagementFactory
report = {"conf": spark.conf.get("spark.driver.memory"), "max_heap": runtime.maxMemory(),
          "max_result": spark.sparkContext.getConf().get("spark.driver.maxResultSize"),
          "collectors": [bean.getName() for bean in management.getGarbageCollectorMXBeans()]}
hotspot = management.getPlatformMXBean(spark.sparkContext._jvm.java.lang.Class.forName(
    "com.sun.management.HotSpotDiagnosticMXBean"))
report["c2_calls"] = hotspot.getVMOption("Tier4InvocationThreshold").getValue()
engine = resource.delta_engine_in_use
report["engine"] = [engine.name, engine.reason]
if engine.name == "delta-spark":
    # A table of three versions written by delta-rs, vacuumed by the engine: the tasks of each stage it ran.
    path = tempfile.mkdtemp() + "/table"
    for start in range(3):
        write_deltalake(path, pa.table({"id": [start]}), mode="append")
    spark.sparkContext.setJobGroup("vacuum", "vacuum")
    engine.vacuum(spark, path, retention_hours=168)
    tracker = spark.sparkContext.statusTracker()
    stages = [stage for job in tracker.getJobIdsForGroup("vacuum") for stage in tracker.getJobInfo(job).stageIds]
    report["vacuum_tasks"] = [tracker.getStageInfo(stage).numTasks for stage in stages]
print(json.dumps(report))
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_an_embedded_session_is_sized_for_the_machine(engine):
    # Its own process: this test session's JVM is already running with the suite's settings.
    import json
    import os
    import subprocess
    import sys

    from medallion_assets.resources import embedded_driver_memory
    from medallion_assets_tests.support.delta_spark import delta_spark_jars_from_env, delta_spark_jars_from_maven

    env = {
        k: v for k, v in os.environ.items() if k not in ("SPARK_DRIVER_MEMORY", "PYSPARK_SUBMIT_ARGS", "SPARK_CONF_DIR")
    }
    if engine == "delta-spark":
        # The suite's one session on DELTA_SPARK_JARS (the air-gapped route): the named jars, or
        # else delta-spark's jars as Maven delivered them to this test session.
        jars = delta_spark_jars_from_env() or delta_spark_jars_from_maven()
        if jars is None:
            pytest.skip("no delta-spark jars: DELTA_SPARK_JARS names none and Maven is not used")
        env["DELTA_SPARK_JARS"] = jars
    done = subprocess.run(
        [sys.executable, "-c", _SIZING_OF_AN_EMBEDDED_SESSION, engine],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    expected = embedded_driver_memory()
    assert report["conf"] == expected
    # The JVM really got it (its max heap is a little under -Xmx), not Spark's 1g default.
    assert report["max_heap"] > 0.85 * int(expected[:-1]) * 1024**3
    assert report["max_result"] == f"{max(int(expected[:-1]) // 2, 1)}g"
    # The parallel collector, not the JDK's G1 ("G1 Young Generation", ...): the JVM really runs it.
    assert sorted(report["collectors"]) == ["PS MarkSweep", "PS Scavenge"], report["collectors"]
    # The optimizing JIT waits for four times the JDK's default 5000 calls.
    assert report["c2_calls"] == "20000"
    if engine == "delta-spark":
        # From the jars DELTA_SPARK_JARS named, not from Maven.
        assert report["engine"][0] == "delta-spark" and "jars of DELTA_SPARK_JARS" in report["engine"][1], report[
            "engine"
        ]
        # Delta's cluster-sized defaults, 50 tasks per snapshot and 10000 per VACUUM listing
        # (a 5-row table's VACUUM took 28.6 s with them, 2.4 s without), are lowered to the session's cores.
        assert report["vacuum_tasks"] and max(report["vacuum_tasks"]) < 50, str(report["vacuum_tasks"])
