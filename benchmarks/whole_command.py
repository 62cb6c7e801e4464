"""The whole command as a user runs it: a fresh ``dagster asset materialize`` of everything, with a breakdown.

Run by hand from the repository root (delta-spark comes from Maven, or ``DELTA_SPARK_JARS`` offline)::

    python benchmarks/whole_command.py [--scale-factor 0.1] [--engine delta-rs]

In a temporary lake it lands the first batch of a two-batch TPC-H delivery,
materializes everything once (bronze, silver, gold and the checks; the landing
asset excluded), then measures, each in a new Python process against a sqlite
instance, as a schedule launches it:

- a run with **nothing new**;
- a run after **one batch** landed (the delivery's second);
- a run with nothing new again.

Per run it prints the process's wall seconds and what they are made of:
interpreter, imports and definitions; the Spark session's start (from the
run's ``Spark session starting`` line to its ``ready`` line; none when no
session started); each step's seconds; and whether the process started a
Spark JVM. Then the machine's load while it ran.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine_runs import ENGINES, LoadSampler, describe_load

HERE = Path(__file__).resolve().parent.parent

RUN = r"""
import json, sys, time
started = time.monotonic()
from dagster import DagsterEventType, DagsterInstance, materialize
from pyspark import SparkContext
from medallion_assets.definitions import build_definitions
definitions = build_definitions("local")
assets = [a for a in definitions.assets if not any(k.path[0] == "landing" for k in a.keys)]
loaded = time.monotonic()
instance = DagsterInstance.get()
result = materialize([*assets, *definitions.asset_checks], resources=definitions.resources,
                     instance=instance, raise_on_error=False)
ran = time.monotonic()
steps, session = {}, {}
for record in instance.all_logs(result.run_id):
    event = record.dagster_event
    message = record.user_message or ""
    if event is None:
        if message.startswith("Spark session starting"):
            session["start"] = record.timestamp
        elif message.startswith("Spark session ready"):
            session["ready"] = record.timestamp
        continue
    if event.step_key is None:
        continue
    if event.event_type == DagsterEventType.STEP_START:
        steps.setdefault(event.step_key, {})["start"] = record.timestamp
    elif event.event_type in (DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE):
        steps.setdefault(event.step_key, {})["end"] = record.timestamp
    elif event.event_type == DagsterEventType.STEP_SKIPPED:
        steps.setdefault(event.step_key, {})["skipped"] = True
print("RESULT " + json.dumps({
    "success": result.success,
    "load_s": round(loaded - started, 2),
    "run_s": round(ran - loaded, 2),
    "session_s": round(session["ready"] - session["start"], 2) if "ready" in session else None,
    "jvm_started": SparkContext._active_spark_context is not None,
    "steps": {k: ("skipped" if v.get("skipped") else round(v["end"] - v["start"], 2)) for k, v in steps.items()
              if v.get("skipped") or "end" in v},
    "materialized": len(result.get_asset_materialization_events()),
}))
"""

LAND = (
    "import sys; from medallion_assets.pipelines.tpch.simulator.delivery import land_next_batch; "
    "land_next_batch(sys.argv[1], scale_factor=float(sys.argv[2]), batches=2, seed=7)"
)


def run_once(env: dict[str, str]) -> dict:
    """One materialization of everything in a new interpreter; its report and the process's wall seconds."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-P", "-c", RUN], env=env, capture_output=True, text=True)
    wall = round(time.monotonic() - started, 1)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"the run failed:\n{done.stderr[-4000:]}")
    report = json.loads(lines[-1][len("RESULT ") :])
    if not report["success"]:
        raise SystemExit(f"the run did not succeed:\n{done.stderr[-4000:]}")
    return {**report, "process_s": wall}


def describe(name: str, report: dict) -> list[str]:
    """Markdown lines of one run: the totals, then the steps by seconds."""
    session = "none started" if report["session_s"] is None else f"{report['session_s']} s"
    lines = [
        f"### {name}: {report['process_s']} s wall",
        "",
        f"- interpreter, imports and definitions: {report['load_s']} s",
        f"- the Dagster run: {report['run_s']} s, of which the Spark session's start: {session}",
        f"- the rest of the process (interpreter exit, JVM shutdown): "
        f"{report['process_s'] - report['load_s'] - report['run_s']:.1f} s",
        f"- a Spark JVM started in the process: {'yes' if report['jvm_started'] else 'no'}; "
        f"{report['materialized']} materializations",
        "",
        "| step | s |",
        "| --- | ---: |",
    ]
    timed = sorted(report["steps"].items(), key=lambda item: 1.0 if item[1] == "skipped" else -float(item[1]))
    lines += [f"| {step} | {seconds} |" for step, seconds in timed]
    return [*lines, ""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--engine", choices=ENGINES, default="delta-rs")
    args = parser.parse_args(argv)
    reports = []
    with LoadSampler() as load, tempfile.TemporaryDirectory(prefix="medallion-whole-command-") as folder:
        lake, home = Path(folder) / "lake", Path(folder) / "dagster_home"
        home.mkdir(parents=True)
        env = {
            **os.environ,
            "MEDALLION_LAKE_ROOT": str(lake),
            "DAGSTER_HOME": str(home),
            "MEDALLION_DELTA_ENGINE": args.engine,
            "PYTHONPATH": str(HERE),
        }

        def land() -> None:
            subprocess.run(
                [sys.executable, "-P", "-c", LAND, str(lake / "landing"), str(args.scale_factor)], env=env, check=True
            )

        land()
        for name in ("first run (batch 1 of 2)", "nothing new", "one batch (batch 2 of 2)", "nothing new again"):
            if name.startswith("one batch"):
                land()
            reports.append((name, run_once(env)))
            print(f"{name}: {reports[-1][1]['process_s']} s", file=sys.stderr, flush=True)
        samples = load.samples

    print(f"## The whole command, a fresh process each, {args.engine}, SF {args.scale_factor}\n")
    print(f"Machine: {os.cpu_count()} cores; {describe_load(samples)}.\n")
    for name, report in reports:
        print("\n".join(describe(name, report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
