"""What registering the lake's tables costs a starting session: the session catalog against none.

Run by hand from the repository root, on a lake the pipeline wrote (the quickstart's
``./lakehouse``, or any ``MEDALLION_LAKE_ROOT``)::

    python benchmarks/catalog_attach.py --lake ./lakehouse

For each engine (delta-spark when ``DELTA_SPARK_JARS`` names its jars) and each of
``MEDALLION_CATALOG=none`` and ``session``, a child process (a fresh interpreter:
one holds one SparkContext) makes a session the way a notebook does,
``spark_resource("local").process_config_and_initialize().spark_session``, and
reports the seconds until it is ready and the tables its catalog names. The
difference between the two rows of an engine is what the catalog adds to every
process that starts a session (a ``dagster asset materialize``, a run launched
from the UI, a notebook). Prints a Markdown table and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, time
started = time.monotonic()
from medallion_assets.resources import spark_resource
spark = spark_resource("local").process_config_and_initialize().spark_session
ready = time.monotonic() - started
tables = sum(len(spark.catalog.listTables(db.name)) for db in spark.catalog.listDatabases() if db.name != "default")
print(json.dumps({"seconds": round(ready, 1), "tables": tables}))
"""


def measure(lake: str, engine: str, catalog: str) -> dict:
    env = dict(
        os.environ, MEDALLION_LAKE_ROOT=os.path.abspath(lake), MEDALLION_DELTA_ENGINE=engine, MEDALLION_CATALOG=catalog
    )
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake", required=True, help="a lake the pipeline wrote")
    args = parser.parse_args()
    engines = ["delta-rs", *(["delta-spark"] if os.environ.get("DELTA_SPARK_JARS") else [])]
    print("| engine | catalog | session ready (s) | tables by name |")
    print("| --- | --- | --- | --- |")
    for engine in engines:
        for catalog in ("none", "session"):
            result = measure(args.lake, engine, catalog)
            print(f"| {engine} | {catalog} | {result['seconds']} | {result['tables']} |")
    print(f"\nload average: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
