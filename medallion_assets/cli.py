"""The ``medallion-assets`` command."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from medallion_assets.check_gate import add_check_parser
from medallion_assets.continuous import add_stream_parser
from medallion_assets.simulate import add_simulate_parser


def build_parser() -> argparse.ArgumentParser:
    """The command's parser; each subcommand sets ``func``.

    ``simulate`` comes from the simulator; ``stream`` (continuous bronze
    ingestion) is added next to it by the continuous runner; ``check`` (the
    asset checks as a CI gate, with JUnit XML) by :mod:`medallion_assets.check_gate`.
    """
    parser = argparse.ArgumentParser(prog="medallion-assets", description="Bronze/silver/gold Delta lakehouse tools.")
    subcommands = parser.add_subparsers(dest="command", required=True)
    add_simulate_parser(subcommands)
    add_stream_parser(subcommands)
    add_check_parser(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
