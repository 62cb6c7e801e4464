"""What judging a delivery's order lines costs: silver's parse of every line, alone.

Run by hand from the repository root, on a landed delivery::

    medallion-assets simulate --lake-root WORK --scale-factor 0.1 --batches 2 --all
    python benchmarks/order_parse.py --landing WORK/landing --repeat 3

It reads the delivery's order files as bronze holds them (one row per line,
with its file), caches them, then times ``judge_order_lines`` over every
line ``--repeat`` times: each output column is hashed, so no column's work is
pruned away. It prints the median wall and CPU seconds, the lines, the
rejects and a hash of the output, so two commits' runs (each from its own
clone, with ``PYTHONPATH`` set to it) can be compared for speed and checked
for the same output. The silver step pays this parse once (it caches the
judged lines), and so does the plain script of ``pipeline_vs_plain.py``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from engine_runs import LoadSampler, Timings, add_delta_spark_arguments, delta_spark_session, describe_load
from pyspark.sql import functions as F


def judged_digest(judged) -> tuple[int, int, int]:
    """``(lines, rejects, hash of every column)`` of the judged lines, in one query."""
    row = judged.select(
        F.count(F.lit(1)).alias("lines"),
        F.count("_reject_reason").alias("rejects"),
        F.sum(F.hash(*judged.columns)).alias("digest"),
    ).first()
    return int(row["lines"]), int(row["rejects"]), int(row["digest"] or 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--landing", type=Path, required=True, help="a landed delivery's landing folder")
    parser.add_argument("--repeat", type=int, default=3)
    add_delta_spark_arguments(parser)
    args = parser.parse_args(argv)
    orders = args.landing / "orders"
    if not orders.is_dir():
        parser.error(
            f"--landing {args.landing} has no orders/ folder: land a delivery first (medallion-assets simulate --all)"
        )

    from medallion_assets.pipelines.tpch.transforms import judge_order_lines

    spark = delta_spark_session(parser, args, "order-parse")
    lines = (
        spark.read.text(str(orders))
        .select(
            # A fixed ingestion time: two runs of the same lines then hash alike.
            "value",
            F.input_file_name().alias("_source_file"),
            F.lit("2026-01-01 00:00:00").cast("timestamp").alias("_ingested_at"),
        )
        .cache()
    )
    lines.count()
    timings, digests = Timings(), set()
    with LoadSampler() as load:
        for _ in range(args.repeat):
            digests.add(timings.run("judge", lambda: judged_digest(judge_order_lines(lines))))
    spark.stop()
    if len(digests) != 1:
        raise AssertionError(f"the same lines were judged differently from one repeat to the next: {sorted(digests)}")
    [(count, rejects, digest)] = digests
    median = timings.medians()["judge"]
    print(
        json.dumps(
            {
                "lines": count,
                "rejects": rejects,
                "digest": digest,
                "wall_s": round(median["wall"], 2),
                "cpu_s": round(median["cpu"], 2),
                "repeat": args.repeat,
                "load": describe_load(load.samples),
                "cores": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
