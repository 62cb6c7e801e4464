"""What an incremental run costs against the full run: a batch of about 1% after the other 99%.

Run by hand from the repository root (``DELTA_SPARK_JARS`` set for delta-spark)::

    python benchmarks/incremental.py [--scale-factor 0.1] [--batches 100] [--folder WORK]

In one Python process and one SparkSession it lands all but the last batch of
a noisy TPC-H delivery split into ``--batches`` batches, materializes every
asset and check (the full run), lands the last batch (about ``1/batches`` of
the changes) and materializes again (the incremental run), then once more
with nothing new. Each run is timed as work (session start excluded) with its
steps' seconds, and the incremental run as a share of the full one. With
``--probes`` each run also lists the Spark, Delta and IO-manager calls its
time went to, by kind and call site (``pipeline_vs_plain.py``'s probes). Each
run also counts the table versions it committed, by table (from each table's
newest commit before and after the run): what a run pays per version on
delta-spark, whatever its rows, grows with that count. The Python driver's
resident size is sampled every 0.2 s, and each run lists the steps in whose
time it rose most (``python_driver_memory_by_step``), and with ``--probes``
the calls in whose time it rose most, by kind and call site, deltalake's small
MERGEs and appends among them (``python_driver_memory_by_call``). With
``--deletion-vectors`` (delta-spark only) the tables written by MERGE are
created with deletion vectors, as ``ApplyChanges(deletion_vectors=True)``
creates a feed's silver table: their MERGEs mark the rows they replace instead
of rewriting the files. It prints JSON. ``--folder`` keeps the lake (and
tpchgen's data) for a rerun; without it a temporary folder is removed at the end.

``--fresh-process-batch`` (needs ``--folder``) also runs the batch as a
scheduled run pays it, in a process of its own: once the last batch has
landed, the lake (all but its landing, which no run changes) and the Dagster
instance are copied aside; after the runs above, they are put back at the
same place (the bronze streams' checkpoints name the landing's files by
path), and a child process runs the batch and the run with nothing new
again, with the same measurements. Both processes keep the Dagster instance
in the folder, since a run reuses its checks' earlier results from it. It
tells what the process's own history (the full run before the batch) adds to
the batch's time and driver memory.

At the end it prints on standard error each run against its target (the
batch at most 10% of the full run, a run with nothing new at most 15 s of
work) and each layer's seconds in the full run and in the batch: a layer that
costs the batch about what it costs the full run is recomputed whatever the
batch holds. ``--summary FILE`` prints the same from a run's JSON, measuring
nothing.

``--fit FILE ...`` measures nothing: it reads the JSON of runs at several
scale factors and prints, in Markdown, each run's figures and straight-line
fits of the full run and the batch in the scale factor (what a run costs
whatever its rows, and per SF), in all and by layer (bronze, silver, gold,
checks), and the steps whose batch cost grows fastest with the data::

    python benchmarks/incremental.py --scale-factor 1 --probes > sf1.json   # and so on
    python benchmarks/incremental.py --fit sf0.01.json sf0.1.json sf0.3.json sf1.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from engine_runs import PeriodicSampler, emit_json, run_child
from materialize_all import step_seconds
from pipeline_vs_plain import (
    by_site,
    driver_memory_sample,
    heap_after_result_dropped,
    install_probes,
    jvm_live_heap,
    memory_by_call,
    memory_by_step,
    step_events,
    tree_peak_memory,
)


def _load() -> float:
    return round(os.getloadavg()[0], 1)


def _merge_tables_with_deletion_vectors() -> None:
    """Give every table the IO manager creates for MERGE the property ``delta.enableDeletionVectors``.

    TPC-H's ``orders`` and ``lineitem`` come from the pipeline's own silver step,
    which has no switch for it; the other tables keep none, since the pandas
    report reads gold through delta-rs, which cannot read a table that has them.
    """
    from medallion_assets.io_manager import DELETION_VECTORS
    from medallion_assets.storage import client

    declared = client.table_properties_for

    def with_deletion_vectors(spec, schema):
        properties = declared(spec, schema)
        return {**properties, DELETION_VECTORS: "true"} if spec.mode == "merge" else properties

    client.table_properties_for = with_deletion_vectors


def step_layers(defs) -> dict[str, str]:
    """Step (op) name -> the layer of what it writes (``checks`` for a check's own step)."""
    layers = {}
    for asset in defs.assets:
        written = sorted({key.path[0] for key in asset.keys} - {"quarantine"}) or ["quarantine"]
        layers[asset.node_def.name] = written[0]
    for check in defs.asset_checks:
        layers[check.node_def.name] = "checks"
    return layers


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` of ``y`` on ``x``."""
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return mean_y - slope * mean_x, slope


def _steps(run: dict) -> dict[str, float]:
    # Runs of older code kept only their slowest steps (all of them with --slowest 45).
    return run.get("steps_s") or run["slowest_steps_s"]


def seconds_by_layer(run: dict, layers: dict[str, str]) -> dict[str, float]:
    """A run's step seconds summed by the layer each step writes (``other`` for a step ``layers`` lacks)."""
    totals: dict[str, float] = {}
    for step, seconds in _steps(run).items():
        layer = layers.get(step, "other")
        totals[layer] = totals.get(layer, 0.0) + seconds
    return totals


def fit_report(reports: list[dict], layers: dict[str, str], top: int = 6) -> str:
    """Markdown: the runs by scale factor, and each cost as a fixed part plus a part per SF."""
    reports = sorted(reports, key=lambda r: r["scale_factor"])
    if len({r["scale_factor"] for r in reports}) < 2:
        raise SystemExit("--fit needs runs at two scale factors at least")
    runs = [{run["run"]: run for run in r["runs"]} for r in reports]
    lines = ["| SF | full run s | the batch s | nothing new s | batch / full |", "| --- | ---: | ---: | ---: | ---: |"]
    for r, by_name in zip(reports, runs, strict=False):
        full, batch = by_name["full"]["work_s"], by_name["incremental"]["work_s"]
        lines.append(
            f"| {r['scale_factor']:g} | {full} | {batch} | {by_name['nothing new']['work_s']} | {batch / full:.2f} |"
        )
    fits = {}
    for name in ("full", "incremental"):
        points = [(r["scale_factor"], by_name[name]["work_s"]) for r, by_name in zip(reports, runs, strict=False)]
        fits[name] = _line(points)
        miss = max(abs(y - (fits[name][0] + fits[name][1] * x)) for x, y in points)
        lines.append(f"\n{name}: {fits[name][0]:.1f} s + {fits[name][1]:.1f} s per SF (largest miss {miss:.1f} s)")
    lines.append(f"\nthe batch's share tends to {fits['incremental'][1] / fits['full'][1]:.2f} as SF grows")

    def per_layer(name: str) -> dict[str, list[tuple[float, float]]]:
        points: dict[str, list[tuple[float, float]]] = {}
        for r, by_name in zip(reports, runs, strict=False):
            for layer, seconds in seconds_by_layer(by_name[name], layers).items():
                points.setdefault(layer, []).append((r["scale_factor"], seconds))
        return points

    lines += [
        "",
        "| layer | batch: fixed s | batch: s per SF | full run: fixed s | full run: s per SF |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    batch_layers, full_layers = per_layer("incremental"), per_layer("full")
    for layer in sorted(batch_layers, key=lambda layer: -_line(batch_layers[layer])[1]):
        (batch_fixed, batch_per_sf) = _line(batch_layers[layer])
        (full_fixed, full_per_sf) = _line(full_layers[layer]) if layer in full_layers else (0.0, 0.0)
        lines.append(f"| {layer} | {batch_fixed:.1f} | {batch_per_sf:.1f} | {full_fixed:.1f} | {full_per_sf:.1f} |")
    by_step: dict[str, list[tuple[float, float]]] = {}
    for r, by_name in zip(reports, runs, strict=False):
        for step, seconds in _steps(by_name["incremental"]).items():
            by_step.setdefault(step, []).append((r["scale_factor"], seconds))
    fitted = {step: _line(points) for step, points in by_step.items() if len(points) == len(reports)}
    lines += ["", "| step (fastest growing in the batch) | batch: fixed s | batch: s per SF |", "| --- | ---: | ---: |"]
    for step, (fixed, per_sf) in sorted(fitted.items(), key=lambda item: -item[1][1])[:top]:
        lines.append(f"| `{step}` | {fixed:.1f} | {per_sf:.1f} |")
    return "\n".join(lines)


#: The cost targets this benchmark measures: the batch's share of the full run, and a run with nothing new.
BATCH_SHARE_TARGET = 0.10
NOTHING_NEW_TARGET_S = 15.0


def targets_summary(report: dict, layers: dict[str, str]) -> str:
    """Markdown: each run against its target, and each layer's seconds in the full run and the batch.

    The layers say why a batch costs what it does: a layer whose batch
    seconds are close to its full run's is recomputed whatever the batch holds.
    """
    runs = {run["run"]: run for run in report["runs"]}
    full, batch, idle = runs["full"], runs["incremental"], runs["nothing new"]
    fresh = {run["run"]: run for run in report.get("fresh_process", {}).get("runs", [])}
    lines = [f"SF {report['scale_factor']:g}, {report['engine']}: the full run {full['work_s']} s of work", ""]
    shown = [("same process", batch, idle)] + (
        [("fresh process", fresh["incremental"], fresh["nothing new"])] if fresh else []
    )
    for where, batch_run, idle_run in shown:
        share = batch_run["work_s"] / full["work_s"]
        share_miss = (share - BATCH_SHARE_TARGET) * 100
        lines.append(
            f"- the batch, {where}: {batch_run['work_s']} s, {share:.1%} of the full run: "
            + ("met" if share_miss <= 0 else f"missed by {share_miss:.1f} points")
            + f" (target at most {BATCH_SHARE_TARGET:.0%})"
        )
        idle_miss = idle_run["work_s"] - NOTHING_NEW_TARGET_S
        lines.append(
            f"- nothing new, {where}: {idle_run['work_s']} s: "
            + ("met" if idle_miss <= 0 else f"missed by {idle_miss:.1f} s")
            + f" (target at most {NOTHING_NEW_TARGET_S:g} s)"
        )

    full_layers, batch_layers = seconds_by_layer(full, layers), seconds_by_layer(batch, layers)
    lines += ["", "| layer | full run s | batch s | batch / full |", "| --- | ---: | ---: | ---: |"]
    for layer in sorted(batch_layers, key=lambda layer: -batch_layers[layer]):
        in_full = full_layers.get(layer, 0.0)
        ratio = f"{batch_layers[layer] / in_full:.2f}" if in_full else "-"
        lines.append(f"| {layer} | {in_full:.1f} | {batch_layers[layer]:.1f} | {ratio} |")
    return "\n".join(lines)


#: What a run changes in the folder: the lake but its landing (the simulator's alone), and the Dagster instance.
_RUN_STATE = ("lake", "dagster_home")


def _copy_aside(folder: Path, aside: Path) -> None:
    """Copy what a run changes into ``aside``, before the batch."""
    shutil.rmtree(aside, ignore_errors=True)
    for name in _RUN_STATE:
        shutil.copytree(
            folder / name,
            aside / name,
            ignore=lambda where, names: ["landing"] if Path(where) == folder / "lake" else [],
        )


def _put_back(aside: Path, folder: Path) -> None:
    """Put back what :func:`_copy_aside` kept, at the same paths, the landing left as it is."""
    for name in _RUN_STATE:
        for entry in (folder / name).iterdir():
            if not (name == "lake" and entry.name == "landing"):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        for entry in (aside / name).iterdir():
            shutil.move(entry, folder / name / entry.name)
    shutil.rmtree(aside)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--batches", type=int, default=100, help="the delivery's batches; the last is the increment")
    parser.add_argument("--folder", help="keep the lake here (default: a temporary folder)")
    parser.add_argument("--slowest", type=int, default=8, help="steps listed per run, slowest first")
    parser.add_argument(
        "--probes", action="store_true", help="time the Spark, Delta and IO-manager calls of each run, by call site"
    )
    parser.add_argument(
        "--deletion-vectors",
        action="store_true",
        help="create the tables written by MERGE with deletion vectors (delta-spark only)",
    )
    parser.add_argument(
        "--fit",
        nargs="+",
        metavar="FILE",
        help="measure nothing: fit the JSON of runs at several scale factors (see above)",
    )
    parser.add_argument(
        "--summary",
        metavar="FILE",
        help="measure nothing: the targets and the seconds by layer of a run's JSON (see above)",
    )
    parser.add_argument(
        "--fresh-process-batch",
        action="store_true",
        help="also run the batch and the run with nothing new in a fresh process (see above)",
    )
    # The child of --fresh-process-batch: the batch on the lake its parent put back.
    parser.add_argument("--batch-in-this-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    keeps_instance = args.fresh_process_batch or args.batch_in_this_process
    if keeps_instance and not args.folder:
        parser.error("--fresh-process-batch needs --folder: the lake is put back there for the fresh process")
    if args.fit or args.summary:
        from medallion_assets.definitions import build_definitions

        layers = step_layers(build_definitions("local"))
        if args.summary:
            print(targets_summary(json.loads(Path(args.summary).read_text()), layers))
        else:
            print(fit_report([json.loads(Path(name).read_text()) for name in args.fit], layers))
        return 0
    probes = install_probes(set()) if args.probes else None

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="medallion-incremental-"))
    lake = folder / "lake"
    os.environ["MEDALLION_LAKE_ROOT"] = str(lake)
    os.environ["DAGSTER_HOME"] = str(folder / "dagster_home")
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)

    from dagster import DagsterInstance, materialize

    from medallion_assets.definitions import build_definitions
    from medallion_assets.delta import latest_log_version
    from medallion_assets.pipelines.tpch.simulator import land_next_batch

    if args.deletion_vectors:
        _merge_tables_with_deletion_vectors()

    delivery = {"scale_factor": args.scale_factor, "batches": args.batches, "seed": 7, "work_dir": folder / "tpch"}
    started = time.monotonic()
    for _ in range(0 if args.batch_in_this_process else args.batches - 1):
        land_next_batch(lake / "landing", **delivery)
    landing_s = time.monotonic() - started

    defs = build_definitions("local")
    assets = [a for a in defs.assets if not any(k.path[0] == "landing" for k in a.keys)]
    instance = DagsterInstance.get() if keeps_instance else DagsterInstance.ephemeral()
    # Settings read through EnvVar resolve only when Dagster initializes the resource.
    warm = defs.resources["spark"].process_config_and_initialize()
    started = time.monotonic()
    engine = warm.delta_engine_in_use.name
    session_start_s = time.monotonic() - started
    if args.deletion_vectors and engine != "delta-spark":
        parser.error(
            f"--deletion-vectors needs the delta-spark engine (this session runs {engine}): "
            "set DELTA_SPARK_JARS or MEDALLION_DELTA_ENGINE=delta-spark"
        )

    lake_tables = defs.resources["lake"].process_config_and_initialize()

    def versions() -> dict[str, int]:
        return {f"{layer}/{table}": latest_log_version(path) for layer, table, path in lake_tables.delta_tables()}

    def run(name: str) -> dict:
        versions_before = versions()
        load_before = _load()
        began, began_wall = time.monotonic(), time.time()
        # Matched to the step running at each sample: which step grows the driver.
        with PeriodicSampler(driver_memory_sample, interval=0.2) as driver_memory:
            result = materialize(
                [*assets, *defs.asset_checks], resources=defs.resources, instance=instance, raise_on_error=False
            )
        logs = instance.all_logs(result.run_id)
        seconds = step_seconds(logs)
        ended = time.monotonic()
        success = result.success
        # materialize() keeps every output value in its result (Dagster's output capture, for
        # output_for_node), and a DataFrame keeps its query's broadcast relations: measured
        # while the result holds them, after it is dropped, and once what Dagster keeps reachable
        # is released (release_objects_pinned_by_dagster): the last is what a run launched by
        # `dagster dev` or a schedule (which captures no output) leaves the JVM.
        held_mb, _ = jvm_live_heap(warm.spark_session, top=0)
        del result
        heap = heap_after_result_dropped(warm.spark_session, top=6)
        committed = {table: version - versions_before.get(table, -1) for table, version in versions().items()}
        committed = {table: count for table, count in sorted(committed.items()) if count}
        probed = [record for record in probes.records if record["t0"] >= began_wall] if probes else []
        return {
            "run": name,
            "success": success,
            "work_s": round(ended - began, 1),
            "load_before_after": [load_before, _load()],
            # Peaks so far in the process's life (VmHWM), and what the JVM keeps after this run.
            "peak_mb_so_far": tree_peak_memory(os.getpid()),
            "python_driver_memory_by_step": memory_by_step(driver_memory.samples, step_events(logs)),
            **heap,
            "jvm_live_heap_with_outputs_held_mb": held_mb,
            "slowest_steps_s": dict(sorted(seconds.items(), key=lambda item: -item[1])[: args.slowest]),
            "steps_s": seconds,
            "table_versions_committed": sum(committed.values()),
            "table_versions_by_table": committed,
            **(
                {
                    "calls_by_site_s": [
                        {"call": kind, "site": site, "calls": calls, "seconds": round(total, 1)}
                        for kind, site, calls, total in by_site(probed)[:15]
                    ],
                    "python_driver_memory_by_call": memory_by_call(driver_memory.samples, probed),
                }
                if probes
                else {}
            ),
        }

    if args.batch_in_this_process:
        emit_json({"runs": [run("incremental"), run("nothing new")], "session_start_s": round(session_start_s, 1)})
        warm.spark_session.stop()
        return 0
    runs = [run("full")]
    landed = land_next_batch(lake / "landing", **delivery)
    aside = folder / "before_the_batch"
    if args.fresh_process_batch:
        _copy_aside(folder, aside)
    runs.append({**run("incremental"), "landed_files": len(landed.files)})
    runs.append(run("nothing new"))
    fresh = None
    if args.fresh_process_batch:
        warm.spark_session.stop()
        instance.dispose()
        _put_back(aside, folder)
        child = [
            __file__,
            "--scale-factor",
            str(args.scale_factor),
            "--batches",
            str(args.batches),
            "--folder",
            str(folder),
            "--slowest",
            str(args.slowest),
            "--batch-in-this-process",
            *(["--probes"] if args.probes else []),
            *(["--deletion-vectors"] if args.deletion_vectors else []),
        ]
        fresh = run_child(child, "the batch in a fresh process")
    report = {
        "scale_factor": args.scale_factor,
        "batches": args.batches,
        "engine": engine,
        "deletion_vectors": args.deletion_vectors,
        "cpus": os.cpu_count(),
        "landing_s": round(landing_s, 1),
        "session_start_s": round(session_start_s, 1),
        "incremental_share_of_full": round(runs[1]["work_s"] / runs[0]["work_s"], 3),
        "runs": runs,
        **(
            {
                "fresh_process": {
                    "incremental_share_of_full": round(fresh["runs"][0]["work_s"] / runs[0]["work_s"], 3),
                    **fresh,
                }
            }
            if fresh
            else {}
        ),
    }
    print(json.dumps(report, indent=2))
    # On stderr: standard output stays the JSON that --fit and --summary read.
    print(targets_summary(report, step_layers(defs)), file=sys.stderr)
    if not fresh:
        warm.spark_session.stop()
    if not args.folder:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
