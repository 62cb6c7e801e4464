"""What the engine benchmarks share: a session per engine, one run per engine, /proc readings.

Not a benchmark itself; ``delta_vs_parquet.py``, ``merge_deletion_vectors.py``,
``gold_from_changes.py``, ``delta_fixed_costs.py``, ``materialize_all.py`` and
``small_merge.py`` import it (they run as scripts, so this folder is on ``sys.path``).

* :func:`build_session` builds the session through the project's
  :class:`~medallion_assets.resources.SparkResource`, so a benchmark gets what
  an embedded ``local[*]`` deployment gets: ``EMBEDDED_SPARK_CONFIG``, the
  engine's jars and settings from ``plan_engine``, and for delta-spark on a
  local master ``spark.databricks.delta.snapshotPartitions`` = the core count.
* One Python process holds one SparkContext, so :func:`run_engines` runs the
  script once per engine in a child process (``--engine NAME --json``) and
  collects the JSON each child prints.
* :func:`spark_jobs`, :func:`last_job_id`, :func:`spark_jobs_by_kind` and
  :func:`seconds_inside_jobs`: the jobs a session ran, from its UI's REST API,
  their seconds grouped by what they did, and how long any of them ran.
* Linux ``/proc`` readings (no psutil): CPU seconds of a process tree, resident
  and peak resident memory of a process, and a background load-average sampler.

Nothing runs at import.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

ENGINES = ("delta-rs", "delta-spark")

#: Added to the project's embedded settings: no UI, and the driver heap the
#: benchmarks have always used (the embedded default is Spark's 1 GB).
BENCHMARK_SPARK_CONFIG = {"spark.ui.enabled": "false", "spark.driver.memory": "4g"}

#: Delta's own default for ``spark.databricks.delta.snapshotPartitions``.
DELTA_DEFAULT_SNAPSHOT_PARTITIONS = "50"

#: How many tasks list a table's folders in delta-spark's VACUUM, and Spark's default
#: (``SparkResource`` sets it to the core count on an embedded session).
LISTING_TASKS = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
SPARK_DEFAULT_LISTING_TASKS = "10000"

_JSON_MARKER = "BENCHMARK-JSON "


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """``--engine``, ``--master``, ``--delta-spark-jars`` and the internal ``--json``."""
    parser.add_argument(
        "--engine",
        choices=("all", *ENGINES),
        default="all",
        help="engine to measure; 'all' runs each in a child process of its own (default)",
    )
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--delta-spark-jars",
        default=os.environ.get("DELTA_SPARK_JARS"),
        help="folder of the delta-spark jars, or a comma list of jars (default: $DELTA_SPARK_JARS)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the raw figures as one JSON line (what a child run hands back)"
    )
    parser.add_argument(
        "--from-json",
        nargs="+",
        metavar="FILE",
        help="measure nothing: print the table of runs saved from --json (one file per engine)",
    )


def check_engine_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not args.from_json and args.engine in ("all", "delta-spark") and not args.delta_spark_jars:
        parser.error(
            "delta-spark needs its jars: set DELTA_SPARK_JARS or pass --delta-spark-jars "
            "(or run --engine delta-rs only)"
        )


def delta_spark_session(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    app_name: str,
    extra_config: Mapping[str, str] | None = None,
):
    """The delta-spark session of a benchmark that measures delta-spark alone.

    From ``--master`` and ``--delta-spark-jars``.

    ``parser`` must have had :func:`add_delta_spark_arguments`; without jars it exits saying how to give them.
    """
    if not args.delta_spark_jars:
        parser.error("delta-spark needs its jars: set DELTA_SPARK_JARS or pass --delta-spark-jars")
    spark, _ = build_session("delta-spark", args.master, args.delta_spark_jars, app_name, extra_config)
    return spark


def add_delta_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """``--master`` and ``--delta-spark-jars``, for :func:`delta_spark_session`."""
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--delta-spark-jars",
        default=os.environ.get("DELTA_SPARK_JARS"),
        help="folder of the delta-spark jars, or a comma list of jars (default: $DELTA_SPARK_JARS)",
    )


def build_session(
    engine: str, master: str, jars: str | None, app_name: str, extra_config: Mapping[str, str] | None = None
):
    """A session with ``engine``, built by ``SparkResource`` as the project builds its embedded one.

    ``extra_config`` goes on top of :data:`BENCHMARK_SPARK_CONFIG` (e.g. the UI,
    for :func:`spark_jobs`).

    Returns:
        ``(spark, resource)``; ``resource.delta_engine_in_use`` is the engine.
    """
    from medallion_assets.resources import EMBEDDED_SPARK_CONFIG, SparkResource

    resource = SparkResource(
        master=master,
        app_name=app_name,
        delta_engine=engine,
        delta_spark_jars=jars if engine == "delta-spark" else None,
        spark_config={**EMBEDDED_SPARK_CONFIG, **BENCHMARK_SPARK_CONFIG, **(extra_config or {})},
    )
    spark = resource.spark_session
    spark.sparkContext.setLogLevel("ERROR")
    if resource.delta_engine_in_use.name != engine:
        raise RuntimeError(f"asked for {engine}, the session runs {resource.delta_engine_in_use.name}")
    return spark, resource


def describe_session(spark, engine: str) -> dict[str, Any]:
    """Versions and the Delta settings that matter to the figures."""
    from importlib.metadata import version

    facts: dict[str, Any] = {
        "engine": engine,
        "master": spark.sparkContext.master,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "spark": spark.version,
        "driver_memory": spark.conf.get("spark.driver.memory", None),
    }
    if engine == "delta-spark":
        jars = spark.conf.get("spark.jars", "") or ""
        names = [os.path.basename(j) for j in jars.split(",") if os.path.basename(j).startswith("delta-spark_")]
        facts["delta"] = names[0].removesuffix(".jar") if names else "delta-spark (platform)"
        facts["snapshot_partitions"] = spark.conf.get("spark.databricks.delta.snapshotPartitions", None)
    else:
        facts["delta"] = f"deltalake {version('deltalake')}"
    return facts


def spark_jobs(session) -> list[dict]:
    """Every job the session's UI still keeps (``spark.ui.retainedJobs``, 1000 by default)."""
    import urllib.request

    context = session.sparkContext
    url = f"{context.uiWebUrl}/api/v1/applications/{context.applicationId}/jobs"
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - the local session's own UI
        return json.load(response)


def jobs_so_far(session) -> int:
    """Spark jobs the session has run outside job groups (the status tracker keeps the last 1000).

    A stream's micro-batches run in a job group of their own and are not counted.
    """
    return len(session.sparkContext.statusTracker().getJobIdsForGroup())


class CodegenSpend:
    """What Spark's code generator compiles in a session's JVM from now until :meth:`since`, from its own metrics.

    A class comes from the generator's cache when the same source was compiled
    before and is still among ``spark.sql.codegen.cache.maxEntries``; each one
    compiled is also code the JIT compiles again. The seconds are an estimate:
    the metric is a histogram of milliseconds per class whose sample favours
    recent compilations, so its mean times the classes counted is what is
    reported. Good enough to tell whether compiling generated code is a large
    part of a run's driver time, not to compare close figures.
    """

    def __init__(self, session) -> None:
        self._metric = session._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
        self._classes, self._seconds = self._so_far()

    def _so_far(self) -> tuple[int, float]:
        count = int(self._metric.getCount())
        return count, self._metric.getSnapshot().getMean() * count / 1000.0

    def since(self) -> dict[str, Any]:
        """``classes_generated`` and ``codegen_compile_s`` (estimated) since this was created."""
        classes, seconds = self._so_far()
        return {"classes_generated": classes - self._classes, "codegen_compile_s": round(seconds - self._seconds, 1)}


def last_job_id(session) -> int:
    """The newest job the session's UI knows (-1 before any): what :func:`spark_jobs_by_kind` counts after."""
    return max((job["jobId"] for job in spark_jobs(session)), default=-1)


def job_moment(text: str) -> float:
    """A UI job's ``submissionTime`` or ``completionTime`` as a Unix timestamp."""
    from datetime import datetime

    return datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def seconds_inside_jobs(jobs: Sequence[dict]) -> float:
    """How long at least one of ``jobs`` ran: their intervals' union (jobs that overlap count once)."""
    intervals = sorted(
        (job_moment(job["submissionTime"]), job_moment(job["completionTime"]))
        for job in jobs
        if "completionTime" in job
    )
    total, end = 0.0, float("-inf")
    for start, stop in intervals:
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def spark_jobs_by_kind(jobs: list[dict], after_job: int, kind: Callable[[dict], str]) -> dict[str, dict[str, float]]:
    """Count and seconds of the jobs numbered above ``after_job``, grouped by ``kind(job)``.

    Seconds run from a job's submission to its completion, so jobs that run
    side by side count twice.
    """
    kinds: dict[str, dict[str, float]] = {}
    for job in jobs:
        if job["jobId"] <= after_job or "completionTime" not in job:
            continue
        entry = kinds.setdefault(kind(job), {"jobs": 0, "seconds": 0.0})
        entry["jobs"] += 1
        entry["seconds"] += job_moment(job["completionTime"]) - job_moment(job["submissionTime"])
    # Rounded once summed: many small jobs take under 0.05 s each.
    return {name: {"jobs": entry["jobs"], "seconds": round(entry["seconds"], 1)} for name, entry in kinds.items()}


def emit_json(result: dict[str, Any]) -> None:
    print(_JSON_MARKER + json.dumps(result), flush=True)


def last_result(output: str) -> dict[str, Any] | None:
    """The last result :func:`emit_json` printed into ``output``, or None if it printed none."""
    lines = [line for line in output.splitlines() if line.startswith(_JSON_MARKER)]
    return json.loads(lines[-1][len(_JSON_MARKER) :]) if lines else None


def run_child(argv: Sequence[str], what: str) -> dict[str, Any]:
    """Run ``python *argv`` in a child process (a fresh process, a fresh peak) and return its :func:`emit_json` result.

    Its stderr is kept and shown only when it fails or prints no result; ``what`` names the run in that error.
    """
    child = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=False)
    result = last_result(child.stdout)
    if child.returncode or result is None:
        raise SystemExit(f"{what} failed (exit status {child.returncode}):\n{child.stderr[-3000:]}")
    return result


def load_results(files: Sequence[str]) -> list[dict[str, Any]]:
    """The results that ``--json`` runs printed into ``files`` (the last result line of each)."""
    results = []
    for name in files:
        with open(name, encoding="utf-8") as handle:
            result = last_result(handle.read())
        if result is None:
            raise SystemExit(f"{name} holds no result line of a --json run")
        results.append(result)
    return results


def run_engines(script: str, argv: Sequence[str], engines: Sequence[str] = ENGINES) -> list[dict[str, Any]]:
    """Run ``script`` once per engine in a child process and return what each printed as JSON.

    ``argv`` is passed on (``--engine``/``--json`` are added); the children's
    stderr (Spark's warnings) goes to this process's stderr.
    """
    results = []
    for engine in engines:
        print(f"running {engine} ...", file=sys.stderr, flush=True)
        child = subprocess.run(
            [sys.executable, script, *argv, "--engine", engine, "--json"],
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if child.returncode != 0:
            raise SystemExit(f"the {engine} run failed (exit status {child.returncode}); its error is above")
        result = last_result(child.stdout)
        if result is None:
            raise RuntimeError(f"the {engine} run printed no result:\n{child.stdout}")
        results.append(result)
    return results


def run_benchmark(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    script: str,
    run_one_engine: Callable[[argparse.Namespace], dict[str, Any]],
    print_markdown: Callable[[list[dict[str, Any]]], None],
) -> None:
    """The command line every engine benchmark shares.

    ``--from-json`` prints saved runs; ``--engine all`` runs ``script`` once per
    engine in a child process; one ``--engine`` runs here (``--json``: print
    its result for a parent to collect).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    check_engine_arguments(parser, args)
    if args.from_json:
        results = load_results(args.from_json)
    elif args.engine == "all":
        results = run_engines(script, without_engine_arguments(argv))
    else:
        results = [run_one_engine(args)]
        if args.json:
            emit_json(results[0])
            return
    print_markdown(results)


def without_engine_arguments(argv: Sequence[str]) -> list[str]:
    """``argv`` minus ``--engine X`` / ``--engine=X`` and ``--json``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--engine":
            skip = True
        elif not (arg.startswith("--engine=") or arg == "--json"):
            kept.append(arg)
    return kept


# --- /proc readings ---------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def _read_stat(path: str) -> tuple[str, list[str]] | None:
    """A process's or thread's ``stat`` file: its name and the fields after it (``None`` once it is gone)."""
    try:
        with open(path, encoding="utf-8") as handle:
            stat = handle.read()
    except OSError:
        return None
    # The name may hold spaces and parentheses; after it, [0] is the state, [1] the parent.
    return stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the process's name (``None`` once it is gone)."""
    found = _read_stat(f"/proc/{pid}/stat")
    return found[1] if found else None


def process_name(pid: int) -> str | None:
    """The name the kernel gives a process (``java``, ``python3.11``; ``None`` once it is gone)."""
    found = _read_stat(f"/proc/{pid}/stat")
    return found[0] if found else None


def _own_cpu_ticks(fields: list[str]) -> int:
    """utime + stime of a stat line's fields (its reaped children not counted)."""
    return int(fields[11]) + int(fields[12])


def process_tree(root: int) -> dict[int, list[str]]:
    """``root`` and its live descendants: pid -> its :func:`stat_fields`."""
    stats = {
        int(entry): fields
        for entry in os.listdir("/proc")
        if entry.isdigit() and (fields := stat_fields(int(entry))) is not None
    }
    parents = {pid: int(fields[1]) for pid, fields in stats.items()}
    tree = {}
    for pid, fields in stats.items():
        ancestor = pid
        while ancestor not in (root, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            tree[pid] = fields
    return tree


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds of ``root`` (default: this process) and all its descendants.

    Counts live processes and, through ``cutime``/``cstime``, the children
    they have reaped: here the JVM and Spark's Python workers, whatever the
    other processes on the machine do.
    """
    tree = process_tree(os.getpid() if root is None else root)
    # utime, stime, cutime, cstime
    return sum(sum(int(f) for f in fields[11:15]) for fields in tree.values()) / _TICKS


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one live process, its reaped children not counted."""
    fields = stat_fields(pid)
    if fields is None:
        raise ProcessLookupError(pid)
    return _own_cpu_ticks(fields) / _TICKS


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of each kind of thread of a live process, by its Linux thread name without its number.

    For a JVM the names tell its own threads apart: the JIT compilers ("C2
    CompilerThre", "C1 CompilerThre"), the garbage collector ("GC Thread",
    "G1 ..."), Spark's task threads ("Executor task ...") and the driver's
    ("Thread-", py4j's, "dag-scheduler-...").
    """
    kinds: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        found = _read_stat(f"/proc/{pid}/task/{task}/stat")
        if found is None:
            continue
        name, fields = found
        # "GC Thread#1" and "Thread-7" are kinds with a number; "C2 CompilerThre" is a kind.
        kind = name.rstrip("0123456789").rstrip("#-_ ")
        kinds[kind] = kinds.get(kind, 0.0) + _own_cpu_ticks(fields) / _TICKS
    return kinds


class CpuSplit:
    """CPU seconds of this Python process and of a JVM from now until :meth:`seconds`, the JVM's by kind of thread.

    Spark's Python workers are not counted. A JVM thread that ended in between
    took its seconds with it (Spark's pools retire idle threads): they are
    reported as "threads that ended".
    """

    def __init__(self, jvm: int) -> None:
        self.jvm = jvm
        self._python = time.process_time()
        self._threads = thread_cpu_seconds(jvm)
        self._jvm_total = process_cpu_seconds(jvm)

    def seconds(self, *, smallest: float = 0.5) -> dict[str, Any]:
        """``python_driver``, ``jvm`` and ``jvm_by_thread`` (kinds with at least ``smallest`` seconds)."""
        threads = {
            name: seconds - self._threads.get(name, 0.0) for name, seconds in thread_cpu_seconds(self.jvm).items()
        }
        jvm = process_cpu_seconds(self.jvm) - self._jvm_total
        threads["threads that ended"] = jvm - sum(threads.values())
        return {
            "python_driver": round(time.process_time() - self._python, 1),
            "jvm": round(jvm, 1),
            "jvm_by_thread": {
                name: round(value, 1)
                for name, value in sorted(threads.items(), key=lambda item: -item[1])
                if value >= smallest
            },
        }


def memory_kb(pid: int, field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of a process, in KiB."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss(pid: int) -> None:
    """Set a process's ``VmHWM`` back to its current ``VmRSS`` (Linux ``clear_refs`` 5)."""
    with open(f"/proc/{pid}/clear_refs", "w", encoding="utf-8") as handle:
        handle.write("5")


def jvm_pid(spark) -> int:
    """The process id of the session's JVM (in local mode: driver and executors)."""
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


class PeriodicSampler:
    """Calls ``read`` every ``interval`` seconds on a thread while in a ``with`` block; keeps what it returns."""

    def __init__(self, read: Callable[[], Any], interval: float) -> None:
        self.read = read
        self.interval = interval
        self.samples: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(self.read())
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeriodicSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _one_minute_load() -> float:
    with open("/proc/loadavg", encoding="utf-8") as handle:
        return float(handle.read().split()[0])


class LoadSampler(PeriodicSampler):
    """Samples the 1-minute load average every ``interval`` seconds while in a ``with`` block."""

    def __init__(self, interval: float = 5.0) -> None:
        super().__init__(_one_minute_load, interval)


def describe_load(samples: Sequence[float]) -> str:
    if not samples:
        return "load average: not sampled"
    return (
        f"1-minute load average {min(samples):.1f} to {max(samples):.1f} "
        f"(median {statistics.median(samples):.1f}, {len(samples)} samples)"
    )


class Timings:
    """Wall and CPU seconds of named steps, several samples each.

    ``settle`` runs, untimed, before each step: what the previous step left
    for the machine to finish (e.g. its files' write-back) then lands
    outside every step instead of on whichever runs next.
    """

    def __init__(self, settle: Callable[[], None] | None = None) -> None:
        self.wall: dict[str, list[float]] = {}
        self.cpu: dict[str, list[float]] = {}
        self.settle = settle

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.settle is not None:
            self.settle()
        cpu_start, start = tree_cpu_seconds(), time.perf_counter()
        value = fn()
        elapsed, cpu = time.perf_counter() - start, tree_cpu_seconds() - cpu_start
        self.wall.setdefault(name, []).append(elapsed)
        self.cpu.setdefault(name, []).append(cpu)
        return value

    def medians(self) -> dict[str, dict[str, float]]:
        return {
            name: {
                "wall": statistics.median(self.wall[name]),
                "cpu": statistics.median(self.cpu[name]),
                "samples": len(self.wall[name]),
            }
            for name in self.wall
        }

    def paired_ratios(self, pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, float]]:
        """Per step, the median of its sample-by-sample ratios to its baseline's (the i-th to the i-th).

        A step and its baseline that run in the same repeat share that
        moment's load, so a drift of the machine's load over the minutes a run
        takes moves both; the ratio of the two medians takes samples from
        different moments. Only for steps with as many samples as their baseline.
        ``wall_quartiles`` holds the first and third quartiles of the wall
        ratios (with two samples or more): how far one repeat's ratio moves.
        """
        paired = {}
        for name, base in pairs:
            if name in self.wall and base in self.wall and len(self.wall[name]) == len(self.wall[base]):
                ratios = {
                    kind: [step / baseline for step, baseline in zip(times[name], times[base], strict=False)]
                    for kind, times in (("wall", self.wall), ("cpu", self.cpu))
                }
                paired[name] = {kind: statistics.median(values) for kind, values in ratios.items()}
                if len(ratios["wall"]) > 1:
                    first, _, third = statistics.quantiles(ratios["wall"], n=4)
                    paired[name]["wall_quartiles"] = (first, third)
        return paired
