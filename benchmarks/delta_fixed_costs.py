"""What delta-spark pays per table version on a tiny table, against Spark's Parquet.

Run by hand (not a test), from the project root:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/delta_fixed_costs.py --repeat 5

At SF 0.1 most of a pipeline run's steps move a few thousand rows, so what
they cost is what every write and every first read of a new version costs
whatever the rows. This times those operations on a 5-row table in one
session built by the project's ``SparkResource`` (delta-spark, embedded),
each ``--repeat`` times after one untimed warm-up of each, and prints the
median wall seconds and the Spark jobs each ran (from the session's UI):

* a Parquet write and a Delta write of a new table;
* an overwrite of an existing Delta table, whose version the session has
  read, and one the session has not touched yet (as in a new run's process:
  the overwrite builds the state of the version it replaces);
* the first read of a version just written (a count by key, as a key check
  runs), and the same read again once delta-spark has built that version's
  snapshot; the same read of Parquet;
* an append of the same 5 rows to an existing table, and a commit without
  rows (what records a write's consumed versions), through the project's
  ``DeltaTableClient``: committed by delta-spark, and by deltalake as the IO
  manager commits small appends (``arrow_write_max_rows``); then the first
  read of the version deltalake appended, which delta-spark has not seen;
* a VACUUM (168 hours' retention, as the weekly maintenance job runs it),
  listing the table's folders with the session's
  ``spark.sql.sources.parallelPartitionDiscovery.parallelism`` (the resource
  sets it to the core count) and with Spark's default of 10000 tasks.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

from engine_runs import (
    LISTING_TASKS,
    SPARK_DEFAULT_LISTING_TASKS,
    LoadSampler,
    add_delta_spark_arguments,
    delta_spark_session,
    describe_load,
    describe_session,
    last_job_id,
    spark_jobs,
)
from pyspark.sql import functions as F

from medallion_assets.storage.client import DeltaTableClient
from medallion_assets.storage.write_spec import WriteSpec
from medallion_assets.storage.writers import WriterLimits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark or Delta setting for the session, to compare with its default (repeatable)",
    )
    add_delta_spark_arguments(parser)
    args = parser.parse_args(argv)
    settings = dict(setting.split("=", 1) for setting in args.conf)
    spark = delta_spark_session(
        parser, args, "delta-fixed-costs", extra_config={"spark.ui.enabled": "true", **settings}
    )
    work = tempfile.mkdtemp(prefix="delta-fixed-costs-")
    rows = spark.createDataFrame([(i, f"row {i}") for i in range(5)], "k long, name string").cache()
    rows.count()
    counter = iter(range(1_000_000))

    def key_count(frame) -> None:
        frame.groupBy("k").count().agg(F.sum("count")).first()

    def new_version() -> None:
        rows.write.format("delta").mode("overwrite").save(existing)

    def forget_snapshots() -> None:
        # What a new process finds: no table state built yet (delta-spark's internal cache).
        spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()

    def vacuum(listing_tasks: str | None) -> Callable[[], None]:
        def run() -> None:
            session_value = spark.conf.get(LISTING_TASKS)
            if listing_tasks:
                spark.conf.set(LISTING_TASKS, listing_tasks)
            try:
                spark.sql(f"VACUUM delta.`{vacuumed}` RETAIN 168 HOURS").collect()
            finally:
                spark.conf.set(LISTING_TASKS, session_value)

        return run

    def append(client: DeltaTableClient, *, empty: bool = False) -> Callable[[], None]:
        def run() -> None:
            frame = rows.limit(0) if empty else rows
            commit = (f"{client.writer_limits.max_rows}", next(counter)) if empty else None
            result = client.write(
                frame, appended, WriteSpec(mode="append"), commit_metadata={"round": "x"}, empty_commit=commit
            )
            assert result.by_deltalake == bool(client.writer_limits.max_rows), "the append took the other route"

        return run

    spark_appends = DeltaTableClient(spark)
    deltalake_appends = DeltaTableClient(spark, writer_limits=WriterLimits(max_rows=100_000))
    existing = f"{work}/existing"
    rows.write.format("delta").save(existing)
    appended = f"{work}/appended"
    rows.write.format("delta").save(appended)
    # A table of its own, so the VACUUMs do not touch the state the other operations read.
    vacuumed = f"{work}/vacuumed"
    for _ in range(3):
        rows.write.format("delta").mode("append").save(vacuumed)
    rows.write.parquet(f"{work}/parquet-read")
    operations: list[tuple[str, Callable[[], None] | None, Callable[[], None]]] = [
        ("Parquet: write a new table", None, lambda: rows.write.parquet(f"{work}/p{next(counter)}")),
        ("Delta: write a new table", None, lambda: rows.write.format("delta").save(f"{work}/d{next(counter)}")),
        ("Delta: overwrite a table whose version this session has read", None, new_version),
        ("Delta: overwrite a table this session has not touched", forget_snapshots, new_version),
        (
            "Delta: first read of a version just written",
            new_version,
            lambda: key_count(spark.read.format("delta").load(existing)),
        ),
        ("Delta: the same version read again", None, lambda: key_count(spark.read.format("delta").load(existing))),
        ("Parquet: the same read", None, lambda: key_count(spark.read.parquet(f"{work}/parquet-read"))),
        ("Delta: append 5 rows, committed by delta-spark", None, append(spark_appends)),
        ("Delta: append 5 rows, committed by deltalake", None, append(deltalake_appends)),
        (
            "Delta: first read of the version deltalake appended",
            append(deltalake_appends),
            lambda: key_count(spark.read.format("delta").load(appended)),
        ),
        ("Delta: commit without rows, by delta-spark", None, append(spark_appends, empty=True)),
        ("Delta: commit without rows, by deltalake", None, append(deltalake_appends, empty=True)),
        ("Delta: VACUUM, listing with the session's tasks", None, vacuum(None)),
        ("Delta: VACUUM, listing with Spark's default 10000 tasks", None, vacuum(SPARK_DEFAULT_LISTING_TASKS)),
    ]
    seconds: dict[str, list[float]] = {name: [] for name, _, _ in operations}
    jobs: dict[str, list[int]] = {name: [] for name, _, _ in operations}
    try:
        with LoadSampler() as load:
            for round_number in range(args.repeat + 1):
                for name, prepare, operation in operations:
                    if prepare is not None:
                        prepare()
                    before = last_job_id(spark)
                    started = time.perf_counter()
                    operation()
                    elapsed = time.perf_counter() - started
                    if round_number:  # the first round warms each operation up
                        seconds[name].append(elapsed)
                        jobs[name].append(sum(1 for job in spark_jobs(spark) if job["jobId"] > before))
        facts = describe_session(spark, "delta-spark")
        print(
            f"A 5-row table, {args.repeat} repeats after a warm-up; {facts['delta']}, Spark {facts['spark']}, "
            f"{facts['cores']} cores; {describe_load(load.samples)}"
            + (f"; settings: {', '.join(args.conf)}" if args.conf else "")
            + "\n"
        )
        print("| operation | median s | min s | Spark jobs |")
        print("| --- | ---: | ---: | ---: |")
        for name, _, _ in operations:
            print(
                f"| {name} | {statistics.median(seconds[name]):.2f} | {min(seconds[name]):.2f} "
                f"| {statistics.median(jobs[name]):g} |"
            )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
