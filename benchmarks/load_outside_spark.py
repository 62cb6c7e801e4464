"""A gold table loaded as pandas through the Delta IO manager: the delta-rs route against the Spark route.

Run by hand from the repository root::

    python benchmarks/load_outside_spark.py --rows 100000 --repeats 5

Writes a gold-like table of ``--rows`` rows (keys, strings, decimals, dates)
with ``write_deltalake`` into a temporary lake, then, each route in a child
process of its own (a fresh interpreter: one holds one SparkContext), loads it
``--repeats`` + 1 times through :class:`~medallion_assets.io_manager.DeltaIOManager`'s
``load_input``:

- ``delta-rs``: the input annotated ``pandas.DataFrame`` (no Spark session);
- ``spark``: the input as a Spark DataFrame (``local[2]`` session, the
  session's Delta engine; ``DELTA_SPARK_JARS`` picks delta-spark), then
  ``toPandas()``.

The first load of each child includes what starting the route costs (for
Spark, the session); the median of the others excludes it. Prints a Markdown
table; nothing is written outside the temporary folder.
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
from decimal import Decimal

ROUTES = ("delta-rs", "spark")


def write_table(root: str, rows: int) -> str:
    """A gold-like table of ``rows`` rows at ``<root>/gold/bench``, written by delta-rs."""
    import datetime as dt

    import pyarrow as pa
    from deltalake import write_deltalake

    path = os.path.join(root, "gold", "bench")
    ids = list(range(rows))
    write_deltalake(
        path,
        pa.table(
            {
                "key": pa.array(ids, pa.int64()),
                "flag": pa.array(["AFNR"[i % 4] for i in ids]),
                "amount": pa.array([Decimal(i % 100_000) / 100 for i in ids], pa.decimal128(15, 2)),
                "day": pa.array([dt.date(1995, 1, 1) + dt.timedelta(days=i % 2000) for i in ids]),
            }
        ),
    )
    return path


def load_route(route: str, root: str, repeats: int) -> dict:
    """Seconds of each load of the table as pandas by ``route`` (run in the child process)."""
    import pandas as pd
    from dagster import AssetKey, build_input_context
    from dagster._core.types.dagster_type import resolve_dagster_type
    from pyspark import SparkContext
    from pyspark.sql import DataFrame

    from medallion_assets.io_manager import DeltaIOManager
    from medallion_assets.resources import LakeResource, SparkResource

    spark = SparkResource(master="local[2]")
    manager = DeltaIOManager(spark=spark, lake=LakeResource(root=root))
    kind = pd.DataFrame if route == "delta-rs" else DataFrame

    seconds, rows = [], None
    for _ in range(repeats + 1):
        context = build_input_context(asset_key=AssetKey(["gold", "bench"]), dagster_type=resolve_dagster_type(kind))
        started = time.perf_counter()
        loaded = manager.load_input(context)
        frame = loaded if route == "delta-rs" else loaded.toPandas()
        seconds.append(time.perf_counter() - started)
        rows = len(frame)
    engine = spark.delta_engine_in_use.name if route == "spark" else "delta-rs (no Spark)"
    return {
        "route": route,
        "engine": engine,
        "seconds": seconds,
        "rows": rows,
        "spark_started": SparkContext._active_spark_context is not None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="rows of the gold table")
    parser.add_argument("--repeats", type=int, default=5, help="loads after the first, per route")
    parser.add_argument("--child", nargs=2, metavar=("ROUTE", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("RESULT " + json.dumps(load_route(args.child[0], args.child[1], args.repeats)))
        return
    root = tempfile.mkdtemp(prefix="load-outside-spark-")
    try:
        write_table(root, args.rows)
        results = []
        for route in ROUTES:
            done = subprocess.run(
                [sys.executable, __file__, "--repeats", str(args.repeats), "--child", route, root],
                capture_output=True,
                text=True,
                check=True,
            )
            [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
            results.append(json.loads(line.removeprefix("RESULT ")))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.rows:,} rows; {args.repeats} loads after the first; load average {os.getloadavg()[0]:.2f}\n")
    print(
        "| route | Delta engine | first load, start included (s) | median load, start excluded (s) | rows "
        "| Spark started |"
    )
    print("|---|---|---|---|---|---|")
    for result in results:
        first, rest = result["seconds"][0], statistics.median(result["seconds"][1:])
        print(
            f"| {result['route']} | {result['engine']} | {first:.2f} | {rest:.3f} | {result['rows']:,} | "
            f"{'yes' if result['spark_started'] else 'no'} |"
        )


if __name__ == "__main__":
    main()
