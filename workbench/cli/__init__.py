"""`verl-workbench …`: one top-level parser; each module in COMMAND_MODULES adds its own subcommands.

The CLI is a view, like widgets/: it reads and controls sessions only through Session. A module
`workbench.cli.<topic>` provides `add_<topic>_commands(subparsers)`, which adds its parsers to the
top-level subparsers and gives each runnable parser `set_defaults(func=handler)`, where `handler(args) -> int`
returns the exit status.

Bad input gets one line on stderr and nothing half-done: a bad argument is `verl-workbench up: argument --speed: …`
(exit 2), not a usage screen; an error a handler did not answer itself is its message in one line (exit 1), never a
traceback (VERL_WORKBENCH_DEBUG=1 shows it).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from ..bounds import QUOTE_LIMIT

DEBUG_ENV = "VERL_WORKBENCH_DEBUG"
COMMAND_MODULES = ["workbench.cli.up", "workbench.cli.plan", "workbench.cli.data", "workbench.cli.telemetry"]


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one line (the usage is one --help away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {' '.join(message.split())[:QUOTE_LIMIT + 100]} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="verl-workbench", description="Drive a live verl PPO session: plans, placement, telemetry.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        topic = module_name.rpartition(".")[2]
        add_commands = getattr(importlib.import_module(module_name), f"add_{topic}_commands")
        add_commands(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 — whatever a command did not answer itself: one line, not a traceback
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        words = " ".join(str(error).split()) or type(error).__name__
        if len(words) > QUOTE_LIMIT + 200:
            words = words[:QUOTE_LIMIT + 200] + "…"
        if isinstance(error, (TypeError, AttributeError, KeyError, IndexError, AssertionError, NameError)):
            words = f"internal error ({type(error).__name__}: {words}); {DEBUG_ENV}=1 shows where"
        print(f"verl-workbench {args.command}: {words}", file=sys.stderr, flush=True)
        return 1
