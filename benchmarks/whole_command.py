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

With ``--plain``, it then times ``benchmarks/plain_pipeline.py`` over the same
two landed batches, once, as a new process too, and prints the two
materializations that did the work (the first run and the batch's) against
that one plain pass, process and session start included on both sides.

Per run it prints the process's wall seconds and what they are made of:
interpreter and imports, the definitions; the Spark session's start (from the
run's ``Spark session starting`` line to its ``ready`` line; none when no
session started), split into the JVM's start (``getOrCreate``, Ivy's
resolution of ``spark.jars.packages`` included, and each resolution Spark
reports, so one resolved twice shows), the engine's plan and start; catalog
registrations; the decision without Spark; the bronze streams' batches; the
IO manager's reads and commits; the steps' own code; Dagster between the
steps; each step's seconds; and whether the process started a Spark JVM.
The causes are timed by wrapping the project's functions in the measured
process, each exclusive of the others it calls. Then the machine's load
while it ran: other processes' load slows every figure, so compare the
figures within one run of the script.
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
import collections, functools
from dagster import DagsterEventType, DagsterInstance, materialize
from pyspark import SparkContext
from pyspark.sql import SparkSession
import medallion_assets.assets.bronze as bronze
import medallion_assets.resources as resources
from medallion_assets.catalog import LakeCatalog
from medallion_assets.definitions import build_definitions
from medallion_assets.io_manager import DeltaIOManager
imported = time.monotonic()

# Exclusive seconds per cause: a timed call inside another is taken out of the outer one's.
spent, stack = collections.defaultdict(lambda: [0, 0.0]), []
def timed(owner, name, cause):
    original = getattr(owner, name)
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        stack.append(0.0)
        began = time.monotonic()
        try:
            return original(*args, **kwargs)
        finally:
            total = time.monotonic() - began
            inner = stack.pop()
            if stack:
                stack[-1] += total
            spent[cause][0] += 1
            spent[cause][1] += total - inner
    setattr(owner, name, wrapper)

timed(SparkSession.Builder, "getOrCreate", "JVM and session start (getOrCreate, Ivy included)")
timed(resources, "plan_engine", "engine plan (Maven probe)")
timed(resources, "start_engine", "engine start on the session")
timed(resources.SparkResource, "_init_session", "session set-up around them")
timed(LakeCatalog, "register", "catalog: a table registered")
timed(LakeCatalog, "attach", "catalog: the lake attached")
timed(bronze, "work_of_selection", "deciding the run's work without Spark")
timed(bronze, "_run_to_end", "bronze streams: batches run and committed")
timed(DeltaIOManager, "load_input", "IO manager: inputs planned and read")
timed(DeltaIOManager, "handle_output", "IO manager: outputs written and committed")

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
    "import_s": round(imported - started, 2),
    "load_s": round(loaded - started, 2),
    "run_s": round(ran - loaded, 2),
    "session_s": round(session["ready"] - session["start"], 2) if "ready" in session else None,
    "jvm_started": SparkContext._active_spark_context is not None,
    "steps": {k: ("skipped" if v.get("skipped") else round(v["end"] - v["start"], 2)) for k, v in steps.items()
              if v.get("skipped") or "end" in v},
    "causes": {cause: [calls, round(seconds, 2)] for cause, (calls, seconds) in spent.items()},
    "materialized": len(result.get_asset_materialization_events()),
}))
"""

#: Ivy's summary of one ``spark.jars.packages`` resolution, which Spark prints to the driver's stderr.
IVY_REPORT = re.compile(r":: resolution report :: resolve (\d+)ms :: artifacts dl (\d+)ms")

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
    ivy = [(int(resolve), int(download)) for resolve, download in IVY_REPORT.findall(done.stderr)]
    return {**report, "process_s": wall, "ivy": ivy}


def describe(name: str, report: dict) -> list[str]:
    """Markdown lines of one run: the totals, the causes, then the steps by seconds."""
    session = "none started" if report["session_s"] is None else f"{report['session_s']} s"
    timed_steps = [float(s) for s in report["steps"].values() if s != "skipped"]
    in_steps = sum(timed_steps)
    causes = report["causes"]
    outside_steps = {c for c in causes if c.startswith(("JVM", "engine", "session", "catalog: the lake"))}
    inside = sum(seconds for cause, (_, seconds) in causes.items() if cause not in outside_steps)
    ivy = report["ivy"]
    lines = [
        f"### {name}: {report['process_s']} s wall",
        "",
        f"- interpreter start and imports: {report['import_s']} s; the definitions: "
        f"{report['load_s'] - report['import_s']:.2f} s",
        f"- the Dagster run: {report['run_s']} s, of which the Spark session's start: {session}",
        f"- the rest of the process (interpreter start before the first line, exit, JVM shutdown): "
        f"{report['process_s'] - report['load_s'] - report['run_s']:.1f} s",
        f"- Ivy resolutions (`spark.jars.packages`): {len(ivy)}"
        + (f", {', '.join(f'{r / 1000:.1f} s resolve + {d / 1000:.1f} s download' for r, d in ivy)}" if ivy else ""),
        f"- a Spark JVM started in the process: {'yes' if report['jvm_started'] else 'no'}; "
        f"{report['materialized']} materializations",
        "",
        "| cause | calls | s |",
        "| --- | ---: | ---: |",
    ]
    for cause, (calls, seconds) in sorted(causes.items(), key=lambda item: -item[1][1]):
        lines.append(f"| {cause} | {calls} | {seconds} |")
    lines += [
        f"| the steps' own code: transforms planned and run, checks (steps' time less the causes above) "
        f"| {len(timed_steps)} | {max(in_steps - inside, 0.0):.2f} |",
        f"| Dagster between the steps (the run less its steps) | | {max(report['run_s'] - in_steps, 0.0):.2f} |",
        "",
        "| step | s |",
        "| --- | ---: |",
    ]
    timed = sorted(report["steps"].items(), key=lambda item: 1.0 if item[1] == "skipped" else -float(item[1]))
    lines += [f"| {step} | {seconds} |" for step, seconds in timed]
    return [*lines, ""]


def plain_pass(env: dict[str, str], landing: Path, out: Path) -> float:
    """The wall seconds of one plain PySpark pass over ``landing``, in a new process."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(HERE / "benchmarks" / "plain_pipeline.py"), "--landing", str(landing), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"the plain pass failed:\n{done.stderr[-4000:]}")
    return round(time.monotonic() - started, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--engine", choices=ENGINES, default="delta-rs")
    parser.add_argument(
        "--plain", action="store_true", help="then time one plain PySpark pass over both batches, for the ratio"
    )
    args = parser.parse_args(argv)
    reports, plain_s = [], None
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
        if args.plain:
            plain_s = plain_pass(env, lake / "landing", Path(folder) / "plain")
            print(f"plain pass: {plain_s} s", file=sys.stderr, flush=True)
        samples = load.samples

    print(f"## The whole command, a fresh process each, {args.engine}, SF {args.scale_factor}\n")
    print(f"Machine: {os.cpu_count()} cores; {describe_load(samples)}.\n")
    if plain_s is not None:
        work = sum(report["process_s"] for name, report in reports if not name.startswith("nothing new"))
        print(
            f"Two materializations that did the work: {work:.1f} s wall; one plain PySpark pass over both "
            f"batches: {plain_s} s; **{work / plain_s:.2f}x**, process and session start included on both sides.\n"
        )
    for name, report in reports:
        print("\n".join(describe(name, report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
