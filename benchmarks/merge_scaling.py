"""MERGE on both Delta engines: time, and where the memory goes.

Run by hand (not a test), from the project root:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/merge_scaling.py --table-rows 2000000 --source-rows 100000 1000000 4000000 --repeat 3

Upserts sources of growing size (half updates, half inserts) into copies of
one table and prints, per engine and size, the MERGE time (wall, and CPU
seconds of the whole process tree, which other load on the machine does not
inflate; both include loading the table's snapshot, as a pipeline run does),
the rows per second, the memory the MERGE added, and a plain write of the same
rows as the baseline. Each engine runs in a child process of its own (one
Python process holds one SparkContext), its session built by the project's
``SparkResource`` as for an embedded ``local[*]`` deployment.

The two engines run MERGE in different places:

* delta-rs: the source is collected to the Python driver as Arrow
  (``toArrow()``) and delta-rs joins it with the table there;
* delta-spark: the MERGE is a Spark job on the executors. In local mode the
  executors live in the driver's JVM, so their memory shows in the JVM, never
  in the Python process.

Memory figures (``/proc``; Linux only), each the largest over the repeats:

* Python driver: peak resident memory of this Python process during the MERGE
  minus its resident memory just before (after ``gc`` and releasing Arrow's
  unused pool memory);
* JVM process: the same for the java process (driver and, in local mode,
  executors), after a ``System.gc()``. The JVM keeps heap it once grew, so a
  MERGE after a bigger one may show less;
* JVM heap: the peak heap use during the MERGE (sum of the heap pools' peaks)
  minus the live heap before; it includes garbage not yet collected, so it is
  bounded by the driver memory (4g) rather than by what the MERGE needs.

Nothing is written outside a temporary folder.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import tempfile
import time

import pyarrow as pa
from engine_runs import (
    LoadSampler,
    add_engine_arguments,
    build_session,
    describe_load,
    describe_session,
    jvm_pid,
    memory_kb,
    reset_peak_rss,
    run_benchmark,
    tree_cpu_seconds,
)
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

MB = 1024 * 1024


def rows(spark: SparkSession, start: int, count: int):
    return spark.range(start, start + count).select(
        F.col("id").alias("k"),
        (F.col("id") % 1000).cast("decimal(15,2)").alias("amount"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        F.lit(1).cast("long").alias("seq"),
    )


def upsert_source(spark: SparkSession, table_rows: int, size: int):
    """``size`` rows: the table's last ``size // 2`` keys (updates), then new keys (inserts); cached."""
    source = rows(spark, table_rows - size // 2, size).withColumn("seq", F.lit(2).cast("long")).cache()
    source.count()
    return source


def merge(table_class, spark: SparkSession, path: str, source) -> None:
    (
        table_class.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), "t.k = s.k")
        .whenMatchedUpdateAll(condition="s.seq > t.seq")
        .whenNotMatchedInsertAll()
        .execute()
    )


class MemoryProbe:
    """Memory a block adds: Python driver and JVM peak RSS growth, JVM heap peak over live heap."""

    def __init__(self, spark: SparkSession) -> None:
        self.jvm = spark.sparkContext._jvm
        self.pids = {"python": os.getpid(), "jvm": jvm_pid(spark)}
        self.rss_before: dict[str, int] = {}
        self.heap_before = 0

    def _heap_pools(self):
        return [
            pool
            for pool in self.jvm.java.lang.management.ManagementFactory.getMemoryPoolMXBeans()
            if pool.getType().toString() == "Heap memory"
        ]

    def start(self) -> None:
        gc.collect()
        pa.default_memory_pool().release_unused()
        self.jvm.java.lang.System.gc()
        for pool in self._heap_pools():
            pool.resetPeakUsage()
        self.heap_before = (
            self.jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getUsed()
        )
        for name, pid in self.pids.items():
            reset_peak_rss(pid)
            self.rss_before[name] = memory_kb(pid, "VmRSS")

    def stop(self) -> dict[str, float]:
        """Growth in bytes: ``python``, ``jvm`` (peak RSS) and ``heap`` (JVM heap peak)."""
        growth = {name: (memory_kb(pid, "VmHWM") - self.rss_before[name]) * 1024.0 for name, pid in self.pids.items()}
        growth["heap"] = float(sum(pool.getPeakUsage().getUsed() for pool in self._heap_pools()) - self.heap_before)
        return growth


def measure_size(spark: SparkSession, table_class, base_table: str, work: str, args, size: int) -> dict:
    """``--repeat`` MERGEs of ``size`` changed rows into copies of the base table."""
    seconds, cpu_seconds, append_seconds, memory = [], [], [], []
    probe = MemoryProbe(spark)
    for attempt in range(args.repeat):
        path, appended = os.path.join(work, f"t{size}-{attempt}"), os.path.join(work, f"a{size}-{attempt}")
        shutil.copytree(base_table, path)
        source = upsert_source(spark, args.table_rows, size)
        probe.start()
        cpu_start, start = tree_cpu_seconds(), time.perf_counter()
        merge(table_class, spark, path, source)
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(tree_cpu_seconds() - cpu_start)
        memory.append(probe.stop())
        start = time.perf_counter()
        source.write.format("delta").mode("append").save(appended)
        append_seconds.append(time.perf_counter() - start)
        check_merged(spark, path, args.table_rows, size)
        source.unpersist()
        shutil.rmtree(path, ignore_errors=True)
        shutil.rmtree(appended, ignore_errors=True)
    return {
        "size": size,
        "merge_s": statistics.median(seconds),
        "merge_cpu_s": statistics.median(cpu_seconds),
        "append_s": statistics.median(append_seconds),
        **{f"{name}_growth": max(m[name] for m in memory) for name in ("python", "jvm", "heap")},
    }


def check_merged(spark: SparkSession, path: str, table_rows: int, size: int) -> None:
    table = spark.read.format("delta").load(path)
    total, changed = table.select(F.count("*"), F.sum((F.col("seq") == 2).cast("long"))).first()
    if (total, changed) != (table_rows + size - size // 2, size):
        raise AssertionError(f"MERGE of {size:,} rows left {total:,} rows, {changed:,} changed")


def run_one_engine(args: argparse.Namespace) -> dict:
    """Measure one engine in this process; the figures as a JSON-ready dict."""
    spark, resource = build_session(args.engine, args.master, args.delta_spark_jars, f"merge-scaling-{args.engine}")
    table_class = resource.delta_engine_in_use.table_class()
    work = tempfile.mkdtemp(prefix="merge-bench-")
    try:
        with LoadSampler() as load:
            # An untimed small MERGE loads the classes and starts the Python workers.
            rows(spark, 0, 10_000).write.format("delta").mode("overwrite").save(os.path.join(work, "warm-up"))
            merge(table_class, spark, os.path.join(work, "warm-up"), upsert_source(spark, 10_000, 10_000))
            base_table = os.path.join(work, "base")
            rows(spark, 0, args.table_rows).write.format("delta").mode("overwrite").save(base_table)
            sizes = [measure_size(spark, table_class, base_table, work, args, size) for size in args.source_rows]
        return {
            "facts": describe_session(spark, args.engine),
            "table_rows": args.table_rows,
            "repeat": args.repeat,
            "sizes": sizes,
            "load": load.samples,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


def megabytes(growth: float) -> str:
    # /proc accounts resident memory lazily: a block that grew nothing can read a few KiB below zero.
    return f"{max(growth, 0) / MB:,.0f}"


def print_markdown(results: list[dict]) -> None:
    first = results[0]
    print(
        f"\nMERGE into a {first['table_rows']:,}-row table (half of each source updates, half inserts); "
        f"time: median of {first['repeat']}, memory: largest of {first['repeat']}\n"
    )
    for result in results:
        facts = result["facts"]
        print(
            f"* {facts['engine']}: {facts['delta']}; Spark {facts['spark']}, {facts['master']}, "
            f"{facts['cores']} cores, driver memory {facts['driver_memory']}; {describe_load(result['load'])}"
        )
    print(
        "\n| engine | source rows | MERGE s | rows/s | MERGE CPU s | Python driver peak RSS growth MB "
        "| bytes per source row "
        "| JVM peak RSS growth MB | JVM heap peak over live MB | write of the same rows s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for result in results:
        for s in result["sizes"]:
            print(
                f"| {result['facts']['engine']} | {s['size']:,} | {s['merge_s']:.1f} | {s['size'] / s['merge_s']:,.0f} "
                f"| {s['merge_cpu_s']:.1f} | {megabytes(s['python_growth'])} "
                f"| {max(s['python_growth'], 0) / s['size']:,.0f} "
                f"| {megabytes(s['jvm_growth'])} | {megabytes(s['heap_growth'])} | {s['append_s']:.1f} |"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-rows", type=int, default=2_000_000)
    parser.add_argument("--source-rows", type=int, nargs="+", default=[100_000, 1_000_000, 4_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    add_engine_arguments(parser)
    run_benchmark(parser, argv, os.path.abspath(__file__), run_one_engine, print_markdown)


if __name__ == "__main__":
    main()
