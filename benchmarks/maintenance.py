"""What the weekly maintenance job costs on a whole lake, on delta-spark.

Run by hand (not a test), from the project root:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/maintenance.py [--scale-factor 0.01]

It lands a small noisy TPC-H delivery (two batches) in a temporary lake and
materializes every asset once on delta-spark, in one embedded session built
by the project's ``SparkResource``. Then it runs the ``table_maintenance``
job (OPTIMIZE, then VACUUM with 168 hours' retention, of every table) on a
fresh copy of that lake per variant, in the same session:

* ``session``: the session's own settings (``SparkResource`` sets
  ``spark.sql.sources.parallelPartitionDiscovery.parallelism``, the tasks that
  list a table's folders in VACUUM, to the core count);
* ``spark-default``: the same job with Spark's default of 10000 listing tasks,
  what an embedded session ran before.

It prints each variant's wall and CPU seconds (this process and its JVM), the
tables it maintained, and the load average while it ran.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from engine_runs import (
    LISTING_TASKS,
    SPARK_DEFAULT_LISTING_TASKS,
    LoadSampler,
    add_delta_spark_arguments,
    delta_spark_session,
    describe_load,
    tree_cpu_seconds,
)

#: The variants: a value for the listing tasks, or None for the session's own.
VARIANTS = {"session": None, "spark-default": SPARK_DEFAULT_LISTING_TASKS}
TABLE_LAYERS = ("bronze", "silver", "gold", "quarantine")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 0.01: below it tpchgen repeats partsupp keys and the blocking key check fails the run.
    parser.add_argument("--scale-factor", type=float, default=0.01)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    add_delta_spark_arguments(parser)
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(tempfile.mkdtemp(prefix="medallion-maintenance-"))
    lake = work / "lake"
    # The definitions' resources read these when Dagster initializes them.
    os.environ.update(
        MEDALLION_LAKE_ROOT=str(lake),
        DAGSTER_HOME=str(work / "dagster_home"),
        MEDALLION_DELTA_ENGINE="delta-spark",
        DELTA_SPARK_JARS=args.delta_spark_jars or "",
    )
    (work / "dagster_home").mkdir()
    spark = delta_spark_session(parser, args, "maintenance")
    try:
        from dagster import DagsterInstance, materialize

        from medallion_assets.definitions import build_definitions
        from medallion_assets.jobs import table_maintenance
        from medallion_assets.pipelines.tpch.simulator import land_all
        from medallion_assets.resources import LakeResource, SparkResource

        land_all(lake / "landing", scale_factor=args.scale_factor, batches=2, seed=7)
        defs = build_definitions("local")
        assets = [a for a in defs.assets if not any(k.path[0] == "landing" for k in a.keys)]
        started = time.monotonic()
        built = materialize(assets, resources=defs.resources, instance=DagsterInstance.ephemeral())
        if not built.success:
            raise SystemExit("the lake's materialization failed")
        print(f"lake at SF {args.scale_factor} built in {time.monotonic() - started:.0f} s", flush=True)

        session_value = spark.conf.get(LISTING_TASKS)
        rows = []
        for name in args.variants:
            copy = work / f"lake-{name}"
            for layer in TABLE_LAYERS:
                if (lake / layer).exists():
                    shutil.copytree(lake / layer, copy / layer)
            tables = sum(len(LakeResource(root=str(copy)).table_paths(layer)) for layer in TABLE_LAYERS)
            # Through the resource, as a user would set it: the job's resource finds this session
            # and applies its settings to it, the listing tasks included.
            chosen = {LISTING_TASKS: VARIANTS[name]} if VARIANTS[name] else {}
            try:
                with LoadSampler() as load:
                    cpu, wall = tree_cpu_seconds(), time.perf_counter()
                    result = table_maintenance.execute_in_process(
                        resources={
                            "spark": SparkResource(
                                master=args.master,
                                delta_engine="delta-spark",
                                delta_spark_jars=args.delta_spark_jars,
                                spark_config=chosen,
                            ),
                            "lake": LakeResource(root=str(copy)),
                        },
                        instance=DagsterInstance.ephemeral(),
                    )
                    wall, cpu = time.perf_counter() - wall, tree_cpu_seconds() - cpu
                ran_with = spark.conf.get(LISTING_TASKS)  # what the job's session had
            finally:
                spark.conf.set(LISTING_TASKS, session_value)
            if not result.success:
                raise SystemExit(f"the maintenance job failed in variant {name}")
            rows.append((name, ran_with, tables, wall, cpu, describe_load(load.samples)))
            print(f"{name}: {wall:.1f} s", flush=True)

        print(
            f"\nSF {args.scale_factor} lake, delta-spark, {os.cpu_count()} cores, `table_maintenance` on a fresh copy "
            "per variant\n"
        )
        print("| variant | listing tasks | tables | wall s | s per table | CPU s | load |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
        for name, tasks, tables, wall, cpu, load_text in rows:
            print(f"| {name} | {tasks} | {tables} | {wall:.1f} | {wall / tables:.2f} | {cpu:.1f} | {load_text} |")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
