"""What the table checks and gold's reconciliations cost by Spark and by DataFusion, on a lake's silver tables.

Run by hand (not a test), from the project root, on a lake that
``incremental.py --folder`` (or a pipeline run) left behind:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/check_engines.py --silver LAKE/silver --rounds 3

The key checks of ``lineitem`` and ``orders``, the reference checks
``lineitem -> orders`` and ``orders -> customers``
(:func:`~medallion_assets.assets.checks.count_duplicate_keys`,
:func:`~medallion_assets.assets.checks.count_orphans`) and the three gold
reconciliations (:mod:`medallion_assets.pipelines.tpch.gold`) are computed
two ways, as the pipeline's checks choose between them: by Spark over the
tables read by delta-spark, and by DataFusion over delta-rs' tables
(``ArrowDeltaClient.readable_table``, what ``TableRead.delta_table()`` hands
a check). A reconciliation's gold rows are computed once by the gold
transform and cached, as in its step. Both ways must give the same answer.
Each is run once untimed, then ``--rounds`` times, the two ways in turn, in
one process; it prints the median wall and CPU seconds (CPU of this process
and its JVM, DataFusion's threads included) and the load average.
"""

from __future__ import annotations

import argparse
import os

from engine_runs import LoadSampler, Timings, add_delta_spark_arguments, delta_spark_session, describe_load

#: Each check: its silver tables (by folder) and how it counts them, in the order they are passed.
KEY_CHECKS = {"lineitem": ("l_orderkey", "l_linenumber"), "orders": ("o_orderkey",)}
REFERENCE_CHECKS = {
    "lineitem -> orders": ("lineitem", ("l_orderkey",), "orders", ("o_orderkey",)),
    "orders -> customers": ("orders", ("o_custkey",), "customers", ("c_custkey",)),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silver", required=True, help="the lake's silver folder (tables are read, not changed)")
    parser.add_argument("--rounds", type=int, default=3, help="timed computations of each check, each way")
    add_delta_spark_arguments(parser)
    args = parser.parse_args()

    from medallion_assets.assets.checks import count_duplicate_keys, count_orphans, one_row
    from medallion_assets.pipelines.tpch import gold, gold_transforms
    from medallion_assets.storage.arrow_client import ArrowDeltaClient

    spark = delta_spark_session(parser, args, "check_engines")
    delta_rs = ArrowDeltaClient()
    folders = ("lineitem", "orders", "customers")
    frames = {name: spark.read.format("delta").load(os.path.join(args.silver, name)) for name in folders}
    tables = {name: delta_rs.readable_table(os.path.join(args.silver, name)) for name in folders}

    work = {}
    for table, keys in KEY_CHECKS.items():
        work[f"key check {table}"] = {
            "Spark": lambda table=table, keys=keys: count_duplicate_keys(frames[table], keys),
            "DataFusion": lambda table=table, keys=keys: count_duplicate_keys(tables[table], keys),
        }
    for name, (child, foreign_keys, parent, parent_keys) in REFERENCE_CHECKS.items():
        work[f"reference check {name}"] = {
            way: lambda source=source, child=child, parent=parent, fk=foreign_keys, pk=parent_keys: count_orphans(
                source[child], fk, source[parent], pk
            )
            for way, source in (("Spark", frames), ("DataFusion", tables))
        }
    # The gold transform's inputs and the reconciliation's silver names, as the gold assets pass them.
    reconciliations = {
        "daily_revenue": (
            gold.DAILY_REVENUE_RECONCILIATION,
            {"orders": "orders", "lineitem": "lineitem", "customer": "customers"},
            lambda: gold_transforms.daily_revenue(frames["orders"], frames["lineitem"], frames["customers"]),
        ),
        "monthly_revenue": (
            gold.MONTHLY_REVENUE_RECONCILIATION,
            {"orders": "orders", "lineitem": "lineitem"},
            lambda: gold_transforms.monthly_revenue(frames["orders"], frames["lineitem"]),
        ),
        "customer_lifetime_value": (
            gold.CUSTOMER_LIFETIME_VALUE_RECONCILIATION,
            {"customer": "customers", "orders": "orders"},
            lambda: gold_transforms.customer_lifetime_value(frames["customers"], frames["orders"]),
        ),
    }
    cached = []
    for name, (reconciliation, silver, computed) in reconciliations.items():
        rows = computed().cache()
        cached.append(rows)
        rows.count()
        sql = reconciliation.sql()
        work[f"reconciliation {name}"] = {
            "Spark": lambda sql=sql, silver=silver, rows=rows: one_row(
                sql, {**{n: frames[folder] for n, folder in silver.items()}, "gold": rows}
            ),
            # The gold rows are collected in the timing, as the check collects them.
            "DataFusion": lambda sql=sql, silver=silver, rows=rows: one_row(
                sql, {**{n: tables[folder] for n, folder in silver.items()}, "gold": rows.toArrow()}
            ),
        }

    for name, ways in work.items():
        answers = {way: fn() for way, fn in ways.items()}
        if answers["Spark"] != answers["DataFusion"]:
            raise SystemExit(f"{name}: Spark and DataFusion disagree: {answers}")
    timings = Timings()
    with LoadSampler() as load:
        for _ in range(args.rounds):
            for name, ways in work.items():
                for way, fn in ways.items():
                    timings.run(f"{name}|{way}", fn)
    print(f"delta-spark and deltalake, {args.rounds} rounds, {describe_load(load.samples)}")
    print("| check | Spark wall s | Spark CPU s | DataFusion wall s | DataFusion CPU s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    medians = timings.medians()
    for name in work:
        spark_time, datafusion_time = medians[f"{name}|Spark"], medians[f"{name}|DataFusion"]
        print(
            f"| {name} | {spark_time['wall']:.2f} | {spark_time['cpu']:.2f} | "
            f"{datafusion_time['wall']:.2f} | {datafusion_time['cpu']:.2f} |"
        )
    for rows in cached:
        rows.unpersist()
    spark.stop()


if __name__ == "__main__":
    main()
