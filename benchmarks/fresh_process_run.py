"""A run with nothing new in a fresh process, as a schedule or ``dagster asset materialize`` pays it.

Run by hand from the repository root (``DELTA_SPARK_JARS`` set for delta-spark)::

    python benchmarks/fresh_process_run.py [--scale-factor 0.01] [--rounds 3] \
        [--engines delta-rs delta-spark] [--compare-with OTHER_CHECKOUT] [--select gold/pricing_summary]

Per engine it lands a noisy TPC-H delivery (two batches) in a temporary lake,
materializes everything once (bronze, silver, gold and the checks; the landing
asset excluded), then ``--rounds`` times once more with nothing new: everything
again, or only the ``--select``ed assets. Each run is a new Python process:
interpreter, imports, the Spark session (JVM start) and the Dagster run,
against a sqlite instance in the temporary folder, so every run pays what a
run launched from the UI or by a schedule pays.

With ``--compare-with`` the rounds alternate between this checkout and another
one (its ``PYTHONPATH``), the order flipped each round, on the same lake: an
A/B of a change in one sitting, at the same machine load. Prints a Markdown
table (median and each run: seconds of the Dagster run, and of the whole
process) and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from engine_runs import ENGINES, LoadSampler, describe_load

HERE = Path(__file__).resolve().parent.parent

RUN = r"""
import json, sys, time
started = time.monotonic()
from dagster import AssetSelection, DagsterInstance, materialize
from medallion_assets.definitions import build_definitions
definitions = build_definitions("local")
assets = [a for a in definitions.assets if not any(k.path[0] == "landing" for k in a.keys)]
selection = AssetSelection.from_coercible(sys.argv[1:]) if sys.argv[1:] else None
loaded = time.monotonic()
result = materialize([*assets, *definitions.asset_checks], resources=definitions.resources,
                     instance=DagsterInstance.get(), raise_on_error=False, selection=selection)
import medallion_assets
print("RESULT " + json.dumps({"success": result.success, "run_s": round(time.monotonic() - loaded, 1),
                              "code": medallion_assets.__file__}))
"""

LAND = "import sys; from medallion_assets.simulate import land_all; land_all(sys.argv[1], scale_factor=float(sys.argv[2]), batches=2, seed=7)"


def run_once(checkout: Path, env: dict[str, str], select: list[str] | None = None) -> dict:
    """One materialization (of ``select``, else everything) in a new interpreter importing ``checkout``."""
    import time

    started = time.monotonic()
    # -P: without it ``-c`` puts the working folder first on the path, and a run started in one
    # checkout would import that one whatever PYTHONPATH names.
    done = subprocess.run([sys.executable, "-P", "-c", RUN, *(select or [])], env={**env, "PYTHONPATH": str(checkout)},
                          capture_output=True, text=True)
    process_s = round(time.monotonic() - started, 1)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"the run from {checkout} failed:\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    if not result["success"]:
        raise SystemExit(f"the run from {checkout} did not succeed:\n{done.stderr[-4000:]}")
    if not Path(result["code"]).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"the run meant for {checkout} imported {result['code']}")
    return {"run_s": result["run_s"], "process_s": process_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=3, help="runs with nothing new per checkout and engine")
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--compare-with", type=Path, help="another checkout, run alternately with this one")
    parser.add_argument("--select", nargs="+", metavar="KEY",
                        help="the runs with nothing new materialize only these assets (e.g. gold/pricing_summary), "
                        "as a schedule of one table does")
    args = parser.parse_args(argv)
    if "delta-spark" in args.engines and not os.environ.get("DELTA_SPARK_JARS"):
        parser.error("delta-spark needs DELTA_SPARK_JARS (or leave it out of --engines)")
    checkouts = {"this checkout": HERE}
    if args.compare_with:
        checkouts["--compare-with"] = args.compare_with.resolve()

    rows = []
    with LoadSampler() as load, tempfile.TemporaryDirectory(prefix="medallion-fresh-run-") as folder:
        for engine in args.engines:
            lake, home = Path(folder) / engine / "lake", Path(folder) / engine / "dagster_home"
            home.mkdir(parents=True)
            env = {**os.environ, "MEDALLION_LAKE_ROOT": str(lake), "DAGSTER_HOME": str(home),
                   "MEDALLION_DELTA_ENGINE": engine}
            subprocess.run([sys.executable, "-P", "-c", LAND, str(lake / "landing"), str(args.scale_factor)],
                           env={**env, "PYTHONPATH": str(HERE)}, check=True)
            first = run_once(HERE, env)
            print(f"{engine}: first run {first['run_s']} s", file=sys.stderr, flush=True)
            runs: dict[str, list[dict]] = {name: [] for name in checkouts}
            order = list(checkouts)
            for number in range(args.rounds):
                for name in (order if number % 2 == 0 else order[::-1]):
                    runs[name].append(run_once(checkouts[name], env, args.select))
                    print(f"{engine}, {name}: {runs[name][-1]}", file=sys.stderr, flush=True)
            for name, measured in runs.items():
                rows.append((engine, name, measured))
        samples = load.samples

    what = f"of {', '.join(args.select)}" if args.select else "of every asset"
    print(f"## A run with nothing new {what}, each in a fresh process (SF {args.scale_factor})\n")
    print(f"Machine: {os.cpu_count()} cores; {describe_load(samples)}.\n")
    print("| engine | code | run s (median) | process s (median) | each run: run s / process s |")
    print("| --- | --- | ---: | ---: | --- |")
    for engine, name, measured in rows:
        each = ", ".join(f"{m['run_s']} / {m['process_s']}" for m in measured)
        print(f"| {engine} | {name} | {statistics.median(m['run_s'] for m in measured):.1f} "
              f"| {statistics.median(m['process_s'] for m in measured):.1f} | {each} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
