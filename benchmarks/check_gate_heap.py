"""What the CI gate's JVM holds while it runs: ``medallion-assets check`` sampled from outside.

Run by hand from a clone of the commit under test (``DELTA_SPARK_JARS`` set for
delta-spark)::

    PYTHONPATH=<clone> python benchmarks/check_gate_heap.py [--scale-factor 0.1] [--every 8]

It starts the gate as a user's CI job does (``python -m medallion_assets.cli
check``, on the simulator's sample at ``--scale-factor``) and, every ``--every``
seconds while it runs, reads the live heap of its JVM with ``jcmd <pid>
GC.class_histogram``, which collects first, so it counts only what the driver
still reaches. A sample forces a full collection, so the run is a little
slower than an unsampled one. It prints JSON: the samples (seconds since the
start, live MB), their largest and last, the exit code and the wall time.
Comparing two commits means running it from a clone of each, one after the
other; a sample's moment falls on a different step from run to run, so
compare the samples of the same phase (the gold steps come last).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from engine_runs import process_tree


def _jvm_of(root: int) -> int | None:
    """The ``java`` descendant of ``root`` (the gate's Spark driver), if it has started."""
    for pid in process_tree(root):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "java":
                return pid
        except OSError:
            continue
    return None


def _live_mb(pid: int) -> float | None:
    try:
        text = subprocess.run(
            ["jcmd", str(pid), "GC.class_histogram"], capture_output=True, text=True, timeout=120
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in reversed(text.splitlines()):
        parts = line.split()
        # "Total   2345678   123456789": instances, bytes
        if len(parts) == 3 and parts[0] == "Total" and parts[2].isdigit():
            return round(int(parts[2]) / 2**20, 1)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale-factor", type=float, default=0.1, help="the sample's TPC-H scale factor")
    parser.add_argument("--every", type=float, default=8.0, help="seconds between samples")
    args = parser.parse_args(argv)
    if shutil.which("jcmd") is None:
        parser.error("jcmd (the JDK's tool) is needed to read the JVM's live heap")
    started = time.monotonic()
    gate = subprocess.Popen(
        [sys.executable, "-m", "medallion_assets.cli", "check", "--scale-factor", str(args.scale_factor)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=os.environ.copy(),
    )
    samples = []
    while gate.poll() is None:
        time.sleep(args.every)
        jvm = _jvm_of(gate.pid)
        live = _live_mb(jvm) if jvm is not None and gate.poll() is None else None
        if live is not None:
            samples.append([round(time.monotonic() - started), live])
    summary = (gate.stdout.read() if gate.stdout else "").strip().splitlines()
    print(
        json.dumps(
            {
                "scale_factor": args.scale_factor,
                "exit_code": gate.returncode,
                "wall_s": round(time.monotonic() - started, 1),
                "gate_summary": summary[-1] if summary else None,
                "load_1min_at_end": round(os.getloadavg()[0], 1),
                "live_heap_mb_samples": samples,
                "largest_mb": max((mb for _, mb in samples), default=None),
                "last_mb": samples[-1][1] if samples else None,
            },
            indent=1,
        )
    )
    return 0 if gate.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
