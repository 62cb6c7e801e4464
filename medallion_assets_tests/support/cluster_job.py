"""The driver of the multi-host test (test_cluster_hosts.py): a delta-spark job through the project's resources.

``python -m medallion_assets_tests.support.cluster_job <table URI> write|merge``, run on the
driver's host with the project's settings in its environment (``MEDALLION_DEPLOYMENT=cluster``,
``SPARK_MASTER_URL``, an ``s3://`` ``MEDALLION_LAKE_ROOT``...). The session comes from
``resources_for(settings)``, as a Dagster run's would; the table is written by
:class:`~medallion_assets.storage.client.DeltaTableClient`, as the IO manager writes.

``write`` overwrites the table with :data:`ROWS` rows (``value`` ``v0-<id>``), then merges
:func:`merge_source` into it; ``merge`` merges only (the rerun after a clean failure). Every
task of the merge's source pauses :data:`PAUSE_MS` on its first row, so the test can see
tasks running on both workers and kill one of them while the merge runs.

Progress goes to standard output as lines ``cluster-job {json}``: ``session`` (the
application's id and web UI), ``executors`` (once :data:`EXECUTORS` are registered),
``written``, ``merging``, ``merged`` (the table's version), ``failed`` (the error's class
and first line) and, last, ``executors-seen`` (every executor the application had, from
its REST API, the dead included).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from medallion_assets.definitions import resources_for
from medallion_assets.settings import read_settings
from medallion_assets.storage.client import DeltaTableClient
from medallion_assets.storage.write_spec import WriteSpec

#: Rows of the table before the merge (ids 0..ROWS-1).
ROWS = 2000
#: The merge's source: ids ROWS/2..ROWS*3/2-1, half updates, half inserts, in this many partitions (tasks).
SOURCE_PARTITIONS = 8
#: How long each source task pauses on its first row.
PAUSE_MS = 3000
#: Executors the job waits for before it writes (one per worker).
EXECUTORS = 2
#: The line prefix of progress events.
EVENT = "cluster-job "


def emit(event: str, **facts) -> None:
    print(EVENT + json.dumps({"event": event, **facts}), flush=True)


def merge_source(spark: SparkSession) -> DataFrame:
    """Rows ``ROWS/2 .. ROWS*3/2 - 1`` with ``value`` ``v1-<id>``; each task's first row pauses
    :data:`PAUSE_MS` (``java_method``, which Spark never folds away: it is not deterministic)."""
    per_task = ROWS // SOURCE_PARTITIONS
    pause = F.expr(f"substr(java_method('java.lang.Thread', 'sleep', if(id % {per_task} = 0, {PAUSE_MS}L, 0L)), 1, 0)")
    rows = spark.range(ROWS // 2, ROWS * 3 // 2, 1, SOURCE_PARTITIONS)
    return rows.select("id", F.concat(F.lit("v1-"), F.col("id").cast("string"), pause).alias("value"))


def expected_rows() -> dict[int, str]:
    """The table after the write and the merge: ``{id: value}``."""
    rows = {i: f"v0-{i}" for i in range(ROWS)}
    rows.update({i: f"v1-{i}" for i in range(ROWS // 2, ROWS * 3 // 2)})
    return rows


def _wait_for_executors(spark: SparkSession, timeout: float = 240) -> list[str]:
    tracker = spark.sparkContext._jsc.sc().statusTracker()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        driver = spark.sparkContext.getConf().get("spark.driver.host")
        hosts = [info.host() for info in tracker.getExecutorInfos()]
        executors = [host for host in hosts if host != driver] if len(hosts) > EXECUTORS else []
        if len(executors) >= EXECUTORS:
            return executors
        time.sleep(0.5)
    raise TimeoutError(f"fewer than {EXECUTORS} executors registered in {timeout:.0f} s")


def _executors_seen(spark: SparkSession) -> list[dict]:
    context = spark.sparkContext
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/allexecutors"
    with urllib.request.urlopen(url, timeout=10) as response:
        return [
            {key: executor[key] for key in ("id", "hostPort", "isActive", "totalTasks", "failedTasks")}
            for executor in json.load(response)
        ]


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] not in ("write", "merge"):
        print("usage: python -m medallion_assets_tests.support.cluster_job <table URI> write|merge")
        return 2
    table, step = argv
    spark = resources_for(settings=read_settings())["spark"].process_config_and_initialize().spark_session
    failed = False
    try:
        emit("session", app=spark.sparkContext.applicationId, ui=spark.sparkContext.uiWebUrl)
        emit("executors", hosts=_wait_for_executors(spark))
        client = DeltaTableClient(spark)
        if step == "write":
            initial = spark.range(0, ROWS, 1, SOURCE_PARTITIONS)
            initial = initial.select("id", F.concat(F.lit("v0-"), F.col("id").cast("string")).alias("value"))
            client.write(initial, table, WriteSpec(mode="overwrite"))
            emit("written", version=client.latest_version(table))
        emit("merging")
        try:
            client.write(merge_source(spark), table, WriteSpec(mode="merge", merge_keys=("id",)))
            emit("merged", version=client.latest_version(table))
        except Exception as error:  # the outcome under test: a clean failure is reported, not raised
            failed = True
            emit("failed", error=type(error).__name__, message=str(error).splitlines()[0][:500])
        emit("executors-seen", executors=_executors_seen(spark))
    finally:
        spark.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
