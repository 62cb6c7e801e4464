"""Latency of continuous mode: a file landing -> its rows in bronze -> gold refreshed through the sensor.

What it does:

1. lands batch 1 of a simulated TPC-H delivery in a fresh lake and
   materializes every asset once (bronze with ``availableNow``, silver, gold);
2. starts ``medallion-assets stream`` (continuous mode) in a subprocess;
3. for each file size, lands one orders file of new orders and measures
   * bronze: until a committed micro-batch of the checkpoint lists the file;
   * gold: until the ``orders_raw`` checkpoint sensor (ticked every
     ``--sensor-interval`` seconds, as the daemon would) has reported the batch
     and the downstream run it requested (silver + gold) has finished;
4. stops the stream with SIGTERM and prints the figures (``--json`` for JSON).

Run from the project root (2 cores: expect minutes)::

    python benchmarks/streaming_latency.py --sizes 10 2000
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def new_orders_file(landing: Path, name: str, count: int, key_base: int) -> Path:
    """An orders file of ``count`` new orders, cloned from landed events with fresh keys."""
    templates = []
    for path in sorted(landing.glob("*.json")):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("op") == "upsert" and (event.get("order") or {}).get("lineitems"):
                templates.append(event)
        if len(templates) >= 50:
            break
    if not templates:
        raise SystemExit("no upsert event to clone in landing/orders")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = []
    for i in range(count):
        event = json.loads(json.dumps(templates[i % len(templates)]))
        event["event_id"] = f"bench-{key_base + i}"
        event["event_time"] = now
        event["order"]["o_orderkey"] = key_base + i
        lines.append(json.dumps(event))
    tmp = landing / f".{name}.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    target = landing / name
    tmp.rename(target)
    return target


def committed_batch_with(checkpoint: str, uri: str) -> int | None:
    from medallion_assets.checkpoints import read_checkpoint

    state = read_checkpoint(checkpoint)
    for batch in sorted(state.commits, reverse=True):
        if uri in state.input_files(batch):
            return batch
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lake-root", default=None, help="Lake folder (default: a new temporary folder).")
    parser.add_argument("--scale-factor", type=float, default=0.001, help="TPC-H scale factor of the initial delivery.")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 2000], help="Orders per landed file.")
    parser.add_argument("--trigger-interval", default="1 second", help="Processing-time trigger of the streams.")
    parser.add_argument("--sensor-interval", type=float, default=1.0, help="Seconds between sensor ticks.")
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = parser.parse_args(argv)

    lake = Path(args.lake_root or tempfile.mkdtemp(prefix="medallion-latency-")).resolve()
    os.environ["MEDALLION_LAKE_ROOT"] = str(lake)
    from dagster import AssetSelection, DagsterInstance, SensorResult, build_sensor_context, materialize

    from medallion_assets.definitions import build_definitions
    from medallion_assets.pipelines.tpch import simulator
    from medallion_assets.resources import LakeResource

    defs = build_definitions("local")
    lake_res = LakeResource(root=str(lake))
    instance = DagsterInstance.ephemeral()
    assets = [a for a in defs.assets if not any(k.path[0] == "landing" for k in getattr(a, "keys", []))]

    print(f"lake: {lake}", file=sys.stderr)
    simulator.land_next_batch(lake / "landing", scale_factor=args.scale_factor, batches=2, seed=3)
    started = time.monotonic()
    first = materialize(assets, resources=defs.resources, instance=instance)
    assert first.success
    print(f"initial materialization: {time.monotonic() - started:.1f}s", file=sys.stderr)

    bronze_key = AssetSelection.assets(["bronze", "orders_raw"])
    downstream = bronze_key.downstream(include_self=False)
    sensor_def = defs.get_sensor_def("orders_raw_checkpoint_sensor")
    cursor = None

    def tick():
        nonlocal cursor
        context = build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake_res}, definitions=defs)
        result = sensor_def(context)
        if isinstance(result, SensorResult):
            cursor = result.cursor or cursor
            return result
        return None

    tick()  # the cursor starts after the batches of the initial run

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    log_path = lake / "stream.log"
    stream = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "medallion_assets.cli",
            "stream",
            "--lake-root",
            str(lake),
            "--trigger-interval",
            args.trigger_interval,
        ],
        env=env,
        stdout=log_path.open("w"),
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )

    def log_lines() -> list[str]:
        return log_path.read_text().splitlines()

    results = []
    try:
        deadline = time.monotonic() + 300
        while sum(": started" in line for line in log_lines()) < 2:
            if time.monotonic() > deadline or stream.poll() is not None:
                raise SystemExit("the streams did not start:\n" + "\n".join(log_lines()[-30:]))
            time.sleep(0.5)
        time.sleep(3)  # let the first (empty) triggers pass
        landing = lake / "landing" / "orders"
        checkpoint = lake_res.checkpoint_dir("orders_raw")
        for n, size in enumerate(args.sizes):
            path = new_orders_file(landing, f"latency-{n:02d}-{size}.json", size, 50_000_000 + n * 1_000_000)
            landed = time.monotonic()
            uri = path.resolve().as_uri()
            batch = None
            while batch is None:
                batch = committed_batch_with(checkpoint, uri)
                if batch is None:
                    time.sleep(0.05)
                if time.monotonic() - landed > 600:
                    raise SystemExit("the file never reached bronze")
            to_bronze = time.monotonic() - landed
            while True:
                result = tick()
                if result is not None and result.run_requests:
                    break
                time.sleep(args.sensor_interval)
            requested = time.monotonic() - landed
            refresh = materialize(
                assets,
                selection=downstream,
                resources=defs.resources,
                instance=instance,
                tags=result.run_requests[0].tags,
            )
            assert refresh.success
            to_gold = time.monotonic() - landed
            results.append(
                {
                    "orders": size,
                    "bytes": path.stat().st_size,
                    "batch": batch,
                    "landing_to_bronze_s": round(to_bronze, 2),
                    "landing_to_run_request_s": round(requested, 2),
                    "landing_to_gold_s": round(to_gold, 2),
                    "refresh_run_s": round(to_gold - requested, 2),
                }
            )
            print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        stream.send_signal(signal.SIGTERM)
        try:
            stream.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(stream.pid, signal.SIGKILL)
    progress = [line for line in log_lines() if "input_rows=" in line]
    if args.json:
        print(json.dumps({"results": results, "stream_progress": progress}, indent=2))
    else:
        print(f"{'orders':>7} {'bytes':>9} {'->bronze s':>10} {'->request s':>11} {'->gold s':>9} {'refresh s':>9}")
        for r in results:
            print(
                f"{r['orders']:>7} {r['bytes']:>9} {r['landing_to_bronze_s']:>10} {r['landing_to_run_request_s']:>11} "
                f"{r['landing_to_gold_s']:>9} {r['refresh_run_s']:>9}"
            )
        print("stream progress lines:")
        print("\n".join(progress[-10:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
