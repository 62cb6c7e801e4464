"""The ``medallion-assets`` command."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Sequence
from types import ModuleType

from medallion_assets.check_gate import add_check_parser
from medallion_assets.continuous import add_stream_parser
from medallion_assets.settings import PROJECT_PIPELINES

#: A pipeline package adds sub-commands in a module of this name, with ``add_commands(subcommands)``
#: (``subcommands`` is what ``ArgumentParser.add_subparsers()`` returned). Only these modules of the
#: pipelines are imported, so the command starts without their Spark code.
COMMANDS_MODULE = "cli"
COMMANDS_HOOK = "add_commands"


def pipeline_command_modules(package: str = PROJECT_PIPELINES) -> list[ModuleType]:
    """The ``cli`` modules of ``package`` and its sub-packages, imported, in name order."""
    root = importlib.import_module(package)
    return [
        importlib.import_module(info.name)
        for info in pkgutil.walk_packages(getattr(root, "__path__", []), prefix=f"{package}.")
        if info.name.rsplit(".", 1)[-1] == COMMANDS_MODULE
    ]


def build_parser() -> argparse.ArgumentParser:
    """The command's parser; each subcommand sets ``func``.

    ``simulate`` comes from the project's pipelines (TPC-H's simulator, through
    :data:`COMMANDS_HOOK`, whatever ``MEDALLION_DEMO`` says); ``stream`` (continuous bronze
    ingestion) is added next to it by the continuous runner; ``check`` (the
    asset checks as a CI gate, with JUnit XML) by :mod:`medallion_assets.check_gate`.
    """
    parser = argparse.ArgumentParser(prog="medallion-assets", description="Bronze/silver/gold Delta lakehouse tools.")
    subcommands = parser.add_subparsers(dest="command", required=True)
    for module in pipeline_command_modules():
        getattr(module, COMMANDS_HOOK)(subcommands)
    add_stream_parser(subcommands)
    add_check_parser(subcommands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
