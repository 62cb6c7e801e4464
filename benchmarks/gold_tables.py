"""What each gold table's transform costs on a lake's silver tables, on delta-spark.

Run by hand (not a test), from the project root, on a lake that
``incremental.py --folder`` (or a pipeline run) left behind:

    DELTA_SPARK_JARS=<folder of the delta-spark jars> \\
        python benchmarks/gold_tables.py --silver LAKE/silver --rounds 3

Each gold transform of :mod:`medallion_assets.pipelines.tpch.gold_transforms`
is computed from the silver tables (its parameters name them: ``customer``
reads ``silver/customers``) and collected as Arrow, as the IO manager
collects a small gold table before deltalake writes it. Writes, checks and
the reconciliations are left out: this is the transforms' own cost, the part
a change to one of them moves. Every table is computed once untimed (the
JIT and Delta's snapshots warm up), then ``--rounds`` times in turn. It
prints the median wall and CPU seconds of each and the load average.

To compare two versions of the transforms, run it from a clone of each
commit on the same lake, one after the other, alternating.
"""

from __future__ import annotations

import argparse
import inspect
import os

from engine_runs import LoadSampler, Timings, add_delta_spark_arguments, delta_spark_session, describe_load

#: The gold transforms, in the order the pipeline's gold assets are listed.
TABLES = (
    "pricing_summary",
    "shipping_priority",
    "local_supplier_volume",
    "forecasting_revenue_change",
    "daily_revenue",
    "monthly_revenue",
    "customer_lifetime_value",
)

#: A transform's parameter -> the silver table it is (the others are named as their tables).
SILVER_FOLDER = {"customer": "customers"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--silver", required=True, help="the lake's silver folder (tables are read, not changed)")
    parser.add_argument("--rounds", type=int, default=3, help="timed computations of each table")
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="the tables to time")
    add_delta_spark_arguments(parser)
    args = parser.parse_args()

    from medallion_assets.pipelines.tpch import gold_transforms

    spark = delta_spark_session(parser, args, "gold_tables")
    silver = {}

    def table(parameter: str):
        name = SILVER_FOLDER.get(parameter, parameter)
        if name not in silver:
            silver[name] = spark.read.format("delta").load(os.path.join(args.silver, name))
        return silver[name]

    def computed(name: str):
        transform = getattr(gold_transforms, name)
        inputs = [
            p.name for p in inspect.signature(transform).parameters.values() if p.default is inspect.Parameter.empty
        ]
        return lambda: transform(*(table(p) for p in inputs)).toArrow()

    work = {name: computed(name) for name in args.tables}
    rows = {name: fn().num_rows for name, fn in work.items()}
    timings = Timings()
    with LoadSampler() as load:
        for _ in range(args.rounds):
            for name, fn in work.items():
                timings.run(name, fn)
    print(f"delta-spark, {args.rounds} rounds, {describe_load(load.samples)}")
    print("| gold table | rows | wall s (median) | CPU s (median) |")
    print("| --- | ---: | ---: | ---: |")
    for name, median in timings.medians().items():
        print(f"| {name} | {rows[name]:,} | {median['wall']:.2f} | {median['cpu']:.2f} |")
    spark.stop()


if __name__ == "__main__":
    main()
