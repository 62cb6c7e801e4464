"""MERGE runs in delta-rs on the driver: where does that stop scaling?

Run by hand (not a test):

    python benchmarks/merge_scaling.py --table-rows 2000000 --source-rows 10000 100000 1000000

Upserts sources of growing size (half updates, half inserts) into a table and
prints, per size, the MERGE time, the rows per second, and the driver
process's peak resident memory growth, next to a plain Spark append of the
same rows as the baseline.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from medallion_assets.delta import DeltaTable, enable_delta


def rows(spark: SparkSession, start: int, count: int):
    return spark.range(start, start + count).select(
        F.col("id").alias("k"),
        (F.col("id") % 1000).cast("decimal(15,2)").alias("amount"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        F.lit(1).cast("long").alias("seq"),
    )


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-rows", type=int, default=2_000_000)
    parser.add_argument("--source-rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[*]").appName("merge-scaling")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    enable_delta(spark)
    work = tempfile.mkdtemp(prefix="merge-bench-")
    print(f"\nMERGE into a {args.table_rows:,}-row table (half of each source updates, half inserts)\n")
    print("| source rows | MERGE s | rows/s | driver peak RSS growth MB | append of same rows s |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for size in args.source_rows:
        path = os.path.join(work, f"t{size}")
        rows(spark, 0, args.table_rows).write.format("delta").mode("overwrite").save(path)
        source = rows(spark, args.table_rows - size // 2, size).withColumn("seq", F.lit(2).cast("long")).cache()
        source.count()
        before = peak_rss_mb()
        start = time.perf_counter()
        (
            DeltaTable.forPath(spark, path).alias("t")
            .merge(source.alias("s"), "t.k = s.k")
            .whenMatchedUpdateAll(condition="s.seq > t.seq")
            .whenNotMatchedInsertAll()
            .execute()
        )
        merge_s = time.perf_counter() - start
        growth = peak_rss_mb() - before
        start = time.perf_counter()
        source.write.format("delta").mode("append").save(os.path.join(work, f"a{size}"))
        append_s = time.perf_counter() - start
        count = spark.read.format("delta").load(path).count()
        assert count == args.table_rows + size - size // 2, count
        print(f"| {size:,} | {merge_s:.1f} | {size / merge_s:,.0f} | {growth:,.0f} | {append_s:.1f} |")
        source.unpersist()
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
