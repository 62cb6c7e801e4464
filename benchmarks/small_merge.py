"""A batch's MERGE into a large table, by delta-spark and by deltalake (``arrow_write_max_rows``).

Run by hand (not a test), from the project root, on a table of a lake that
``incremental.py --folder`` (or a pipeline run) left behind:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/small_merge.py --table LAKE/silver/lineitem \\
            --keys l_orderkey l_linenumber --group l_orderkey --sequence _sequence --change l_quantity

The IO manager merges a source of at most ``arrow_write_max_rows`` rows
(250,000 by default) into an existing table with deltalake, in the Python
driver, and a larger one with the session's engine. This measures what that
route changes for one MERGE of a batch's size into a table of any size:

* a copy of ``--table`` (and its tombstones, if any) for each route;
* the source: the rows of ``--fraction`` of the groups (or keys), each with
  ``--change`` plus one and a newer ``--sequence``, and, with ``--group``,
  the group's highest key left out, so the MERGE removes a stored row too;
* the write through ``DeltaTableClient.write``, as the IO manager calls it:
  counted once, the group or key MERGE, its tombstones;
* the deltalake route takes the MERGE when its source has at most
  ``--bound`` rows, as the client counts them: with ``--group``, the
  changed rows plus the stored rows of their groups (a restatement of 1% of
  SF 1's orders counts about 105,000, within the default bound);
* per route, in a child process of its own (a fresh session and a fresh
  peak): the seconds of the write, the Python driver's peak resident memory
  above where it stood before the write, who committed the MERGE, and the
  table's rows and the sum of ``--change`` afterwards, which must be the same
  for both routes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from engine_runs import build_session, emit_json, memory_kb, reset_peak_rss, run_child

ROUTES = ("delta-spark", "deltalake")


def _newer(field):
    """A sequence value that sorts after the ``field`` column's, whatever its type."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType, StringType

    if isinstance(field.dataType, StringType):
        return F.concat(F.col(field.name), F.lit("~"))
    if isinstance(field.dataType, NumericType):
        return F.col(field.name) + F.lit(1)
    return F.col(field.name) + F.expr("INTERVAL 1 SECOND")


def measure(args: argparse.Namespace) -> dict:
    import deltalake
    from pyspark.sql import functions as F

    from medallion_assets.storage.client import DeltaTableClient
    from medallion_assets.storage.write_spec import WriteSpec
    from medallion_assets.storage.writers import ARROW_WRITE_MAX_ROWS, WriterLimits

    work = tempfile.mkdtemp(prefix="small_merge_")
    path = os.path.join(work, "table")
    shutil.copytree(args.table, path)
    tombstones = DeltaTableClient.tombstone_path(args.table)
    if os.path.isdir(tombstones):
        shutil.copytree(tombstones, DeltaTableClient.tombstone_path(path))
    try:
        spark, _ = build_session("delta-spark", "local[*]", args.delta_spark_jars, "small_merge")
        bound = (args.bound or ARROW_WRITE_MAX_ROWS) if args.route == "deltalake" else 0
        client = DeltaTableClient(spark, writer_limits=WriterLimits(max_rows=bound))
        stored = client.read(path)
        unit = args.group or args.keys[0]
        # Chosen by a hash of the group, so that both routes' runs change the same rows.
        rows = stored.where(F.abs(F.xxhash64(unit, F.lit(args.seed))) % 1_000_000 < args.fraction * 1_000_000)
        if args.group:
            last = [k for k in args.keys if k != args.group][-1]
            highest = rows.groupBy(args.group).agg(F.max(last).alias("_highest"))
            rows = rows.join(highest, args.group).where(F.col(last) != F.col("_highest")).drop("_highest")
        sequence = stored.schema[args.sequence]
        source = (
            rows.withColumn(args.change, F.col(args.change) + F.lit(1))
            .withColumn(args.sequence, _newer(sequence))
            .withColumn("_deleted", F.lit(False))
            .localCheckpoint(eager=True)
        )
        source_rows = source.count()
        spec = WriteSpec(
            mode="merge",
            merge_keys=tuple(args.keys),
            sequence_column=args.sequence,
            delete_column="_deleted",
            replace_group=args.group,
        )
        reset_peak_rss(os.getpid())
        before = memory_kb(os.getpid(), "VmRSS")
        started = time.perf_counter()
        result = client.write(source, path, spec)
        seconds = time.perf_counter() - started
        peak_growth = memory_kb(os.getpid(), "VmHWM") - before
        merge = next(info for info in deltalake.DeltaTable(path).history(5) if info.get("operation") == "MERGE")
        after = client.read(path).agg(F.count(F.lit(1)).alias("rows"), F.sum(args.change).alias("total")).first()
        return {
            "route": args.route,
            "source_rows": source_rows,
            "seconds": round(seconds, 2),
            "python_peak_growth_mb": round(peak_growth / 1024),
            "merged_by": merge.get("engineInfo") or merge.get("clientVersion"),
            "by_deltalake": result.by_deltalake,
            "rows_after": after["rows"],
            "sum_after": str(after["total"]),
            "load_average": os.getloadavg()[0],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", required=True, help="folder of an existing Delta table (it is copied, not changed)")
    parser.add_argument("--keys", nargs="+", required=True, help="the merge keys")
    parser.add_argument("--group", help="a replace_group column (a group's change replaces all its rows)")
    parser.add_argument("--sequence", required=True, help="the sequence column")
    parser.add_argument("--change", required=True, help="a numeric column the source adds one to")
    parser.add_argument("--fraction", type=float, default=0.01, help="share of the groups (or keys) changed")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--bound", type=int, help="the deltalake route's arrow_write_max_rows (default: the IO manager's default)"
    )
    parser.add_argument("--route", choices=ROUTES, help=argparse.SUPPRESS)
    parser.add_argument("--delta-spark-jars", default=os.environ.get("DELTA_SPARK_JARS"))
    args = parser.parse_args()
    if not args.delta_spark_jars:
        parser.error("set DELTA_SPARK_JARS or pass --delta-spark-jars")
    if args.route:
        emit_json(measure(args))
        return
    results = []
    for route in ROUTES:
        results.append(run_child([*sys.argv, "--route", route], f"the {route} run"))
    print(
        "| route | source rows | write s | Python peak above start, MB | MERGE committed by "
        "| rows after | sum after | load |"
    )
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r['route']} | {r['source_rows']:,} | {r['seconds']} | {r['python_peak_growth_mb']} | {r['merged_by']} "
            f"| {r['rows_after']:,} | {r['sum_after']} | {r['load_average']:.1f} |"
        )
    if len({(r["rows_after"], r["sum_after"]) for r in results}) != 1:
        sys.exit("the two routes left different tables")


if __name__ == "__main__":
    main()
