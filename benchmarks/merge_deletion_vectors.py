"""What deletion vectors would save a small batch's MERGE, and why they stay off.

Run by hand (not a test), from the project root:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/merge_deletion_vectors.py --scale-factor 1 --share 0.01 --rounds 2

It builds TPC-H's ``lineitem`` at the scale factor twice with delta-spark,
through the project's own client and merge code (``DeltaTableClient.write``
with ``silver.lineitem``'s declaration: merge keys, replace group, sequence and
delete columns), once as the project creates it and once with
``delta.enableDeletionVectors``. Then it applies the same batch to both: the
line items of ``--share`` of the orders, picked across the whole key range as
a random batch is, restated with a newer sequence (one in ten of those orders
deleted instead). Each round starts from fresh copies of the two first loads,
the order of the two MERGEs alternating.

It prints, per variant, the MERGE's wall and CPU seconds (the CPU of the whole
process tree), the files the commit removed and added and the rows it copied
(the commit's ``operationMetrics``), a full read of the result, and whether
the two results hold the same rows. Last, it opens the deletion-vector table
with delta-rs, which is what the project's pandas/Arrow loads and the tests'
independent reads use: that is what keeps the vectors off.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from engine_runs import (
    LoadSampler,
    add_delta_spark_arguments,
    delta_spark_session,
    describe_load,
    describe_session,
    last_job_id,
    spark_jobs,
    spark_jobs_by_kind,
    tree_cpu_seconds,
)
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from medallion_assets.io_manager import DELETION_VECTORS

#: ``silver.lineitem``'s merge declaration (``pipelines/tpch/silver.py``).
KEYS = ("l_orderkey", "l_linenumber")
GROUP, SEQUENCE, DELETED = "l_orderkey", "_sequence", "_deleted"
#: Each table variant: its name, and the properties it is created with.
PLAIN, WITH_VECTORS = "as the project creates it", "with deletion vectors"
VARIANTS = {PLAIN: {}, WITH_VECTORS: {DELETION_VECTORS: "true"}}


#: delta-spark's job descriptions of a MERGE's phases, in the order it runs them.
MERGE_PHASES = (
    ("materialize source", "MERGE: materialize the source"),
    ("scanning files for matches", "MERGE: find the files with matches"),
    ("MERGE", "MERGE: write the changes"),
)


def merge_phase(job: dict) -> str:
    """Which part of a write through the client a Spark job belongs to."""
    description = job.get("description") or ""
    for marker, phase in MERGE_PHASES:
        if marker in description:
            return phase
    if "Compute snapshot" in description or "Filtering files" in description:
        return "delta-spark snapshot and file listing"
    return "the client's own jobs (counts, the tombstones' append)"


def first_load(lineitem: DataFrame) -> DataFrame:
    return lineitem.select("*", F.lit(1).cast("long").alias(SEQUENCE), F.lit(False).alias(DELETED))


def batch(lineitem: DataFrame, share: float) -> DataFrame:
    """The line items of ``share`` of the orders, restated; one order in ten of them deleted instead."""
    step = max(int(round(1 / share)), 1)
    picked = lineitem.where(F.abs(F.xxhash64(GROUP)) % step == 0)
    deleted = F.abs(F.xxhash64(GROUP, F.lit("delete"))) % 10 == 0
    updates = picked.where(~deleted).select(
        *[(F.col(c) + 1).alias(c) if c == "l_quantity" else F.col(c) for c in lineitem.columns],
        F.lit(2).cast("long").alias(SEQUENCE),
        F.lit(False).alias(DELETED),
    )
    deletes = (
        picked.where(deleted)
        .where(F.col("l_linenumber") == 1)
        .select(*lineitem.columns, F.lit(2).cast("long").alias(SEQUENCE), F.lit(True).alias(DELETED))
    )
    return updates.unionByName(deletes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--share", type=float, default=0.01, help="share of the orders the batch restates")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work-dir", help="the simulator's TPC-H cache (default: its own)")
    add_delta_spark_arguments(parser)
    args = parser.parse_args(argv)

    from medallion_assets.io_manager.spec import WriteSpec
    from medallion_assets.pipelines.tpch.simulator import tpch_folder
    from medallion_assets.storage.client import DeltaTableClient

    spark = delta_spark_session(parser, args, "merge-deletion-vectors", extra_config={"spark.ui.enabled": "true"})
    source = tpch_folder(args.work_dir, args.scale_factor) / "lineitem.parquet"
    client = DeltaTableClient(spark)
    work = Path(tempfile.mkdtemp(prefix="merge-dv-"))
    samples: dict[str, dict[str, list[float]]] = {
        name: {"merge_s": [], "merge_cpu_s": [], "read_s": []} for name in VARIANTS
    }
    metrics: dict[str, dict] = {}
    phases: dict[str, dict[str, dict[str, float]]] = {}
    try:
        lineitem = spark.read.parquet(str(source))
        changes = batch(lineitem, args.share).cache()
        changed_rows, changed_orders = changes.count(), changes.select(GROUP).distinct().count()
        bases = {}
        for number, (name, properties) in enumerate(VARIANTS.items()):
            spec = WriteSpec(
                mode="merge",
                merge_keys=KEYS,
                replace_group=GROUP,
                sequence_column=SEQUENCE,
                delete_column=DELETED,
                table_properties=properties,
            )
            bases[name] = (work / f"base{number}", spec)
            client.write(first_load(lineitem), str(bases[name][0]), spec)
        files = {name: client.describe(str(path)).num_files for name, (path, _) in bases.items()}
        results = {}
        with LoadSampler() as load:
            for round_number in range(args.rounds):
                order = list(VARIANTS) if round_number % 2 == 0 else list(reversed(VARIANTS))
                for name in order:
                    base, spec = bases[name]
                    path = work / f"round{round_number}-{list(VARIANTS).index(name)}"
                    shutil.copytree(base, path)
                    last_job = last_job_id(spark)
                    cpu, started = tree_cpu_seconds(), time.perf_counter()
                    client.write(changes, str(path), spec)
                    samples[name]["merge_s"].append(time.perf_counter() - started)
                    samples[name]["merge_cpu_s"].append(tree_cpu_seconds() - cpu)
                    # Asked of the UI after the clock stops: the query is not the MERGE's.
                    phases[name] = spark_jobs_by_kind(spark_jobs(spark), last_job, merge_phase)
                    metrics[name] = client.last_commit_info(str(path))["operationMetrics"]
                    started = time.perf_counter()
                    client.read(str(path)).agg(F.sum("l_quantity"), F.count(F.lit(1))).first()
                    samples[name]["read_s"].append(time.perf_counter() - started)
                    results[name] = str(path)
        plain, with_vectors = client.read(results[PLAIN]), client.read(results[WITH_VECTORS])
        same = plain.exceptAll(with_vectors).isEmpty() and with_vectors.exceptAll(plain).isEmpty()
        try:
            import deltalake

            deltalake.DeltaTable(results[WITH_VECTORS]).to_pyarrow_table(columns=[GROUP])
            delta_rs = f"deltalake {deltalake.__version__} reads it"
        except Exception as error:  # the reason is what is reported
            delta_rs = f"deltalake refuses it: {str(error).splitlines()[0]}"
        facts = describe_session(spark, "delta-spark")
        print(
            f"`lineitem` at SF {args.scale_factor:g} ({lineitem.count():,} rows); the batch restates "
            f"{changed_orders:,} orders ({changed_rows:,} rows), {args.rounds} rounds; {facts['delta']}, "
            f"{facts['cores']} cores; {describe_load(load.samples)}\n"
        )
        print(
            "| table | files | MERGE s (median) | MERGE CPU s | files removed / added | rows copied "
            "| deletion vectors added | full read after, s |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in VARIANTS:
            m, s = metrics[name], samples[name]
            print(
                f"| {name} | {files[name]} | {statistics.median(s['merge_s']):.1f} "
                f"| {statistics.median(s['merge_cpu_s']):.1f} "
                f"| {m.get('numTargetFilesRemoved', '?')} / {m.get('numTargetFilesAdded', '?')} "
                f"| {int(m.get('numTargetRowsCopied', 0)):,} | {m.get('numTargetDeletionVectorsAdded', 0)} "
                f"| {statistics.median(s['read_s']):.1f} |"
            )
        print(
            f"\nSame rows in both: {same}. Each MERGE's seconds: "
            + "; ".join(f"{n}: {', '.join(f'{v:.1f}' for v in samples[n]['merge_s'])}" for n in VARIANTS)
        )
        print(f"delta-rs on the table with deletion vectors: {delta_rs}")
        print("\nSpark jobs of each variant's last MERGE, by part (seconds from submission to completion):\n")
        print("| part | " + " | ".join(VARIANTS) + " |")
        print("| --- |" + " ---: |" * len(VARIANTS))
        parts = dict.fromkeys(part for name in VARIANTS for part in phases[name])
        for part in parts:
            cells = [phases[name].get(part, {"jobs": 0, "seconds": 0.0}) for name in VARIANTS]
            print(f"| {part} | " + " | ".join(f"{c['seconds']:.1f} ({c['jobs']} jobs)" for c in cells) + " |")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
