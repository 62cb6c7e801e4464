"""What the IO manager's output metadata costs after each write, before and after issue 8.

Run by hand from the repository root::

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/output_metadata.py --rows 1000000 --rounds 4

For each engine (``--engines``; delta-spark needs ``DELTA_SPARK_JARS``), in a
child process of its own (one Python process holds one SparkContext) with a
``local[2]`` session built as the tests build theirs, it writes a table of
``--rows`` rows through ``DeltaTableClient`` and then, round after round,
commits an overwrite of all rows, a MERGE (updates a tenth of the keys, deletes
a twentieth, inserts a few new ones) and a small append. Every commit is
followed by one timed description of the table, as ``handle_output`` does it
(with the write's ``CommitFacts``):

- ``before``: the metadata as computed up to commit c3d88bb (``detail()``, the
  newest commit read again, ``count()`` of a fresh read, the preview);
- ``after``: the output metadata as it is now, ``io_manager.metadata.table_metadata``
  (``DeltaTableClient.describe``: the version's state from the Delta log; the preview).

The two alternate over the commits (each follows a fresh commit, the case
that matters: the first look at a new version is what costs), and each round
swaps which goes first. The first round warms the JVM and is not counted. Both
must give the same rows, files and bytes (checked). It prints a Markdown table
of median seconds per operation and engine; ``--json`` keeps every sample.
Nothing is written outside a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ENGINES = ("delta-rs", "delta-spark")
OPERATIONS = ("overwrite", "merge", "append")
VARIANTS = ("before", "after")


def before_output_metadata(client: Any, path: str, *, commit: Any = None, preview_rows: int = 5) -> dict[str, Any]:
    """The output metadata (``DeltaTableClient.output_metadata`` then) before issue 8, kept to measure against.

    It described the table with ``detail()``, the newest commit and ``count()``
    of a fresh read; the metadata is built from that as it is now.
    """
    from medallion_assets.io_manager.metadata import description_metadata
    from medallion_assets.storage.client import TableDescription

    detail = client.engine.detail(client.spark, path)
    commit = commit or client.engine.latest_commit(client.spark, path)
    frame = client.read(path)
    description = TableDescription(
        path=path,
        engine=client.engine.name,
        version=commit.version,
        operation=commit.operation,
        operation_metrics=commit.operation_metrics,
        rows=frame.count(),
        num_files=detail.num_files,
        size_bytes=detail.size_bytes,
        partition_columns=detail.partition_columns,
        frame=frame,
    )
    return description_metadata(description, preview_rows=preview_rows)


def child(args: argparse.Namespace) -> int:
    """Measure one engine in this process; print the samples as JSON on the last line."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from medallion_assets.io_manager import WriteSpec, table_metadata
    from medallion_assets.storage.client import DeltaTableClient
    from medallion_assets.storage.session import plan_engine, start_engine

    plan = plan_engine(args.engine, jars=os.environ.get("DELTA_SPARK_JARS") if args.engine == "delta-spark" else None)
    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.databricks.delta.snapshotPartitions", "2")
    )
    for key, value in plan.spark_config.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    client = DeltaTableClient(spark, start_engine(spark, plan))

    path = str(Path(args.folder) / f"table_{args.engine}")
    rows = (
        spark.range(args.rows)
        .select(
            F.col("id"), (F.col("id") % 97).alias("k"), F.col("id").cast("string").alias("s"), F.lit(0).alias("seq")
        )
        .repartition(8)
        .cache()
    )
    rows.count()
    merge_spec = WriteSpec(mode="merge", merge_keys=("id",), sequence_column="seq", delete_column="deleted")
    sources = {
        "overwrite": (rows, WriteSpec(mode="overwrite")),
        "append": (rows.limit(10_000).withColumn("id", F.col("id") + 10 * args.rows), WriteSpec(mode="append")),
    }
    describe = {
        "before": lambda commit: before_output_metadata(client, path, commit=commit),
        "after": lambda commit: table_metadata(client, path, commit=commit),
    }
    samples: dict[str, dict[str, list[float]]] = {op: {v: [] for v in VARIANTS} for op in OPERATIONS}
    checks = 0
    for round_ in range(args.rounds + 1):
        order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]
        for operation in OPERATIONS:
            facts: dict[str, tuple[int, int, int]] = {}
            for variant in order:
                if operation == "merge":
                    seq = 2 * round_ + order.index(variant) + 1
                    frame = (
                        rows.where(F.col("id") % 10 == seq % 10)
                        .unionByName(rows.limit(1_000).withColumn("id", F.col("id") + (20 + seq) * args.rows))
                        .withColumn("seq", F.lit(seq))
                        .withColumn("deleted", F.col("id") % 20 == 0)
                    )
                    spec = merge_spec
                else:
                    frame, spec = sources[operation]
                result = client.write(frame, path, spec)
                start = time.perf_counter()
                metadata = describe[variant](result.commit)
                elapsed = time.perf_counter() - start
                if round_:
                    samples[operation][variant].append(elapsed)
                facts[variant] = (
                    metadata["dagster/row_count"],
                    metadata["delta/num_files"],
                    metadata["delta/size_bytes"],
                )
            # The two describe different commits; an overwrite leaves the same rows both times.
            if operation == "overwrite" and facts["before"][0] != facts["after"][0]:
                raise AssertionError(f"row counts differ after an overwrite: {facts}")
            checks += 1
        # Both descriptions of the final version must agree.
        commit = client.engine.latest_commit(spark, path)
        old, new = before_output_metadata(client, path, commit=commit), table_metadata(client, path, commit=commit)
        for key in ("dagster/row_count", "delta/num_files", "delta/size_bytes"):
            if old[key] != new[key]:
                raise AssertionError(f"{key}: before {old[key]}, after {new[key]}")
    spark.stop()
    print(json.dumps({"engine": args.engine, "rows": args.rows, "samples": samples}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=4, help="counted rounds (one more warms up)")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--json", help="also write every sample to this file")
    parser.add_argument("--engine", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine:
        return child(args)

    results = []
    folder = tempfile.mkdtemp(prefix="output-metadata-")
    try:
        for engine in args.engines:
            command = [
                sys.executable,
                __file__,
                "--engine",
                engine,
                "--folder",
                folder,
                "--rows",
                str(args.rows),
                "--rounds",
                str(args.rounds),
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            if done.returncode:
                sys.stderr.write(done.stderr[-4000:])
                raise SystemExit(f"{engine}: the measuring process failed")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    print(f"Median seconds of one `table_metadata` after a commit, {args.rows:,} rows, {args.rounds} rounds:\n")
    print("| engine | commit | before | after (issue 8) | after / before |")
    print("|---|---|---:|---:|---:|")
    for result in results:
        for operation in OPERATIONS:
            before = statistics.median(result["samples"][operation]["before"])
            after = statistics.median(result["samples"][operation]["after"])
            print(f"| {result['engine']} | {operation} | {before:.3f} | {after:.3f} | {after / before:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
