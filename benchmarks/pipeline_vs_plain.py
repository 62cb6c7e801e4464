"""A whole Dagster materialization against the same work in plain PySpark.

Run by hand from the repository root::

    python benchmarks/pipeline_vs_plain.py --scale-factor 0.1 --engines delta-spark delta-rs

(delta-spark needs ``DELTA_SPARK_JARS``, as the project does.) It

1. lands a noisy TPC-H delivery at ``--scale-factor`` with every batch
   (``medallion-assets simulate --all``), or takes an already landed one
   (``--landing``);
2. runs ``benchmarks/plain_pipeline.py`` on it in a fresh process: the
   baseline, landing -> silver -> gold with Spark's own Parquet;
3. for each engine, in a fresh process, materializes every asset and asset
   check of the project's Definitions (bronze, silver, gold, all months of
   ``gold.daily_revenue``; the landing asset excluded) into a new lake whose
   ``landing/`` is that delivery, on a persistent Dagster instance in a
   temporary ``DAGSTER_HOME``, as ``dagster dev`` would.

Both kinds of process start their SparkSession before the work is timed, so
"work" compares the same thing; process wall time (imports, JVM start, stop)
and the CPU seconds of the process tree (driver, JVM, Python workers; less
sensitive to a busy machine than wall time) are shown too, and so is memory:
each process's peak resident size (Python driver, JVM, Python workers) and,
for the Dagster run, the heap its JVM still uses once the run is over (caches
dropped, after a full collection), which is what would grow with the data if
the driver kept something per row or per file.

Where the Dagster run's time goes comes from its event log (STEP_START to
STEP_SUCCESS per step, and within a step the LOADED_INPUT, STEP_OUTPUT and
HANDLED_OUTPUT events), and from probes this script installs in the Dagster
process: every Spark action (``count``, ``collect``, ``first``, ``isEmpty``,
writes, MERGE, streaming queries, Delta ``detail``/``history``/``forPath``...)
is timed with its call site in the project (e.g.
``storage/client.py:describe``), and so are the IO manager's own methods.
The probes change no behaviour; ``--ablate`` runs what-ifs that do (for
measuring a fix before making it): ``cache`` makes ``.cache()`` a no-op,
``drift-scan`` skips silver's schema-drift scan. (``lite-metadata``, output
metadata from the Delta log only, is what the IO manager now does.)

Runs on 2 cores spread by about 5% between two runs of the same work, so
``--rounds N`` runs the plain script and the Dagster runs N times in turn
and reports each round's ratio and their median; the first round's runs are
the ones the report describes in detail.

It prints Markdown: totals and ratios, the top steps, time per layer, and the
calls the framework adds, with their seconds. ``--json`` keeps every number.
Nothing is written outside ``--folder`` (a temporary folder by default).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from engine_runs import (
    CodegenSpend,
    CpuSplit,
    PeriodicSampler,
    jobs_so_far,
    jvm_pid,
    process_tree,
    stat_fields,
    tree_cpu_seconds,
)

HERE = Path(__file__).resolve().parent
PLAIN_SCRIPT = HERE / "plain_pipeline.py"


# --------------------------------------------------------------------------
# Peak memory of a process tree (Linux /proc)
# --------------------------------------------------------------------------


def tree_peak_memory(root: int) -> dict[str, float]:
    """Peak resident MB so far (the kernel's ``VmHWM``) of ``root``, its JVM and its other Python processes.

    ``python_driver_mb`` is ``root`` itself (the Python driver); ``jvm_mb`` is its
    largest ``java`` descendant, which in a local session is the driver *and* the
    executor, so it includes cached partitions and shuffle buffers up to the
    heap's limit; ``python_workers_mb`` is the largest other Python descendant
    (Spark's Python workers).
    """
    peaks = {"python_driver_mb": 0.0, "jvm_mb": 0.0, "python_workers_mb": 0.0}
    for pid in process_tree(root):
        try:
            status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if "VmHWM" not in fields:
            continue
        mb = int(fields["VmHWM"].split()[0]) / 1024
        name = fields.get("Name", "").strip()
        kind = (
            "python_driver_mb"
            if pid == root
            else "jvm_mb"
            if name == "java"
            else ("python_workers_mb" if name.startswith("python") or name.startswith("pyspark") else None)
        )
        if kind:
            peaks[kind] = max(peaks[kind], mb)
    return peaks


def driver_memory_sample() -> tuple[float, float, float]:
    """(time, this process's resident MB, MB allocated by Arrow's default pool)."""
    import pyarrow as pa

    with open("/proc/self/statm", encoding="utf-8") as handle:
        resident = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return time.time(), resident, pa.total_allocated_bytes() / 2**20


def step_events(records) -> list[dict]:
    """The run's Dagster events from its event log: time, type and step (``None`` for run events)."""
    return [
        {"t": record.timestamp, "type": record.dagster_event.event_type_value, "step": record.dagster_event.step_key}
        for record in records
        if record.dagster_event is not None
    ]


def _samples_in(
    samples: list[tuple[float, float, float]], start: float, end: float
) -> tuple[float, list[tuple[float, float, float]]] | None:
    """The resident MB when ``start`` came (the last sample before it) and the samples up to ``end``; None if none."""
    inside = [s for s in samples if start <= s[0] <= end]
    if not inside:
        return None
    before = [s for s in samples if s[0] < start]
    return (before[-1][1] if before else inside[0][1]), inside


def memory_by_step(samples: list[tuple[float, float, float]], events: list[dict], top: int = 8) -> list[dict]:
    """The steps in whose time the Python driver's resident size rose most, with its peak and Arrow's."""
    windows: dict[str, list[float]] = {}
    for event in events:
        if event["step"] and event["type"] == "STEP_START":
            windows[event["step"]] = [event["t"], float("inf")]
        elif event["step"] in windows and event["type"] in ("STEP_SUCCESS", "STEP_FAILURE"):
            windows[event["step"]][1] = event["t"]
    rows = []
    for step, (start, end) in windows.items():
        window = _samples_in(samples, start, end)
        if window is None:
            continue
        entry_mb, inside = window
        rows.append(
            {
                "step": step,
                "rss_at_start_mb": round(entry_mb),
                "rss_peak_mb": round(max(s[1] for s in inside)),
                "rise_mb": round(max(s[1] for s in inside) - entry_mb),
                "arrow_peak_mb": round(max(s[2] for s in inside)),
            }
        )
    return sorted(rows, key=lambda row: -row["rise_mb"])[:top]


def memory_by_call(samples: list[tuple[float, float, float]], records: list[dict], top: int = 8) -> list[dict]:
    """The probed calls (by kind and call site) in whose time the Python driver's resident size rose most.

    A call's rise is its peak sample less the last sample before it started, so a
    call shorter than the sampling interval may show none. Regions are left out:
    they hold the actions they wrap, which are listed themselves.
    """
    by_site: dict[tuple[str, str], dict] = {}
    for record in records:
        window = None if record["region"] else _samples_in(samples, record["t0"], record["t1"])
        if window is None:
            continue
        entry_mb, inside = window
        peak_mb = max(s[1] for s in inside)
        site = record["site"].rsplit(":", 1)[0]  # file:function, as by_site groups them
        row = by_site.setdefault(
            (record["kind"], site),
            {"call": record["kind"], "site": site, "calls": 0, "largest_rise_mb": 0, "rss_peak_mb": 0},
        )
        row["calls"] += 1
        row["largest_rise_mb"] = max(row["largest_rise_mb"], round(peak_mb - entry_mb))
        row["rss_peak_mb"] = max(row["rss_peak_mb"], round(peak_mb))
    return sorted(by_site.values(), key=lambda row: -row["largest_rise_mb"])[:top]


def jvm_live_heap(spark, top: int = 10) -> tuple[float | None, list[dict]]:
    """What the session JVM still holds: its live heap in MB and the classes holding most of it.

    ``jcmd <pid> GC.class_histogram`` after the session's caches and Python's garbage are dropped:
    the histogram collects first, so it counts live objects only (the heap's
    "used" figure after ``System.gc()`` also counted blocks still being
    released). ``(None, [])`` where there is no local JVM (Spark Connect) or no
    ``jcmd`` (a JRE without the JDK's tools).
    """
    jvm = getattr(spark, "_jvm", None)
    if jvm is None or shutil.which("jcmd") is None:
        return None, []
    spark.catalog.clearCache()
    # Python's garbage first: a DataFrame that only garbage refers to (a reference cycle) keeps its Java
    # plan alive, and with it the broadcast relations its query built, until Python collects it.
    gc.collect()
    pid = str(jvm.java.lang.ProcessHandle.current().pid())
    try:
        # Collections first let Spark's cleaner drop the broadcast and shuffle blocks of
        # objects the driver no longer references (it acts on their weak references, after
        # a GC); only then is the histogram what the driver keeps. Two of them: after one,
        # the last query's broadcast hash relations (long arrays, 70 MB for daily_revenue
        # at SF 1) were still there, and after a second one they were gone.
        for _ in range(2):
            subprocess.run(["jcmd", pid, "GC.run"], capture_output=True, timeout=120)
            time.sleep(3)
        text = subprocess.run(["jcmd", pid, "GC.class_histogram"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None, []
    rows, total = [], None
    for line in text.splitlines():
        parts = line.split()
        # "   1:       1234567      98765432  [B (java.base@17)" ... "Total   2345678   123456789"
        if len(parts) >= 4 and parts[0].endswith(":") and parts[1].isdigit() and parts[2].isdigit():
            rows.append({"class": parts[3], "instances": int(parts[1]), "mb": round(int(parts[2]) / 2**20, 1)})
        elif len(parts) == 3 and parts[0] == "Total" and parts[2].isdigit():
            total = round(int(parts[2]) / 2**20)
    return total, rows[:top]


def release_objects_pinned_by_dagster() -> int:
    """Drop what Dagster keeps reachable after an in-process run: a finished step's context and frames.

    Dagster's ``@record`` classes compile their constructor at their first
    instantiation in a process, with a copy of the calling frame's locals in
    the new function's namespace (``dagster_shared.record``, Dagster 1.13).
    Whatever those locals were stays reachable for the life of the process:
    a step's ``StepExecutionContext``, and with it the run's output capture
    (every output of ``materialize()``), or the DataFrame an IO manager was
    describing when it first built a ``TableColumn``. A DataFrame keeps its Java
    plan and the broadcast relations of its query: 68 MB of ``daily_revenue``'s
    at SF 1. A run of ``dagster dev`` or a schedule runs in a process of its
    own, so only in-process runs (tests, notebooks, these benchmarks) keep
    them. Removed here (the compiled constructors use the types of their
    namespace, not these instances), the live heap after a run is what the
    project's driver keeps.

    Returns:
        How many objects were removed from those namespaces.
    """
    heavy = ("pyspark.", "dagster._core.execution.context.", "medallion_assets.")
    released = 0
    for obj in gc.get_objects():
        if not (isinstance(obj, types.FunctionType) and obj.__name__ == "__checked_new__"):
            continue
        namespace = obj.__globals__
        for name, value in list(namespace.items()):
            if not isinstance(value, type) and type(value).__module__.startswith(heavy):
                del namespace[name]
                released += 1
    return released


def heap_after_result_dropped(spark, top: int = 10) -> dict:
    """The JVM's live heap once the caller dropped ``materialize()``'s result, before and after the release.

    Returns:
        The report's fields: ``jvm_live_heap_with_outputs_pinned_by_dagster_mb``
        (what Dagster still pinned), ``objects_pinned_by_dagster`` (what
        :func:`release_objects_pinned_by_dagster` removed), and
        ``jvm_live_heap_mb`` and ``jvm_live_heap_by_class`` after it (what the
        project's driver keeps).
    """
    pinned_mb, _ = jvm_live_heap(spark, top=0)
    released = release_objects_pinned_by_dagster()
    live_mb, by_class = jvm_live_heap(spark, top=top)
    return {
        "jvm_live_heap_mb": live_mb,
        "jvm_live_heap_with_outputs_pinned_by_dagster_mb": pinned_mb,
        "objects_pinned_by_dagster": released,
        "jvm_live_heap_by_class": by_class,
    }


def process_age_seconds(pid: int) -> float:
    """Seconds since ``pid`` started (field 22 of /proc/PID/stat, in clock ticks after boot)."""
    fields = stat_fields(pid)
    with open("/proc/uptime", encoding="utf-8") as handle:
        uptime = float(handle.read().split()[0])
    return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK") if fields else float("nan")


def load_average() -> str:
    try:
        return " / ".join(f"{v:.1f}" for v in os.getloadavg())
    except OSError:
        return "?"


# --------------------------------------------------------------------------
# Probes (Dagster process only): time Spark actions and IO manager calls
# --------------------------------------------------------------------------

_PROJECT_MARK = f"{os.sep}medallion_assets{os.sep}"
_ENGINE_PARTS = (
    f"{os.sep}medallion_assets{os.sep}delta{os.sep}",
    f"{os.sep}medallion_assets{os.sep}storage{os.sep}engines.py",
)


class Probes:
    """Timed calls: actions (outermost only, so nothing is counted twice) and regions (inclusive)."""

    def __init__(self) -> None:
        self.records: list[dict] = []
        self.cache_sites: dict[str, int] = defaultdict(int)
        self._local = threading.local()

    @staticmethod
    def site(skip: int = 2) -> str:
        """The innermost calling frame of the project outside the engines: ``file:function:line``."""
        frame = sys._getframe(skip)
        while frame is not None:
            name = frame.f_code.co_filename
            if _PROJECT_MARK in name and not any(part in name for part in _ENGINE_PARTS):
                short = name.split(_PROJECT_MARK, 1)[1]
                return f"{short}:{frame.f_code.co_name}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def action(self, owner: type, method: str, kind: str | None = None) -> None:
        descriptor = owner.__dict__.get(method)
        if descriptor is None or getattr(descriptor, "_probed", False):
            return
        original = descriptor.__func__ if isinstance(descriptor, (classmethod, staticmethod)) else descriptor

        def wrap_like(_: object, timed):
            return type(descriptor)(timed) if isinstance(descriptor, (classmethod, staticmethod)) else timed

        label = kind or f"{owner.__name__}.{method}"
        probes = self

        def timed(*args, **kwargs):
            depth = getattr(probes._local, "depth", 0)
            if depth:
                return original(*args, **kwargs)
            site = probes.site()
            probes._local.depth = 1
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                probes._local.depth = 0
                probes.records.append({"t0": started, "t1": time.time(), "kind": label, "site": site, "region": False})

        timed._probed = True  # type: ignore[attr-defined]
        setattr(owner, method, wrap_like(original, timed))

    def region(self, owner, method: str, label: str) -> None:
        original = getattr(owner, method, None)
        if original is None or getattr(original, "_probed", False):
            return
        probes = self

        def timed(*args, **kwargs):
            site = probes.site()
            started = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                probes.records.append({"t0": started, "t1": time.time(), "kind": label, "site": site, "region": True})

        timed._probed = True  # type: ignore[attr-defined]
        try:
            setattr(owner, method, timed)
        except (TypeError, AttributeError, ValueError):
            pass

    def count_caches(self, owner: type, method: str, disable: bool) -> None:
        original = owner.__dict__[method]
        probes = self

        def counted(frame, *args, **kwargs):
            probes.cache_sites[probes.site()] += 1
            return frame if disable else original(frame, *args, **kwargs)

        setattr(owner, method, counted)


def install_probes(ablate: set[str]) -> Probes:
    """Wrap Spark actions, Delta calls and the IO manager's methods with timers."""
    from pyspark.sql.classic.dataframe import DataFrame
    from pyspark.sql.readwriter import DataFrameWriter
    from pyspark.sql.streaming.query import StreamingQuery

    probes = Probes()
    for method in ("count", "collect", "first", "head", "take", "isEmpty", "toArrow", "toPandas"):
        probes.action(DataFrame, method, f"DataFrame.{method}")
    for method in ("save", "parquet", "saveAsTable"):
        probes.action(DataFrameWriter, method, f"write.{method}")
    probes.action(StreamingQuery, "awaitTermination", "stream.awaitTermination")
    for method in ("cache", "persist"):
        probes.count_caches(DataFrame, method, disable="cache" in ablate)

    try:
        import delta.tables as delta_spark

        for method in ("forPath", "isDeltaTable", "detail", "history", "toDF"):
            probes.action(delta_spark.DeltaTable, method, f"delta-spark DeltaTable.{method}")
        probes.action(delta_spark.DeltaMergeBuilder, "execute", "delta-spark MERGE")
        probes.action(delta_spark.DeltaTableBuilder, "execute", "delta-spark create table")
    except ImportError:
        pass
    import medallion_assets.delta as delta_rs

    for method in ("forPath", "isDeltaTable", "detail", "history", "toDF", "changes"):
        probes.action(delta_rs.DeltaTable, method, f"delta-rs DeltaTable.{method}")
    probes.action(delta_rs.DeltaMergeBuilder, "execute", "delta-rs MERGE")
    probes.action(delta_rs.DeltaTableBuilder, "execute", "delta-rs create table")

    from medallion_assets.io_manager import manager as io_manager
    from medallion_assets.io_manager import metadata as io_metadata
    from medallion_assets.storage import client as io_client
    from medallion_assets.storage import engines as engine
    from medallion_assets.storage.arrow_client import ArrowDeltaClient

    # The IO manager's small writes, run by deltalake in this process (the driver's memory follows them).
    for method, kind in (
        ("merge_into_existing", "deltalake MERGE"),
        ("append_to_existing", "deltalake append"),
        ("write", "deltalake write"),
    ):
        probes.action(ArrowDeltaClient, method, kind)

    for cls in (engine.DeltaSparkEngine, engine.DeltaRsEngine):
        probes.action(cls, "latest_commit", "engine.latest_commit")
        probes.action(cls, "table_state", "engine.table_state")
        probes.action(cls, "read", "engine.read")
        probes.action(cls, "read_inserts", "engine.read_inserts")

    from dagster import DagsterInstance

    probes.action(DagsterInstance, "get_latest_materialization_event", "dagster instance: latest materialization")

    # Regions: inclusive time of the IO manager's parts (actions inside them are recorded too).
    probes.region(io_client.DeltaTableClient, "write", "io: write")
    probes.region(io_client.DeltaTableClient, "describe", "io: output metadata: describe")
    probes.region(io_metadata, "markdown_preview", "io: output metadata: preview")
    probes.region(io_manager.DeltaIOManager, "load_input", "io: load_input")
    probes.region(io_manager.DeltaIOManager, "handle_output", "io: handle_output")
    return probes


def apply_ablations(ablate: set[str]) -> None:
    """What-ifs that change behaviour, to measure a fix before it is made (``cache`` is done by the probes)."""
    if "drift-scan" in ablate:
        from pyspark.sql import functions as F

        from medallion_assets.pipelines.tpch import transforms as T

        def no_scan(orders_raw):
            return orders_raw.limit(0).select(
                F.lit("order").alias("level"), F.lit("x").alias("field"), F.lit(0).cast("long").alias("rows")
            )

        T.drifted_order_fields = no_scan


# --------------------------------------------------------------------------
# The Dagster process
# --------------------------------------------------------------------------


def dagster_child(args: argparse.Namespace) -> int:
    """Materialize everything in this process; write what happened as JSON."""
    lake = Path(args.lake)
    os.environ["MEDALLION_LAKE_ROOT"] = str(lake)
    ablate = set(args.ablate or [])
    probes = install_probes(ablate) if not args.no_probes else None
    apply_ablations(ablate)

    from dagster import DagsterEventType, DagsterInstance, materialize

    from medallion_assets.definitions import build_definitions

    defs = build_definitions("local")
    assets = [a for a in defs.assets if not any(k.path[0] == "landing" for k in a.keys)]
    instance = DagsterInstance.ephemeral() if args.ephemeral_instance else DagsterInstance.get()

    # The session is started before the timed work, as the plain script does. The
    # definitions' resource is configured only when a run starts, so a twin with the
    # same engine settings starts it; the run's resource then gets the same session (getOrCreate).
    from medallion_assets.resources import SparkResource, engine_settings

    started = time.time()
    spark_resource = SparkResource(**engine_settings())
    spark_resource.spark_session  # noqa: B018
    engine = spark_resource.delta_engine_in_use.name
    session_start = time.time() - started

    work_cpu, jobs_before = CpuSplit(jvm_pid(spark_resource.spark_session)), jobs_so_far(spark_resource.spark_session)
    codegen = CodegenSpend(spark_resource.spark_session)
    run_started = time.time()
    # Matched to the step running at each sample (memory_by_step): which step grows the driver.
    with PeriodicSampler(driver_memory_sample, interval=0.2) as driver_memory:
        result = materialize(
            [*assets, *defs.asset_checks],
            resources=defs.resources,
            instance=instance,
            raise_on_error=False,
        )
    run_ended = time.time()
    work_cpu_s = work_cpu.seconds()
    spark_jobs_run = jobs_so_far(spark_resource.spark_session) - jobs_before
    codegen_spent = codegen.since()

    events = step_events(instance.all_logs(result.run_id))
    rows = {}
    for event in result.get_asset_materialization_events():
        metadata = event.materialization.metadata
        count = metadata.get("dagster/row_count")
        rows[event.asset_key.to_user_string()] = {
            "rows": count.value if count is not None else None,
            "skipped": metadata["delta/skipped"].value if "delta/skipped" in metadata else None,
        }
    checks = [
        {"asset": e.asset_key.to_user_string(), "check": e.check_name, "passed": e.passed}
        for e in result.get_asset_check_evaluations()
    ]
    success = result.success
    # materialize() keeps every output value in its result (Dagster's output capture), and a
    # DataFrame keeps the broadcast relations of its query: measured while the result holds
    # them, after it is dropped, and once what Dagster keeps reachable is released
    # (release_objects_pinned_by_dagster): the last is what a run launched by `dagster dev` or a
    # schedule (which captures no output) leaves the JVM.
    held_heap_mb, _ = jvm_live_heap(spark_resource.spark_session, top=0)
    del result
    heap = heap_after_result_dropped(spark_resource.spark_session)
    cpu = tree_cpu_seconds(os.getpid())
    report = {
        "engine": engine,
        "ablate": sorted(ablate),
        "success": success,
        "session_start_s": round(session_start, 3),
        "run_started": run_started,
        "work_s": round(run_ended - run_started, 3),
        "work_cpu": work_cpu_s,
        "spark_jobs": spark_jobs_run,
        **codegen_spent,
        "events": events,
        "rows": rows,
        "checks": checks,
        "actions": probes.records if probes else [],
        "cache_sites": dict(probes.cache_sites) if probes else {},
        "cpu_s_before_stop": round(cpu, 1),
        **heap,
        "jvm_live_heap_with_outputs_held_mb": held_heap_mb,
        # The sampler's first sample is taken as the run starts.
        "python_driver_rss_at_run_start_mb": round(driver_memory.samples[0][1]),
        "python_driver_memory_by_step": memory_by_step(driver_memory.samples, events),
        "process_wall_s_before_stop": round(process_age_seconds(os.getpid()), 1),
        "step_success_events": sum(e["type"] == DagsterEventType.STEP_SUCCESS.value for e in events),
    }
    Path(args.json).write_text(json.dumps(report))
    spark_resource.spark_session.stop()
    return 0 if success else 3


# --------------------------------------------------------------------------
# The parent: land, run the children, report
# --------------------------------------------------------------------------


def _run_child(command: list[str], env: dict[str, str], timeout: float, log: Path) -> dict:
    """Run a child process, with its wall time and its process tree's CPU seconds."""
    started = time.time()
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        cpu = 0.0
        memory = {"python_driver_mb": 0.0, "jvm_mb": 0.0, "python_workers_mb": 0.0}
        deadline = started + timeout
        while process.poll() is None:
            cpu = max(cpu, tree_cpu_seconds(process.pid))  # the JVM is gone once the child exits
            for kind, mb in tree_peak_memory(process.pid).items():
                memory[kind] = max(memory[kind], mb)
            if time.time() > deadline:
                os.killpg(process.pid, 9)
                process.wait()
                raise TimeoutError(f"{shlex.join(command)} took longer than {timeout:.0f} s; see {log}")
            time.sleep(0.5)
    wall = time.time() - started
    if process.returncode not in (0, 3):
        raise RuntimeError(f"{shlex.join(command)} exited {process.returncode}; see {log}")
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "returncode": process.returncode,
        **{kind: round(mb) for kind, mb in memory.items()},
    }


class Job(NamedTuple):
    """One child process of a round: its command, and what to do before and after it."""

    name: str
    command: list[str]
    env: dict[str, str]
    log: Path
    prepare: Callable[[], None]
    #: Keeps the first round's whole report of the run (before ``measure``).
    finish: Callable[[dict], None]
    #: The run's figures in a round, ``{"work_s", "cpu_s"}``; removes what the run wrote.
    measure: Callable[[dict], dict]


def _round_figures(result: dict, *, report_json: Path, written: Path) -> dict:
    """A run's figures in a round (its own work seconds, its processes' CPU seconds); removes what it wrote."""
    shutil.rmtree(written, ignore_errors=True)
    return {"work_s": json.loads(report_json.read_text())["work_s"], "cpu_s": result["cpu_s"]}


def _child_env(extra: dict[str, str], driver_memory: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    if driver_memory:
        env["PYSPARK_SUBMIT_ARGS"] = f"--driver-memory {driver_memory} pyspark-shell"
    env.update(extra)
    return env


def land(folder: Path, args: argparse.Namespace) -> dict:
    """Land every batch with the simulator's command, in a process of its own."""
    command = [
        sys.executable,
        "-m",
        "medallion_assets.cli",
        "simulate",
        "--lake-root",
        str(folder),
        "--scale-factor",
        str(args.scale_factor),
        "--batches",
        str(args.batches),
        "--seed",
        str(args.seed),
        "--all",
    ]
    if args.work_dir:
        command += ["--work-dir", str(args.work_dir)]
    result = _run_child(command, _child_env({}, None), args.land_timeout, folder.parent / "land.log")
    return {**result, "command": command}


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def summarize_dagster(report: dict) -> dict:
    """Steps with their durations and parts, and the probes' records per step and per call site."""
    steps: dict[str, dict] = {}
    last_output: dict[str, float] = {}
    for event in sorted(report["events"], key=lambda e: e["t"]):
        key, kind, t = event["step"], event["type"], event["t"]
        if not key:
            continue
        step = steps.setdefault(
            key,
            {
                "step": key,
                "start": None,
                "end": None,
                "inputs_s": 0.0,
                "outputs_s": 0.0,
                "status": None,
                "last_input": None,
            },
        )
        if kind == "STEP_START":
            step["start"] = t
        elif kind in ("LOADED_INPUT", "STEP_INPUT"):
            step["last_input"] = t
        elif kind == "STEP_OUTPUT":
            last_output[key] = t
        elif kind == "HANDLED_OUTPUT" and key in last_output:
            step["outputs_s"] += t - last_output.pop(key)
        elif kind in ("STEP_SUCCESS", "STEP_FAILURE", "STEP_SKIPPED"):
            step["end"], step["status"] = t, kind
    ran = [s for s in steps.values() if s["start"] is not None and s["end"] is not None]
    for step in ran:
        step["duration_s"] = step["end"] - step["start"]
        step["inputs_s"] = (step["last_input"] - step["start"]) if step["last_input"] else 0.0
        step["compute_s"] = step["duration_s"] - step["inputs_s"] - step["outputs_s"]
        step["actions_s"] = 0.0
    ran.sort(key=lambda s: s["start"])
    # Steps run one after another (in-process executor): a record belongs to the step whose window holds it.
    for record in report["actions"]:
        record["step"] = next((s["step"] for s in ran if s["start"] <= record["t0"] <= s["end"]), None)
        if not record["region"] and record["step"]:
            next(s for s in ran if s["step"] == record["step"])["actions_s"] += record["t1"] - record["t0"]
    in_steps = sum(s["duration_s"] for s in ran)
    return {"steps": ran, "in_steps_s": in_steps, "outside_steps_s": report["work_s"] - in_steps}


#: (label, what the probes recorded): the calls the framework adds on top of the data work.
OVERHEAD_RULES: list[tuple[str, str, str]] = [
    ("output metadata: row count (`count()` of the new version)", "DataFrame.count", "storage/client.py:describe"),
    (
        "output metadata: 5-row preview (`limit(5).collect()`)",
        "DataFrame.collect",
        "io_manager/metadata.py:markdown_preview",
    ),
    (
        "output metadata: table state (files, bytes, rows of the written version)",
        "engine.table_state",
        "storage/client.py:describe",
    ),
    ("output metadata: `detail()` (Connect, fallback)", "detail", "storage/client.py:describe"),
    ("output metadata: `detail().first()`", "DataFrame.first", "storage/client.py:describe"),
    (
        "output metadata: last commit (`history(1)` / delta-rs log)",
        "engine.latest_commit",
        "storage/client.py:describe",
    ),
    ("output metadata: `forPath` / snapshot", "forPath", "storage/client.py:describe"),
    ("output metadata: schema (read of the table)", "engine.read", "storage/client.py:describe"),
    ("`latest_version()` after writes and loads", "engine.latest_commit", "storage/client.py:latest_version"),
    ("`exists()` (`isDeltaTable`)", "isDeltaTable", ""),
    ("`isEmpty()` before append / merge / tombstones", "DataFrame.isEmpty", ""),
    (
        "silver schema-drift scan (`drifted_order_fields(...).collect()`)",
        "DataFrame.collect",
        "pipelines/tpch/silver.py:orders_and_lineitem",
    ),
    (
        "expectation counts (`apply_expectations` ... `first()`)",
        "DataFrame.first",
        "expectations.py:apply_expectations",
    ),
    ("gold reconciliation checks (`reconcile` ... `first()`)", "DataFrame.first", "pipelines/tpch/gold.py:reconcile"),
    ("Dagster instance look-ups (consumed versions, fingerprints)", "dagster instance", ""),
]


def overhead_rows(records: list[dict]) -> list[tuple[str, int, float]]:
    rows = []
    for label, kind, site in OVERHEAD_RULES:
        hits = [r for r in records if not r["region"] and kind in r["kind"] and r["site"].startswith(site)]
        rows.append((label, len(hits), sum(r["t1"] - r["t0"] for r in hits)))
    return rows


def by_site(records: list[dict]) -> list[tuple[str, str, int, float]]:
    grouped: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        site = r["site"].rsplit(":", 1)[0]  # file:function
        grouped[(r["kind"] + (" (region)" if r["region"] else ""), site)].append(r["t1"] - r["t0"])
    rows = [(kind, site, len(times), sum(times)) for (kind, site), times in grouped.items()]
    return sorted(rows, key=lambda row: -row[3])


def _work_cpu_table(plain: dict | None, runs: list[dict]) -> list[str]:
    """CPU seconds of each process's work (session start excluded), the JVM's by kind of thread."""
    columns = [("plain", plain)] if plain and plain.get("work_cpu") else []
    columns += [(f"Dagster, {run['engine']}", run) for run in runs if run.get("work_cpu")]
    if not columns:
        return []
    kinds: list[str] = []
    for _, run in columns:
        kinds += [kind for kind in run["work_cpu"]["jvm_by_thread"] if kind not in kinds]
    lines = [
        "\nSpark jobs and CPU seconds of the work (session start excluded), the JVM's by kind of thread (Linux thread "
        "names: `C2 CompilerThre` is the optimizing JIT, `C1` the quick one, `Executor task ...` Spark's "
        "tasks, `Thread` the driver's calls from Python, `GC Thread` and `G1 Conc` the garbage "
        "collector):\n",
        "| | " + " | ".join(name for name, _ in columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    rows = [
        ("Spark jobs (streams' not counted)", lambda run: run.get("spark_jobs", "")),
        ("classes Spark's code generator compiled", lambda run: run.get("classes_generated", "")),
        ("s compiling them (estimated)", lambda run: run.get("codegen_compile_s", "")),
        ("CPU s: Python driver", lambda run: run["work_cpu"]["python_driver"]),
        ("CPU s: JVM", lambda run: run["work_cpu"]["jvm"]),
    ]
    rows += [
        (f"CPU s: JVM, `{kind}`", lambda run, kind=kind: run["work_cpu"]["jvm_by_thread"].get(kind, ""))
        for kind in kinds
    ]
    for label, value in rows:
        lines.append(f"| {label} | " + " | ".join(str(value(run)) for _, run in columns) + " |")
    return lines


def _rounds_table(rounds: list[dict]) -> list[str]:
    """Each round's work seconds and ratios to that round's plain script, and their medians."""
    if len(rounds) < 2:
        return []
    runs = [name for name in rounds[0]["work"] if name != "plain"]
    lines = [
        f"\n{len(rounds)} rounds, each the plain script then the Dagster runs (the first is the one above):\n",
        "| round | load before | plain work s | "
        + " | ".join(f"{name}: work s | ratio | CPU ratio" for name in runs)
        + " |",
        "| --- | --- | ---: |" + " ---: | ---: | ---: |" * len(runs),
    ]
    ratios: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for number, entry in enumerate(rounds, start=1):
        plain = entry["work"]["plain"]
        cells = []
        for name in runs:
            run = entry["work"][name]
            ratios[name].append((run["work_s"] / plain["work_s"], run["cpu_s"] / plain["cpu_s"]))
            cells.append(
                f"{run['work_s']:.1f} | {_ratio(run['work_s'], plain['work_s'])} "
                f"| {_ratio(run['cpu_s'], plain['cpu_s'])}"
            )
        lines.append(f"| {number} | {entry['load_before']} | {plain['work_s']:.1f} | " + " | ".join(cells) + " |")
    medians = [
        f"{statistics.median(r for r, _ in ratios[name]):.2f}x "
        f"(CPU {statistics.median(c for _, c in ratios[name]):.2f}x)"
        for name in runs
    ]
    lines.append(
        "\nMedian ratio: " + "; ".join(f"{name} {median}" for name, median in zip(runs, medians, strict=False)) + "."
    )
    return lines


def markdown(report: dict, args: argparse.Namespace) -> str:
    out: list[str] = []
    plain = report["plain"]
    out.append(f"## Dagster materialization vs plain PySpark, scale factor {args.scale_factor}\n")
    out.append(
        f"Machine: {os.cpu_count()} cores; load average (1/5/15 min) {report['load_before']} before, "
        f"{report['load_after']} after. Landing: "
        + (f"{report['landing']['wall_s']} s" if "wall_s" in report["landing"] else "landed before")
        + f" ({report['landing_mb']:.0f} MB)."
        + (
            " The runs below ran at the same time (`--parallel`): compare CPU seconds."
            if report.get("parallel")
            else ""
        )
        + "\n"
    )
    out.append(
        "| run | process wall s | session start s | work s | work ratio | process CPU s | CPU ratio "
        "| peak MB: Python driver / JVM / Python worker |"
    )
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    if plain is not None:
        out.append(
            f"| plain PySpark + Parquet (`plain_pipeline.py`) | {plain['wall_s']} | {plain['session_start_s']:.1f} | "
            f"{plain['work_s']:.1f} | 1.00x | {plain['cpu_s']} | 1.00x | {_memory_cell(plain)} |"
        )
    for run in report["dagster"]:
        label = f"Dagster, {run['engine']}" + (f", ablate {'+'.join(run['ablate'])}" if run["ablate"] else "")
        if not run["success"]:
            label += " (**run failed**)"
        out.append(
            f"| {label} | {run['wall_s']} | {run['session_start_s']:.1f} | {run['work_s']:.1f} | "
            f"{_ratio(run['work_s'], plain and plain['work_s'])} | {run['cpu_s']} | "
            f"{_ratio(run['cpu_s'], plain and plain['cpu_s'])} | {_memory_cell(run)} |"
        )
    for failure in report.get("failed", []):
        out.append(f"| {failure} | | | | | | | |")
    out.extend(_rounds_table(report.get("rounds", [])))
    out.extend(_work_cpu_table(plain, report["dagster"]))
    out.append(
        "\nPeak resident memory per process (`VmHWM`, sampled every 0.5 s). The JVM of a local session is "
        "driver and executor at once: its figure includes cached partitions up to the heap's limit, so what the "
        "driver keeps is the live heap after the run, caches and `materialize`'s result (which holds every output "
        "DataFrame) dropped (`jcmd GC.class_histogram`).\n"
    )
    for run in report["dagster"]:
        if run.get("python_driver_memory_by_step"):
            out.append(
                f"Python driver ({run['engine']}): {run.get('python_driver_rss_at_run_start_mb', '?')} MB resident "
                "when the run starts; the steps in whose time it rose most (sampled every 0.2 s in the process):\n"
            )
            out.append("| step | resident MB at its start | peak during it | rise | Arrow's allocated MB, peak |")
            out.append("| --- | ---: | ---: | ---: | ---: |")
            for row in run["python_driver_memory_by_step"]:
                out.append(
                    f"| {row['step']} | {row['rss_at_start_mb']} | {row['rss_peak_mb']} | {row['rise_mb']} "
                    f"| {row['arrow_peak_mb']} |"
                )
            out.append("")
    out.append("")
    out.append("Commands:\n")
    out.append("```")
    for command in report["commands"]:
        out.append(command)
    out.append("```\n")

    for run in report["dagster"]:
        summary = run["summary"]
        title = f"{run['engine']}" + (f", ablate {'+'.join(run['ablate'])}" if run["ablate"] else "")
        out.append(f"### Where the Dagster run's time goes ({title})\n")
        layers: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for step in summary["steps"]:
            entry = layers[_layer(step["step"])]
            entry[0] += 1
            entry[1] += step["duration_s"]
            entry[2] += step["actions_s"]
        out.append("| part | steps | seconds | of which in Spark/Delta calls |")
        out.append("| --- | ---: | ---: | ---: |")
        for layer, (count, seconds, actions) in sorted(layers.items(), key=lambda kv: -kv[1][1]):
            out.append(f"| {layer} | {count} | {seconds:.1f} | {actions:.1f} |")
        out.append(
            f"| outside steps (job build, run start/end, between steps) | | {summary['outside_steps_s']:.1f} | |"
        )
        out.append(f"| **run total** | {len(summary['steps'])} | {run['work_s']:.1f} | |")
        out.append("")
        out.append(
            f"Top {args.top} steps (inputs: step start to last input loaded; outputs: each output's STEP_OUTPUT "
            "to HANDLED_OUTPUT, i.e. the IO manager's write and metadata):\n"
        )
        out.append("| step | seconds | inputs | compute | outputs | in Spark/Delta calls |")
        out.append("| --- | ---: | ---: | ---: | ---: | ---: |")
        for step in sorted(summary["steps"], key=lambda s: -s["duration_s"])[: args.top]:
            out.append(
                f"| `{step['step']}` | {step['duration_s']:.1f} | {step['inputs_s']:.1f} | {step['compute_s']:.1f} | "
                f"{step['outputs_s']:.1f} | {step['actions_s']:.1f} |"
            )
        out.append("")
        if run["actions"]:
            out.append("Calls the framework adds (from the probes; seconds are wall time in the call):\n")
            out.append("| call | calls | seconds | share of the run |")
            out.append("| --- | ---: | ---: | ---: |")
            for label, calls, seconds in overhead_rows(run["actions"]):
                out.append(f"| {label} | {calls} | {seconds:.1f} | {100 * seconds / run['work_s']:.0f}% |")
            out.append("")
            out.append(f"Every probed call by kind and site (top {args.top_sites}):\n")
            out.append("| call | site | calls | seconds |")
            out.append("| --- | --- | ---: | ---: |")
            for kind, site, calls, seconds in by_site(run["actions"])[: args.top_sites]:
                out.append(f"| {kind} | `{site}` | {calls} | {seconds:.1f} |")
            out.append("")
            if run["cache_sites"]:
                caches = ", ".join(f"`{site.rsplit(':', 1)[0]}` ×{n}" for site, n in sorted(run["cache_sites"].items()))
                out.append(f"`.cache()` / `.persist()` calls: {caches}.\n")
        if run.get("jvm_live_heap_by_class"):
            out.append("What the JVM still holds after the run (live heap by class, `jcmd GC.class_histogram`):\n")
            out.append("| class | instances | MB |")
            out.append("| --- | ---: | ---: |")
            for entry in run["jvm_live_heap_by_class"]:
                out.append(f"| `{entry['class']}` | {entry['instances']} | {entry['mb']} |")
            out.append("")
        if plain is None:
            failed = [f"{c['asset']}:{c['check']}" for c in run["checks"] if not c["passed"]]
            out.append(
                f"Asset checks: {len(run['checks'])} evaluated, {len(failed)} failed"
                f"{': ' + ', '.join(failed) if failed else ''}.\n"
            )
            continue
        mismatched = [
            (table, plain["rows"].get(table), info["rows"])
            for table, info in sorted(run["rows"].items())
            if table in plain.get("rows", {}) and plain["rows"][table] != info["rows"]
        ]
        compared = sum(1 for table in run["rows"] if table in plain.get("rows", {}))
        if mismatched:
            out.append(
                "Row counts that differ from the plain script's: "
                + ", ".join(f"{t}: plain {p}, Dagster {d}" for t, p, d in mismatched)
                + "\n"
            )
        else:
            out.append(f"Row counts: the {compared} tables both runs write have the same rows.\n")
        failed = [f"{c['asset']}:{c['check']}" for c in run["checks"] if not c["passed"]]
        out.append(
            f"Asset checks: {len(run['checks'])} evaluated, "
            f"{len(failed)} failed{': ' + ', '.join(failed) if failed else ''}.\n"
        )
    return "\n".join(out)


def _ratio(value: float, baseline: float | None) -> str:
    return f"{value / baseline:.2f}x" if baseline else "-"


def _memory_cell(run: dict) -> str:
    kinds = ("python_driver_mb", "jvm_mb", "python_workers_mb")
    cell = " / ".join(str(run[k]) if k in run else "?" for k in kinds)
    if run.get("jvm_live_heap_mb") is not None:
        held = run.get("jvm_live_heap_with_outputs_held_mb")
        pinned = run.get("jvm_live_heap_with_outputs_pinned_by_dagster_mb")
        cell += f" (JVM live heap after the run: {run['jvm_live_heap_mb']}"
        cell += f"; {held} while materialize's result held the outputs" if held is not None else ""
        cell += f"; {pinned} while Dagster's compiled records pinned them" if pinned is not None else ""
        cell += ")"
    return cell


def _layer(step: str) -> str:
    """Dagster step keys are op names: bronze and silver reference ops share table names."""
    return STEP_LAYERS.get(step, "asset checks" if ("check" in step or "__" in step) else "?")


STEP_LAYERS: dict[str, str] = {}


def _learn_layers() -> None:
    """Map step keys (op names) to their layer, from the Definitions (no Spark)."""
    from medallion_assets.definitions import build_definitions

    defs = build_definitions("local")
    for assets_def in defs.assets:
        layers = {key.path[0] for key in assets_def.keys}
        STEP_LAYERS[assets_def.node_def.name] = "/".join(sorted(layers))
    for checks_def in defs.asset_checks:
        STEP_LAYERS[checks_def.node_def.name] = "asset checks"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--engines", nargs="+", default=["delta-spark"], choices=["delta-spark", "delta-rs"])
    parser.add_argument(
        "--ablate",
        nargs="*",
        default=[],
        choices=["cache", "drift-scan"],
        help="extra Dagster runs per engine with these what-ifs (all at once in one run)",
    )
    parser.add_argument("--landing", type=Path, default=None, help="an already landed delivery (skips the simulator)")
    parser.add_argument("--folder", type=Path, default=None, help="work folder (default: a temporary one, removed)")
    parser.add_argument("--work-dir", type=Path, default=None, help="the simulator's TPC-H cache")
    parser.add_argument(
        "--driver-memory",
        default=None,
        help="e.g. 6g, for both kinds of run (default: what SparkResource gives an embedded "
        "session on this machine, so the plain script gets the same)",
    )
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per pipeline run")
    parser.add_argument("--land-timeout", type=float, default=3600)
    parser.add_argument(
        "--reuse-plain",
        action="store_true",
        help="take the baseline from an earlier run in the same --folder (same --landing)",
    )
    parser.add_argument("--no-probes", action="store_true", help="run the Dagster process without probes")
    parser.add_argument(
        "--no-plain",
        action="store_true",
        help="the Dagster runs only, no baseline and no ratio (completion and memory at a large scale)",
    )
    parser.add_argument("--ephemeral-instance", action="store_true", help="in-memory Dagster instance, not sqlite")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run the plain script and the Dagster runs at the same time (on a busy machine; compare CPU seconds then)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the plain script and the Dagster runs this many times in turn, and report each "
        "round's ratio and their median (the first round's runs are shown in detail)",
    )
    parser.add_argument("--top", type=int, default=12, help="steps shown")
    parser.add_argument("--top-sites", type=int, default=25, help="probe sites shown")
    parser.add_argument("--json", type=Path, default=None, help="write every number here")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="print the report from the JSON files an earlier run left in --folder",
    )
    parser.add_argument("--child-dagster", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--lake", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_dagster:
        return dagster_child(args)
    if args.report_only:
        if not args.folder:
            parser.error("--report-only needs --folder")
        return report_only(args)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.rounds > 1 and (args.no_plain or args.reuse_plain):
        parser.error(
            "--rounds compares each round's runs with that round's plain script: drop --no-plain and --reuse-plain"
        )
    if "delta-spark" in args.engines and not os.environ.get("DELTA_SPARK_JARS"):
        parser.error("delta-spark needs DELTA_SPARK_JARS (the folder of the delta-spark jars)")

    folder = args.folder or Path(tempfile.mkdtemp(prefix="medallion-pvp-"))
    folder.mkdir(parents=True, exist_ok=True)
    report: dict = {"load_before": load_average(), "commands": [], "dagster": []}
    try:
        if args.landing:
            landing = args.landing.resolve()
            report["landing"] = {"given": str(landing)}
        else:
            lake0 = folder / "landed"
            print(f"landing SF {args.scale_factor} into {lake0} ...", file=sys.stderr)
            report["landing"] = land(lake0, args)
            landing = lake0 / "landing"
            report["commands"].append(shlex.join(["medallion-assets", *report["landing"]["command"][3:]]))
        report["landing_mb"] = _folder_bytes(landing) / 1e6
        if args.driver_memory is None:
            from medallion_assets.resources import embedded_driver_memory

            args.driver_memory = embedded_driver_memory()
        env_note = (
            f"PYSPARK_SUBMIT_ARGS='--driver-memory {args.driver_memory} pyspark-shell' " if args.driver_memory else ""
        )

        plain_run = folder / "plain-run.json"
        plain_job = None
        jobs = []  # one Job per child process of a round
        if args.no_plain:
            report["plain"] = None
        elif args.reuse_plain:
            report["plain"] = json.loads(plain_run.read_text())
        else:
            out, plain_json = folder / "plain", folder / "plain.json"
            command = [
                sys.executable,
                str(PLAIN_SCRIPT),
                "--landing",
                str(landing),
                "--out",
                str(out),
                "--json",
                str(plain_json),
                "--row-counts",
            ]

            def prepare_plain(out=out):
                shutil.rmtree(out, ignore_errors=True)

            def finish_plain(result, plain_json=plain_json):
                report["plain"] = {**json.loads(plain_json.read_text()), **result}
                plain_run.write_text(json.dumps(report["plain"]))

            plain_job = Job(
                "plain PySpark",
                command,
                _child_env({}, args.driver_memory),
                folder / "plain.log",
                prepare_plain,
                finish_plain,
                functools.partial(_round_figures, report_json=plain_json, written=out),
            )
            jobs.append(plain_job)
            report["commands"].append(
                env_note + "python benchmarks/plain_pipeline.py --landing LAKE/landing --out OUT --row-counts"
            )

        variants = [(engine, []) for engine in args.engines]
        if args.ablate:
            variants += [(engine, list(args.ablate)) for engine in args.engines]
        for engine, ablate in variants:
            name = engine + ("-" + "-".join(ablate) if ablate else "")
            lake = folder / f"lake-{name}"
            home = folder / f"dagster-home-{name}"
            child_json = folder / f"dagster-{name}.json"
            command = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child-dagster",
                "--lake",
                str(lake),
                "--json",
                str(child_json),
            ]
            if ablate:
                command += ["--ablate", *ablate]
            if args.no_probes:
                command.append("--no-probes")
            if args.ephemeral_instance:
                command.append("--ephemeral-instance")
            env = _child_env({"MEDALLION_DELTA_ENGINE": engine, "DAGSTER_HOME": str(home)}, args.driver_memory)

            def prepare_dagster(lake=lake, home=home):
                # Every run starts from an empty lake over the same landing, on a new instance.
                for empty in (lake, home):
                    shutil.rmtree(empty, ignore_errors=True)
                    empty.mkdir()
                (lake / "landing").symlink_to(landing, target_is_directory=True)

            def finish_dagster(result, child_json=child_json):
                child = json.loads(child_json.read_text())
                child.update(result)
                child["summary"] = summarize_dagster(child)
                report["dagster"].append(child)

            jobs.append(
                Job(
                    f"Dagster on {name}",
                    command,
                    env,
                    folder / f"dagster-{name}.log",
                    prepare_dagster,
                    finish_dagster,
                    functools.partial(_round_figures, report_json=child_json, written=lake),
                )
            )

        def run_jobs(keep: Callable[[Job, dict], object]) -> dict[str, object]:
            """Each job's ``keep(job, result)``, or the error that stopped it."""
            results: dict[str, object] = {}

            def run_job(job: Job) -> None:
                # Each result is kept as soon as its run ends, so a later failure loses nothing.
                print(f"{job.name} ...", file=sys.stderr)
                try:
                    job.prepare()
                    results[job.name] = keep(job, _run_child(job.command, job.env, args.timeout, job.log))
                except (RuntimeError, TimeoutError, OSError, ValueError) as error:
                    results[job.name] = error
                print(f"{job.name}: {results[job.name]}", file=sys.stderr)

            if args.parallel:
                threads = [threading.Thread(target=run_job, args=(job,)) for job in jobs]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
            else:
                for job in jobs:
                    run_job(job)
            return results

        def finish(job: Job, result: dict) -> dict:
            job.finish(result)
            return job.measure(result)

        # The first round's runs are the ones described in detail; every round's work goes in the rounds table.
        report["failed"], rounds = [], []
        for number in range(1, args.rounds + 1):
            load_before = report["load_before"] if number == 1 else load_average()
            if args.rounds > 1:
                print(f"round {number} of {args.rounds}", file=sys.stderr)
            results = run_jobs(finish if number == 1 else lambda job, result: job.measure(result))
            failed = [f"{job.name}: {results[job.name]}" for job in jobs if isinstance(results[job.name], Exception)]
            report["failed"] += [f"round {number}: {failure}" for failure in failed] if number > 1 else failed
            if failed:
                break
            rounds.append(
                {
                    "load_before": load_before,
                    "work": {"plain" if job is plain_job else job.name: results[job.name] for job in jobs},
                }
            )
        if args.rounds > 1:
            report["rounds"] = rounds
        if "plain" not in report and not args.no_plain:
            raise RuntimeError("the plain run failed: " + "; ".join(report["failed"]))
        report["dagster"].sort(key=lambda run: (run["ablate"] != [], args.engines.index(run["engine"])))
        report["parallel"] = args.parallel
        report["commands"].append(
            env_note
            + "python benchmarks/pipeline_vs_plain.py "
            + shlex.join(_shown_args(argv if argv is not None else sys.argv[1:]))
        )
        report["load_after"] = load_average()
        _learn_layers()
        text = markdown(report, args)
        print(text)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1, default=str))
    finally:
        if not args.folder:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def report_only(args: argparse.Namespace) -> int:
    """The report again, from the JSON files an earlier run left in ``--folder``.

    Runs that were stopped before they wrote their JSON are left out; a run
    whose parent did not finish lacks the parent's wall and CPU figures, so the
    child's own (taken just before it stopped its session) stand in.
    """
    folder = args.folder
    report: dict = {"load_before": "?", "load_after": load_average(), "commands": [], "dagster": [], "failed": []}
    report["plain"] = json.loads((folder / "plain-run.json").read_text())
    report["landing"] = {"given": "earlier run"}
    report["landing_mb"] = float("nan")
    for path in sorted(folder.glob("dagster-*.json")):
        child = json.loads(path.read_text())
        child.setdefault("wall_s", child.get("process_wall_s_before_stop", float("nan")))
        child.setdefault("cpu_s", child["cpu_s_before_stop"])
        child["summary"] = summarize_dagster(child)
        report["dagster"].append(child)
    report["dagster"].sort(key=lambda run: (run["ablate"] != [], run["engine"]))
    report["parallel"] = args.parallel
    _learn_layers()
    print(markdown(report, args))
    return 0


def _shown_args(argv: list[str]) -> list[str]:
    """The command line as run, without this machine's folders."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            shown.append(Path(arg).name.upper() if arg else arg)
            skip = False
            continue
        shown.append(arg)
        skip = arg in ("--landing", "--folder", "--work-dir", "--json")
    return shown


if __name__ == "__main__":
    raise SystemExit(main())
