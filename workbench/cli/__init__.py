"""`verl-workbench …`: one top-level parser; each module in COMMANDS adds its own subcommands.

The CLI is a view, like widgets/: it reads and controls sessions only through Session. A module
`workbench.cli.<topic>` provides `add_<topic>_commands(subparsers)`, which adds its parsers to the
top-level subparsers (`subparsers.add_parser(name, **described(name))`) and gives each runnable parser
`set_defaults(func=handler)`, where `handler(args) -> int` returns the exit status.

Only the module of the command given is imported (some import pandas, torch or verl: seconds); the others stand in
the top-level help by their line in COMMANDS, so `verl-workbench --help` answers at once.

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
# command -> (the module that adds its parser, what it does in one line)
COMMANDS = {
    "up": ("workbench.cli.up",
           "start a session (live verl with a GPU, a recorded H200 session without) and serve its dashboard"),
    "plan": ("workbench.cli.plan", "show, validate, diff and export a plan (verl config + knobs)"),
    "data": ("workbench.cli.data", "prepare datasets and offline model assets"),
    "balance": ("workbench.cli.telemetry", "per-GPU load balance of a session, with verdicts"),
    "sample": ("workbench.cli.telemetry", "sample this machine's GPUs through NVML, as CSV"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad argument said in one line (the usage is one --help away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {' '.join(message.split())[:QUOTE_LIMIT + 100]} (see {self.prog} --help)\n")


def described(command: str) -> dict[str, str]:
    """The help (in the command list) and description (atop its own --help) of a top-level command."""
    line = COMMANDS[command][1]
    return {"help": line, "description": line[0].upper() + line[1:] + "."}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="verl-workbench",
        description="Drive a live verl PPO session from a dashboard or a notebook and tune it while it runs; "
                    "without a GPU, replay sessions recorded on an H200.",
        epilog="`verl-workbench COMMAND --help` for a command's options.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    given = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), None)
    wanted = COMMANDS[given][0] if given in COMMANDS else None
    added: set[str] = set()
    for command, (module_name, _) in COMMANDS.items():
        if module_name == wanted:
            if module_name not in added:
                topic = module_name.rpartition(".")[2]
                getattr(importlib.import_module(module_name), f"add_{topic}_commands")(subparsers)
                added.add(module_name)
        else:
            subparsers.add_parser(command, **described(command))  # listed; its module loads when it is given
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser(argv).parse_args(argv)
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
