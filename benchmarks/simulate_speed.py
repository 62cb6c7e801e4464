"""What landing a simulated batch costs: wall time, CPU time and peak memory per batch.

Run by hand (not a test), from the project root:

    python benchmarks/simulate_speed.py --scale-factors 0.1 1 10 --batches 2

For each scale factor it times, each in its own process:

1. ``tpchgen-cli`` alone (into a scratch folder that is deleted afterwards),
   which is what the first call of the simulator pays on top of landing;
2. ``medallion-assets simulate`` for batch 1 with an empty TPC-H cache (so
   generation included), then every other batch with the cache warm;
3. batch 1 again in a fresh lake with the cache warm: landing alone
   (``--no-warm-rerun`` skips it).

It uses only the command line, so it measures any version of the simulator
(check out an older commit to get its figures). Timings depend on the
machine's load; the 1-minute load average at the start of each step is
printed next to it. Prints a Markdown table; ``--json`` prints JSON as well.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _tool(name: str) -> str:
    beside_python = Path(sys.executable).parent / name
    return str(beside_python) if beside_python.exists() else (shutil.which(name) or name)


def measure(command: list[str], env: dict[str, str] | None = None) -> dict[str, float]:
    """Run ``command`` and return its wall time, CPU time and peak RSS.

    The child's resource usage comes from ``wait4``, so nothing but the
    standard library is needed.

    Raises:
        subprocess.CalledProcessError: When the command fails.
    """
    load = os.getloadavg()[0]
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stderr=stderr)
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        # ru_maxrss is in KiB on Linux.
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "load_1min": load,
    }


def folder_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file()) / 1e6


def run(scale_factor: float, batches: int, scratch: Path, warm_rerun: bool = True) -> list[dict[str, object]]:
    """Every measurement of one scale factor, as table rows."""
    rows: list[dict[str, object]] = []
    work_dir = scratch / "tpch-cache"
    generated = scratch / "tpchgen-alone"
    command = [_tool("tpchgen-cli"), "parquet", "--scale-factor", str(scale_factor), "--output-dir", str(generated)]
    rows.append({"scale_factor": scale_factor, "step": "tpchgen-cli alone", **measure(command)})
    shutil.rmtree(generated, ignore_errors=True)

    simulate = [
        _tool("medallion-assets"),
        "simulate",
        "--scale-factor",
        str(scale_factor),
        "--batches",
        str(batches),
        "--work-dir",
        str(work_dir),
    ]
    lakes = [("lake", range(1, batches + 1))] + ([("lake-warm", range(1, 2))] if warm_rerun else [])
    for lake_name, batch_numbers in lakes:
        lake = scratch / lake_name
        env = {**os.environ, "MEDALLION_LAKE_ROOT": str(lake)}
        for batch in batch_numbers:
            before = folder_mb(lake) if lake.exists() else 0.0
            figures = measure(simulate, env)
            if lake_name == "lake-warm":
                step = f"batch {batch}/{batches}, TPC-H cached"
            elif batch == 1:
                step = f"batch 1/{batches}, generation included"
            else:
                step = f"batch {batch}/{batches}"
            rows.append({"scale_factor": scale_factor, "step": step, **figures, "landed_mb": folder_mb(lake) - before})
        shutil.rmtree(lake, ignore_errors=True)
    shutil.rmtree(work_dir, ignore_errors=True)
    return rows


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "| scale factor | step | wall s | CPU s | peak RSS MB | landed MB | load (1 min) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        landed = f"{row['landed_mb']:,.0f}" if "landed_mb" in row else ""
        lines.append(
            f"| {row['scale_factor']:g} | {row['step']} | {row['wall_s']:.1f} | {row['cpu_s']:.1f} "
            f"| {row['peak_rss_mb']:,.0f} | {landed} | {row['load_1min']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale-factors", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--scratch", default=None, help="folder for the data (default: a new temp folder, deleted)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    parser.add_argument("--no-warm-rerun", action="store_true", help="skip step 3 (saves time and disk at SF 10)")
    args = parser.parse_args(argv)
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="simulate-speed-"))
    rows: list[dict[str, object]] = []
    try:
        for scale_factor in args.scale_factors:
            rows += run(scale_factor, args.batches, scratch / f"sf{scale_factor:g}", not args.no_warm_rerun)
            # Progress, so a long run shows figures before it ends.
            print(markdown(rows), end="\n\n", file=sys.stderr, flush=True)
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(markdown(rows))
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
