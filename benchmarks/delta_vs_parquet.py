"""Write and read a few million rows through ``delta`` and through Spark's Parquet.

Run by hand (not a test):

    python benchmarks/delta_vs_parquet.py --rows 3000000 --repeat 3

Each write runs ``--repeat`` times and each read twice per repeat after an
untimed warm-up pass, alternating the formats so that load on the machine hits
them alike; the median times and the ratios against Parquet are printed as a
Markdown table for the README.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from medallion_assets.delta import enable_delta, read_delta


def make_frame(spark: SparkSession, rows: int):
    """TPC-H lineitem-like rows: keys, decimals, dates, short strings, comments."""
    return spark.range(rows, numPartitions=max(2, os.cpu_count() or 2)).select(
        F.col("id").alias("l_orderkey"),
        (F.col("id") % 200_000).alias("l_partkey"),
        (F.col("id") % 7).cast("int").alias("l_linenumber"),
        ((F.col("id") % 5000) / 100).cast("decimal(15,2)").alias("l_extendedprice"),
        ((F.col("id") % 11) / 100).cast("decimal(15,2)").alias("l_discount"),
        F.date_add(F.lit("1992-01-01").cast("date"), (F.col("id") % 2500).cast("int")).alias("l_shipdate"),
        F.element_at(F.array(*[F.lit(m) for m in ("AIR", "MAIL", "SHIP", "TRUCK", "RAIL")]), (F.col("id") % 5 + 1).cast("int")).alias("l_shipmode"),
        F.concat(F.lit("comment "), F.sha1(F.col("id").cast("string")).substr(1, 20)).alias("l_comment"),
    )


def scan_all(df) -> int:
    # Touch every column so that column pruning cannot skip work.
    return df.select(F.sum(F.hash(*df.columns))).first()[0]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(args.master)
        .appName("delta-vs-parquet")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    enable_delta(spark)
    work = tempfile.mkdtemp(prefix="delta-bench-")
    source = make_frame(spark, args.rows).cache()
    source.count()

    parquet_path, delta_path = os.path.join(work, "parquet"), os.path.join(work, "delta")
    times: dict[str, list[float]] = {k: [] for k in ("parquet write", "delta write", "parquet read", "delta toDF read", "delta format read")}
    for _ in range(args.repeat):
        for path in (parquet_path, delta_path):
            shutil.rmtree(path, ignore_errors=True)
        times["parquet write"].append(timed(lambda: source.write.mode("overwrite").parquet(parquet_path)))
        times["delta write"].append(timed(lambda: source.write.format("delta").mode("overwrite").save(delta_path)))
        # One untimed pass each warms the page cache and the JIT for all three readers alike.
        expected = scan_all(spark.read.parquet(parquet_path))
        assert scan_all(read_delta(spark, delta_path)) == expected, "the delta table does not hold the same rows"
        assert scan_all(spark.read.format("delta").load(delta_path)) == expected
        for _ in range(2):
            times["parquet read"].append(timed(lambda: scan_all(spark.read.parquet(parquet_path))))
            times["delta toDF read"].append(timed(lambda: scan_all(read_delta(spark, delta_path))))
            times["delta format read"].append(timed(lambda: scan_all(spark.read.format("delta").load(delta_path))))

    median = {k: statistics.median(v) for k, v in times.items()}
    print(f"\n{args.rows:,} rows, {args.repeat} runs each (median), {args.master}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}, Spark {spark.version}\n")
    print("| step | seconds | ratio to Parquet | target |")
    print("| --- | ---: | ---: | ---: |")
    rows = [
        ("parquet write", "parquet write", None),
        ("delta write", "parquet write", "1.25x (aim 1.1x)"),
        ("parquet read", "parquet read", None),
        ("delta toDF read", "parquet read", "1.15x"),
        ("delta format read", "parquet read", "1.6x"),
    ]
    for name, base, target in rows:
        ratio = median[name] / median[base]
        print(f"| {name} | {median[name]:.2f} | {ratio:.2f}x | {target or '-'} |")
    shutil.rmtree(work, ignore_errors=True)
    spark.stop()


if __name__ == "__main__":
    main()
