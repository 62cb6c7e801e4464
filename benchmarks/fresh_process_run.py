"""A run with nothing new in a fresh process, as a schedule or ``dagster asset materialize`` pays it.

Run by hand from the repository root (``DELTA_SPARK_JARS`` set for delta-spark)::

    python benchmarks/fresh_process_run.py [--scale-factor 0.01] [--rounds 3] \
        [--engines delta-rs delta-spark] [--compare-with OTHER_CHECKOUT] [--select gold/pricing_summary] \
        [--jvm default class-archive c1]

Per engine it lands a noisy TPC-H delivery (two batches) in a temporary lake,
materializes everything once (bronze, silver, gold and the checks; the landing
asset excluded), then ``--rounds`` times once more with nothing new: everything
again, or only the ``--select``ed assets. Each run is a new Python process:
interpreter, imports, the Spark session (JVM start) and the Dagster run,
against a sqlite instance in the temporary folder, so every run pays what a
run launched from the UI or by a schedule pays.

With ``--compare-with`` the rounds alternate between this checkout and another
one (its ``PYTHONPATH``), the order flipped each round, on the same lake: an
A/B of a change in one sitting, at the same machine load.

``--jvm`` adds variants of the driver JVM's start, alternated the same way
(each passes its options as ``--driver-java-options`` in ``PYSPARK_SUBMIT_ARGS``,
as a user could):

- ``default``: the JVM as the project starts it;
- ``c1``: ``-XX:TieredStopAtLevel=1``, only the JIT's quick compiler;
- ``class-archive``: a dynamic class-data-sharing archive of the classes a run
  loads. One run with nothing new writes it (``-XX:ArchiveClassesAtExit``;
  its seconds and the archive's size are reported), the measured runs map it
  (``-Xshare:on -XX:SharedArchiveFile``: a run that cannot map it fails).
  The JDK maps an archive only when no folder with files in it is on the
  class path, and spark-submit puts Spark's configuration folder there:
  ``SPARK_CONF_DIR`` must be unset or name an empty folder.

Prints a Markdown table (median and each run: seconds of the Dagster run,
and of the whole process) and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
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

LAND = (
    "import sys; from medallion_assets.pipelines.tpch.simulator import land_all; "
    "land_all(sys.argv[1], scale_factor=float(sys.argv[2]), batches=2, seed=7)"
)


#: Driver JVM options of each ``--jvm`` variant (the class archive's are set per run).
JVM_VARIANTS = {"default": "", "c1": "-XX:TieredStopAtLevel=1", "class-archive": None}


def with_java_options(env: dict[str, str], options: str) -> dict[str, str]:
    """``env`` whose PySpark-launched driver JVM gets ``options`` (no change for none)."""
    if not options:
        return env
    return {**env, "PYSPARK_SUBMIT_ARGS": f"--driver-java-options {shlex.quote(options)} pyspark-shell"}


def wait_for_jvms_naming(text: str, timeout: float = 300.0) -> None:
    """Wait until no ``java`` process has ``text`` in its command line (a JVM still writing its archive)."""

    def names_it(process: Path) -> bool:
        try:
            return text.encode() in (process / "cmdline").read_bytes()
        except OSError:  # the process ended while being read
            return False

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(names_it(entry) for entry in Path("/proc").iterdir() if entry.name.isdigit()):
            return
        time.sleep(0.5)
    raise SystemExit(f"a JVM started with {text} was still running after {timeout:.0f} s")


def run_once(checkout: Path, env: dict[str, str], select: list[str] | None = None) -> dict:
    """One materialization (of ``select``, else everything) in a new interpreter importing ``checkout``."""
    started = time.monotonic()
    # -P: without it ``-c`` puts the working folder first on the path, and a run started in one
    # checkout would import that one whatever PYTHONPATH names.
    done = subprocess.run(
        [sys.executable, "-P", "-c", RUN, *(select or [])],
        env={**env, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
    )
    process_s = round(time.monotonic() - started, 1)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"the run from {checkout} failed:\n{done.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
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
    parser.add_argument(
        "--select",
        nargs="+",
        metavar="KEY",
        help="the runs with nothing new materialize only these assets (e.g. gold/pricing_summary), "
        "as a schedule of one table does",
    )
    parser.add_argument(
        "--jvm",
        nargs="+",
        choices=list(JVM_VARIANTS),
        metavar="VARIANT",
        help=f"driver JVM variants to alternate ({', '.join(JVM_VARIANTS)}); see the module's docstring",
    )
    args = parser.parse_args(argv)
    if "delta-spark" in args.engines and not os.environ.get("DELTA_SPARK_JARS"):
        parser.error("delta-spark needs DELTA_SPARK_JARS (or leave it out of --engines)")
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if "class-archive" in (args.jvm or []) and conf_dir and Path(conf_dir).is_dir() and any(Path(conf_dir).iterdir()):
        parser.error(
            f"--jvm class-archive: SPARK_CONF_DIR={conf_dir} holds files, and spark-submit puts it on the "
            "class path, where the JDK refuses a class archive; unset it or point it at an empty folder"
        )
    if args.compare_with and args.jvm:
        parser.error("--compare-with and --jvm: one comparison at a time")
    #: name -> (checkout, driver JVM options; None: the class archive's, set per engine)
    variants: dict[str, tuple[Path, str | None]] = {"this checkout": (HERE, "")}
    if args.compare_with:
        variants["--compare-with"] = (args.compare_with.resolve(), "")
    if args.jvm:
        variants = {f"--jvm {name}": (HERE, JVM_VARIANTS[name]) for name in args.jvm}

    rows = []
    archives: list[tuple[str, dict, int]] = []
    with LoadSampler() as load, tempfile.TemporaryDirectory(prefix="medallion-fresh-run-") as folder:
        for engine in args.engines:
            lake, home = Path(folder) / engine / "lake", Path(folder) / engine / "dagster_home"
            home.mkdir(parents=True)
            env = {
                **os.environ,
                "MEDALLION_LAKE_ROOT": str(lake),
                "DAGSTER_HOME": str(home),
                "MEDALLION_DELTA_ENGINE": engine,
            }
            subprocess.run(
                [sys.executable, "-P", "-c", LAND, str(lake / "landing"), str(args.scale_factor)],
                env={**env, "PYTHONPATH": str(HERE)},
                check=True,
            )
            first = run_once(HERE, env)
            print(f"{engine}: first run {first['run_s']} s", file=sys.stderr, flush=True)
            options = {name: java for name, (_, java) in variants.items()}
            if any(java is None for java in options.values()):
                archive = Path(folder) / engine / "classes.jsa"
                written = run_once(HERE, with_java_options(env, f"-XX:ArchiveClassesAtExit={archive}"), args.select)
                started = time.monotonic()
                wait_for_jvms_naming(str(archive))  # the JVM writes the archive as it exits
                written["process_s"] = round(written["process_s"] + time.monotonic() - started, 1)
                archives.append((engine, written, archive.stat().st_size if archive.exists() else 0))
                print(f"{engine}: archive written by a run of {written}", file=sys.stderr, flush=True)
                # -Xshare:on: a run that cannot map the archive fails instead of running without it.
                options = {
                    name: f"-Xshare:on -XX:SharedArchiveFile={archive}" if java is None else java
                    for name, java in options.items()
                }
            runs: dict[str, list[dict]] = {name: [] for name in variants}
            order = list(variants)
            for number in range(args.rounds):
                for name in order if number % 2 == 0 else order[::-1]:
                    checkout = variants[name][0]
                    runs[name].append(run_once(checkout, with_java_options(env, options[name]), args.select))
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
        print(
            f"| {engine} | {name} | {statistics.median(m['run_s'] for m in measured):.1f} "
            f"| {statistics.median(m['process_s'] for m in measured):.1f} | {each} |"
        )
    for engine, written, size in archives:
        print(
            f"\n{engine}: the run that wrote the class archive took {written['run_s']} s "
            f"(process {written['process_s']} s, until its JVM had exited); the archive holds {size / 2**20:.0f} MB."
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
