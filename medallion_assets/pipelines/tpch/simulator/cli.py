"""The ``simulate`` command of ``medallion-assets``."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, get_args

from medallion_assets.pipelines.tpch.simulator.delivery import (
    AllBatchesLandedError,
    OrderEventsTo,
    land_all,
    land_next_batch,
)
from medallion_assets.settings import SettingsError, read_settings


def add_simulate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``simulate`` command to an argparse sub-parser collection.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.

    Returns:
        The new parser; its ``func`` default is :func:`simulate_command`.
    """
    parser = subparsers.add_parser("simulate", help="land the next batch of a noisy TPC-H delivery")
    parser.add_argument("--lake-root", default=None, help="lake root (default: $MEDALLION_LAKE_ROOT or ./lakehouse)")
    parser.add_argument("--scale-factor", type=float, default=0.01)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--all", action="store_true", help="land every remaining batch")
    parser.add_argument("--work-dir", default=None, help="cache folder for generated TPC-H data")
    parser.add_argument(
        "--order-events-to",
        choices=get_args(OrderEventsTo),
        default="files",
        help="land order events as files, publish them to Kafka (MEDALLION_KAFKA_BOOTSTRAP_SERVERS, "
        "MEDALLION_KAFKA_TOPIC), or both",
    )
    parser.set_defaults(func=simulate_command)
    return parser


def add_commands(subcommands: Any) -> None:
    """The hook ``medallion-assets`` looks up in its pipelines' ``cli`` modules: adds ``simulate``."""
    add_simulate_parser(subcommands)


def simulate_command(args: argparse.Namespace) -> int:
    """Run the ``simulate`` command; returns the process exit code."""
    try:
        settings = read_settings()
    except SettingsError as error:
        print(f"medallion-assets simulate: {error}", file=sys.stderr)
        return 2
    root = args.lake_root or settings.lake_root.location
    if "://" in root:
        print(
            f"medallion-assets simulate: the lake root {root!r} is a URI: the simulator lands into a local folder "
            "only; give --lake-root a local folder and upload its landing/ to the lake's (docs/deployment.md)",
            file=sys.stderr,
        )
        return 2
    landing = Path(root) / "landing"
    options = dict(
        scale_factor=args.scale_factor,
        batches=args.batches,
        seed=args.seed,
        work_dir=args.work_dir,
        order_events_to=args.order_events_to,
    )
    if args.order_events_to != "files":
        # deferred: the Kafka delivery's resources load pyspark; the command starts without it
        from medallion_assets.kafka import publish_files
        from medallion_assets.resources import kafka_resource

        kafka = kafka_resource(settings, resolved=True)
        options["publish"] = functools.partial(publish_files, kafka)
    if args.all:
        landed = land_all(landing, **options)
    else:
        try:
            landed = [land_next_batch(landing, **options)]
        except AllBatchesLandedError as error:
            print(error, file=sys.stderr)
            return 1
    for batch in landed:
        print(f"landed batch {batch.batch}/{batch.batches}: {len(batch.files)} files")
    if not landed:
        print(f"nothing to land: every batch is already in {landing}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m medallion_assets.pipelines.tpch.simulator.cli simulate ...``."""
    parser = argparse.ArgumentParser(prog="medallion-assets")
    add_simulate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
