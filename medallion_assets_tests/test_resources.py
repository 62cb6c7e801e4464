"""Resources: validated at construction, lazy, paths resolved when used."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from medallion_assets.resources import LakeResource, SparkResource


def test_lake_layout(tmp_path):
    lake = LakeResource(root=str(tmp_path))
    assert lake.table_path(["silver", "orders"]) == str(tmp_path / "silver" / "orders")
    assert lake.checkpoint_dir("orders_raw") == str(tmp_path / "_checkpoints" / "orders_raw")
    assert lake.landing_folder("customers_cdc") == str(tmp_path / "landing" / "customers")
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


def test_spark_session_is_shared_and_delta_enabled(spark):
    resource = SparkResource(master="local[2]")
    assert resource.spark_session is spark  # getOrCreate: one JVM for the test session


_HEAP_OF_AN_EMBEDDED_SESSION = """
import json
from medallion_assets.resources import SparkResource

spark = SparkResource(delta_engine="delta-rs").spark_session
runtime = spark.sparkContext._jvm.java.lang.Runtime.getRuntime()
print(json.dumps({"conf": spark.conf.get("spark.driver.memory"), "max_heap": runtime.maxMemory(),
                  "max_result": spark.sparkContext.getConf().get("spark.driver.maxResultSize")}))
spark.stop()
"""


@pytest.mark.slow
def test_an_embedded_session_gets_a_driver_heap_sized_for_the_machine():
    # Its own process: this test session's JVM is already running with the suite's settings.
    import json
    import os
    import subprocess
    import sys

    from medallion_assets.resources import embedded_driver_memory

    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_DRIVER_MEMORY", "PYSPARK_SUBMIT_ARGS")}
    done = subprocess.run([sys.executable, "-c", _HEAP_OF_AN_EMBEDDED_SESSION], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    expected = embedded_driver_memory()
    assert report["conf"] == expected
    # The JVM really got it (its max heap is a little under -Xmx), not Spark's 1g default.
    assert report["max_heap"] > 0.85 * int(expected[:-1]) * 1024**3
    assert report["max_result"] == f"{max(int(expected[:-1]) // 2, 1)}g"
