"""How many JVMs a full materialization starts, and what starting one costs.

Run by hand from the repository root::

    python benchmarks/materialize_all.py [--scale-factor 0.01] [--runs 2]

It lands a small noisy TPC-H delivery (all batches) in a temporary lake, then,
in this one Python process, materializes every asset and check of the project's
Definitions (bronze, silver, gold; the landing asset excluded) ``--runs``
times, the first with the data and the others with nothing new. While it runs
a thread watches the process table for ``java`` processes descended from this
process, and ``SparkContext.__init__`` is counted. It prints JSON:

- ``session_start_s``: seconds to the first SparkSession (JVM start + context);
- ``jvms_started`` / ``spark_contexts_created``: over all runs, with each JVM's
  main class (spark-submit's short-lived launcher, then the driver);
- per run: wall seconds, steps executed, asset materializations, checks, the
  seconds of all steps and the ``--slowest`` steps (from each step's start and
  end events in the run's event log).

Each run also reports the CPU seconds of the Python driver and of the JVM,
the JVM's by kind of thread (the JIT compilers, the garbage collector,
Spark's task threads, the driver's), and the classes Spark's code generator
compiled with about how long that took. ``--by-step`` (with ``--spark-jobs``)
lists every step with the Spark jobs submitted during it, the seconds at
least one of them ran and the seconds outside them: the driver's planning,
Delta log reads, Python and Dagster between jobs.

``--profile FILE`` writes a cProfile of the last run (with ``--runs 2``: the
run with nothing new); ``python -m pstats FILE`` then shows where its time
goes (Delta log reads, Spark actions, Dagster's own work). ``--spark-jobs``
adds, per run, the Spark jobs it ran and their seconds (submission to
completion, from the session's UI), grouped by kind: delta-spark's snapshot
builds ("Compute snapshot for version N", jobs that build the file list of a
version a query reads first), its file filtering for a query, and every other
job (the queries and writes themselves). The delta-spark engine needs
``DELTA_SPARK_JARS``, as everywhere in the project.

Nothing is written outside the temporary folder.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from engine_runs import (
    CodegenSpend,
    CpuSplit,
    job_moment,
    jvm_pid,
    last_job_id,
    process_name,
    process_tree,
    seconds_inside_jobs,
    spark_jobs,
    spark_jobs_by_kind,
)


def _children_java(root_pid: int) -> set[int]:
    """PIDs of ``java`` processes whose ancestry includes ``root_pid`` (Linux /proc)."""
    return {pid for pid in process_tree(root_pid) if pid != root_pid and process_name(pid) == "java"}


def _main_class(pid: int) -> str:
    """The Java main class of a JVM (``org.apache.spark.launcher.Main``, ``...SparkSubmit``), from /proc."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().decode(errors="replace").split("\0")
    except OSError:
        return "?"
    spark_classes = [a for a in args if a.startswith("org.apache.spark.")]
    return spark_classes[0] if spark_classes else "?"


class JavaWatcher(threading.Thread):
    """Polls the process table and remembers every JVM this process started."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.seen: set[int] = set()
        self.classes: dict[int, str] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self._look()
            self._stop_event.wait(self.interval)

    def _look(self) -> None:
        for pid in _children_java(os.getpid()) - self.seen:
            self.seen.add(pid)
            self.classes[pid] = _main_class(pid)

    def stop(self) -> set[int]:
        self._stop_event.set()
        self.join()
        self._look()
        return self.seen


def _job_kind(job: dict) -> str:
    description = job.get("description") or ""
    if "Compute snapshot for version" in description:
        return "delta-spark snapshot builds"
    if "Filtering files for query" in description:
        return "delta-spark file filtering"
    return "other jobs (queries, writes)"


def step_intervals(records) -> dict[str, tuple[float, float]]:
    """Each step's start and end (success or failure) as Unix timestamps, from the run's event log."""
    started: dict[str, float] = {}
    intervals: dict[str, tuple[float, float]] = {}
    for record in records:
        event = record.dagster_event
        if event is None or event.step_key is None:
            continue
        if event.event_type_value == "STEP_START":
            started[event.step_key] = record.timestamp
        elif event.event_type_value in ("STEP_SUCCESS", "STEP_FAILURE") and event.step_key in started:
            intervals[event.step_key] = (started[event.step_key], record.timestamp)
    return intervals


def jobs_by_step(intervals: dict[str, tuple[float, float]], jobs: list[dict], after_job: int) -> dict[str, dict]:
    """Per step: its seconds, the Spark jobs submitted during it, the seconds at least one of them ran,
    and the rest (the driver's own work between jobs: planning, Delta log reads, Python, Dagster)."""
    done = [job for job in jobs if job["jobId"] > after_job and "completionTime" in job]
    report = {}
    for step, (start, end) in sorted(intervals.items(), key=lambda item: item[1][0]):
        inside = [job for job in done if start <= job_moment(job["submissionTime"]) <= end]
        in_jobs = seconds_inside_jobs(inside)
        report[step] = {
            "s": round(end - start, 2),
            "jobs": len(inside),
            "in_jobs_s": round(in_jobs, 2),
            "outside_jobs_s": round(end - start - in_jobs, 2),
        }
    return report


def step_seconds(records) -> dict[str, float]:
    """Seconds from each step's start to its success or failure, from the run's event log."""
    return {step: round(end - start, 2) for step, (start, end) in step_intervals(records).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 0.01: below it tpchgen repeats partsupp keys and the blocking key check fails the run.
    parser.add_argument("--scale-factor", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=2, help="materializations (the 2nd+ find nothing new)")
    parser.add_argument("--slowest", type=int, default=12, help="steps listed per run, slowest first")
    parser.add_argument("--profile", help="write cProfile stats of the last run to this file")
    parser.add_argument(
        "--spark-jobs",
        action="store_true",
        help="per run, the Spark jobs it ran and their seconds, by kind (from the session's UI)",
    )
    parser.add_argument(
        "--by-step",
        action="store_true",
        help="with --spark-jobs: per step, its Spark jobs and the seconds spent outside them",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="medallion-bench-") as folder:
        lake = Path(folder) / "lake"
        os.environ["MEDALLION_LAKE_ROOT"] = str(lake)
        os.environ["DAGSTER_HOME"] = str(Path(folder) / "dagster_home")
        Path(os.environ["DAGSTER_HOME"]).mkdir()

        from dagster import DagsterEventType, DagsterInstance, materialize
        from pyspark import SparkContext

        from medallion_assets.definitions import build_definitions
        from medallion_assets.pipelines.tpch.simulator import land_all

        contexts = {"created": 0}
        original_init = SparkContext.__init__

        def counting_init(self, *a, **kw):
            contexts["created"] += 1
            return original_init(self, *a, **kw)

        SparkContext.__init__ = counting_init

        land_all(lake / "landing", scale_factor=args.scale_factor, batches=2, seed=7)
        defs = build_definitions("local")
        assets = [a for a in defs.assets if not any(k.path[0] == "landing" for k in a.keys)]
        instance = DagsterInstance.ephemeral()

        watcher = JavaWatcher()
        watcher.start()
        started = time.monotonic()
        # Settings read through EnvVar resolve only when Dagster initializes the resource.
        warm = defs.resources["spark"].process_config_and_initialize()
        warm.spark_session  # noqa: B018 - what the first asset would pay
        session_start = time.monotonic() - started
        runs = []
        for number in range(args.runs):
            last_job = -1
            if args.spark_jobs:
                last_job = last_job_id(warm.spark_session)
            profiler = cProfile.Profile() if args.profile and number == args.runs - 1 else None
            cpu = CpuSplit(jvm_pid(warm.spark_session))
            codegen = CodegenSpend(warm.spark_session)
            started = time.monotonic()
            if profiler:
                profiler.enable()
            result = materialize(
                [*assets, *defs.asset_checks],
                resources=defs.resources,
                instance=instance,
                raise_on_error=False,
            )
            if profiler:
                profiler.disable()
                profiler.dump_stats(args.profile)
            elapsed = time.monotonic() - started
            cpu_s = cpu.seconds()
            codegen_spent = codegen.since()
            steps = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_SUCCESS]
            records = instance.all_logs(result.run_id)  # read once: the run's whole event log
            durations = step_seconds(records)
            all_jobs = spark_jobs(warm.spark_session) if args.spark_jobs else []
            jobs = spark_jobs_by_kind(all_jobs, last_job, _job_kind) if args.spark_jobs else None
            per_step = (
                jobs_by_step(step_intervals(records), all_jobs, last_job) if args.spark_jobs and args.by_step else None
            )
            runs.append(
                {
                    "run": number + 1,
                    "success": result.success,
                    "wall_s": round(elapsed, 1),
                    "steps": len(steps),
                    "materializations": len(result.get_asset_materialization_events()),
                    "checks": len(result.get_asset_check_evaluations()),
                    "checks_passed": sum(e.passed for e in result.get_asset_check_evaluations()),
                    "step_s_total": round(sum(durations.values()), 1),
                    "work_cpu": cpu_s,
                    **codegen_spent,
                    "slowest_steps_s": dict(sorted(durations.items(), key=lambda item: -item[1])[: args.slowest]),
                    **({"spark_jobs": jobs} if jobs is not None else {}),
                    **({"steps_by_spark_jobs": per_step} if per_step is not None else {}),
                }
            )
        jvms = watcher.stop()
        report = {
            "scale_factor": args.scale_factor,
            "cpus": os.cpu_count(),
            "session_start_s": round(session_start, 1),
            "jvms_started": len(jvms),
            # spark-submit first runs a short launcher JVM that only builds the driver's command line.
            "jvm_main_classes": sorted(watcher.classes.values()),
            "spark_contexts_created": contexts["created"],
            "runs": runs,
        }
        print(json.dumps(report, indent=2))
        warm.spark_session.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
