"""`verl-workbench …`: one top-level parser; each module in COMMAND_MODULES adds its own subcommands.

The CLI is a view, like widgets/: it reads and controls sessions only through Session. A module
`workbench.cli.<topic>` provides `add_<topic>_commands(subparsers)`, which adds its parsers to the
top-level subparsers and gives each runnable parser `set_defaults(func=handler)`, where `handler(args) -> int`
returns the exit status.
"""

from __future__ import annotations

import argparse
import importlib

COMMAND_MODULES = ["workbench.cli.up", "workbench.cli.plan", "workbench.cli.data", "workbench.cli.telemetry"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="verl-workbench", description="Drive a live verl PPO session: plans, placement, telemetry.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        topic = module_name.rpartition(".")[2]
        add_commands = getattr(importlib.import_module(module_name), f"add_{topic}_commands")
        add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
