"""What an incremental run costs against the full run: a batch of about 1% after the other 99%.

Run by hand from the repository root (``DELTA_SPARK_JARS`` set for delta-spark)::

    python benchmarks/incremental.py [--scale-factor 0.1] [--batches 100] [--folder WORK]

In one Python process and one SparkSession it lands all but the last batch of
a noisy TPC-H delivery split into ``--batches`` batches, materializes every
asset and check (the full run), lands the last batch (about ``1/batches`` of
the changes) and materializes again (the incremental run), then once more
with nothing new. Each run is timed as work (session start excluded) with its
slowest steps, and the incremental run as a share of the full one. With
``--probes`` each run also lists the Spark, Delta and IO-manager calls its
time went to, by kind and call site (``pipeline_vs_plain.py``'s probes). With
``--deletion-vectors`` (delta-spark only) the tables written by MERGE are
created with deletion vectors, as ``ApplyChanges(deletion_vectors=True)``
creates a feed's silver table: their MERGEs mark the rows they replace instead
of rewriting the files. It prints JSON. ``--folder`` keeps the lake (and
tpchgen's data) for a rerun; without it a temporary folder is removed at the end.
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

from materialize_all import step_seconds
from pipeline_vs_plain import by_site, install_probes, jvm_live_heap, tree_peak_memory


def _load() -> float:
    return round(os.getloadavg()[0], 1)


def _merge_tables_with_deletion_vectors() -> None:
    """Give every table the IO manager creates for MERGE the property ``delta.enableDeletionVectors``.

    TPC-H's ``orders`` and ``lineitem`` come from the pipeline's own silver step,
    which has no switch for it; the other tables keep none, since the pandas
    report reads gold through delta-rs, which cannot read a table that has them.
    """
    from medallion_assets.io_manager import DELETION_VECTORS, client

    declared = client.table_properties_for

    def with_deletion_vectors(spec, schema):
        properties = declared(spec, schema)
        return {**properties, DELETION_VECTORS: "true"} if spec.mode == "merge" else properties

    client.table_properties_for = with_deletion_vectors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1)
    parser.add_argument("--batches", type=int, default=100, help="the delivery's batches; the last is the increment")
    parser.add_argument("--folder", help="keep the lake here (default: a temporary folder)")
    parser.add_argument("--slowest", type=int, default=8, help="steps listed per run, slowest first")
    parser.add_argument("--probes", action="store_true",
                        help="time the Spark, Delta and IO-manager calls of each run, by call site")
    parser.add_argument("--deletion-vectors", action="store_true",
                        help="create the tables written by MERGE with deletion vectors (delta-spark only)")
    args = parser.parse_args(argv)
    probes = install_probes(set()) if args.probes else None

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="medallion-incremental-"))
    lake = folder / "lake"
    os.environ["MEDALLION_LAKE_ROOT"] = str(lake)
    os.environ["DAGSTER_HOME"] = str(folder / "dagster_home")
    Path(os.environ["DAGSTER_HOME"]).mkdir(parents=True, exist_ok=True)

    from dagster import DagsterInstance, materialize

    from medallion_assets.definitions import build_definitions
    from medallion_assets.simulate import land_next_batch

    if args.deletion_vectors:
        _merge_tables_with_deletion_vectors()

    delivery = {"scale_factor": args.scale_factor, "batches": args.batches, "seed": 7, "work_dir": folder / "tpch"}
    started = time.monotonic()
    for _ in range(args.batches - 1):
        land_next_batch(lake / "landing", **delivery)
    landing_s = time.monotonic() - started

    defs = build_definitions("local")
    assets = [a for a in defs.assets if not any(k.path[0] == "landing" for k in a.keys)]
    instance = DagsterInstance.ephemeral()
    # Settings read through EnvVar resolve only when Dagster initializes the resource.
    warm = defs.resources["spark"].process_config_and_initialize()
    started = time.monotonic()
    engine = warm.delta_engine_in_use.name
    session_start_s = time.monotonic() - started
    if args.deletion_vectors and engine != "delta-spark":
        parser.error(f"--deletion-vectors needs the delta-spark engine (this session runs {engine}): "
                     "set DELTA_SPARK_JARS or MEDALLION_DELTA_ENGINE=delta-spark")

    def run(name: str) -> dict:
        load_before = _load()
        began, began_wall = time.monotonic(), time.time()
        result = materialize([*assets, *defs.asset_checks], resources=defs.resources, instance=instance,
                             raise_on_error=False)
        seconds = step_seconds(instance.all_logs(result.run_id))
        ended = time.monotonic()
        live_heap_mb, holders = jvm_live_heap(warm.spark_session, top=6)
        return {
            "run": name,
            "success": result.success,
            "work_s": round(ended - began, 1),
            "load_before_after": [load_before, _load()],
            # Peaks so far in the process's life (VmHWM), and what the JVM keeps after this run.
            "peak_mb_so_far": tree_peak_memory(os.getpid()),
            "jvm_live_heap_mb": live_heap_mb,
            "jvm_live_heap_by_class": holders,
            "slowest_steps_s": dict(sorted(seconds.items(), key=lambda item: -item[1])[: args.slowest]),
            **({"calls_by_site_s": [
                {"call": kind, "site": site, "calls": calls, "seconds": round(total, 1)}
                for kind, site, calls, total in by_site([r for r in probes.records if r["t0"] >= began_wall])[:15]
            ]} if probes else {}),
        }

    runs = [run("full")]
    landed = land_next_batch(lake / "landing", **delivery)
    runs.append({**run("incremental"), "landed_files": len(landed.files)})
    runs.append(run("nothing new"))
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
    }
    print(json.dumps(report, indent=2))
    warm.spark_session.stop()
    if not args.folder:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
