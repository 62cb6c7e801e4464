"""A streaming write in a process of its own, for tests that kill it.

Run as ``python -m medallion_assets_tests.support.stream_job SOURCE TABLE CHECKPOINT``:
reads the JSON files under SOURCE (``id`` long, ``name`` string), one file per
micro-batch, and writes them to the Delta table with ``availableNow``. Tests
kill it from outside at points they see on disk (:mod:`medallion_assets_tests.support.kill_points`).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    source, table, checkpoint = argv
    from pyspark.sql import SparkSession

    from medallion_assets.delta import enable_delta

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("stream-job")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    enable_delta(spark)
    frame = spark.readStream.schema("id long, name string").option("maxFilesPerTrigger", "1").json(source)
    query = (
        frame.writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(table)
    )
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
