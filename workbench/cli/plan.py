"""`verl-workbench plan show|validate|diff|export`: a plan from verl overrides, a verl YAML and knob settings.

`add_plan_inputs` and `plan_from_args` are shared with other subcommands that take a plan the same way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from workbench.knobs import GROUPS, KNOBS
from workbench.bounds import quoted
from workbench.plan import Plan, PlanError, unknown_knob

from .args import positive_int

from . import described

EXPORT_FORMATS = ("overrides", "yaml", "command", "json")
# Exit status for a plan that is invalid or cannot be built (argparse also uses 2 for bad arguments).
EXIT_INVALID = 2


def add_plan_inputs(parser: argparse.ArgumentParser) -> None:
    """The options that describe a plan: verl overrides and/or a verl YAML, then knob settings."""
    parser.add_argument("--overrides", nargs="+", action="extend", default=[], metavar="OVERRIDE",
                        help="verl Hydra overrides, as given to verl.trainer.main_ppo")
    parser.add_argument("--yaml", metavar="FILE", help="a verl config YAML (full or partial)")
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE", dest="settings",
                        help="set a knob (repeatable); see `plan show` for the knobs")


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """KNOB=VALUE strings as knob values; ValueError naming the knob when one cannot be read."""
    changes: dict[str, Any] = {}
    for setting in settings:
        name, separator, text = setting.partition("=")
        name = name.strip()
        if not separator:
            raise ValueError(f"--set {quoted(setting, 80)}: expected KNOB=VALUE")
        if name not in KNOBS:
            raise PlanError([unknown_knob(name)])
        changes[name] = KNOBS[name].parse(text)
    return changes


def plan_from_args(args: argparse.Namespace, *, with_settings: bool = True) -> Plan:
    """The plan the input options describe."""
    if args.yaml:
        plan = Plan.from_yaml(args.yaml, args.overrides)
    else:
        plan = Plan.from_verl(args.overrides)
    return plan.with_changes(parse_settings(args.settings)) if with_settings else plan


def _plan_from_file(path: str) -> Plan:
    if Path(path).suffix == ".json":
        return Plan.from_json(Path(path).read_text())
    return Plan.from_yaml(path)


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _show(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    values, changed = plan.knob_values(), plan.changed_knobs()
    print("  knob                        value                default              apply    help")
    for group in GROUPS:
        print(group)
        for name, knob in KNOBS.items():
            if knob.group == group:
                mark = "*" if name in changed else " "
                print(f"{mark} {name:<27} {_text(values[name]):<20} {_text(knob.verl_default()):<20} "
                      f"{knob.apply:<8} {knob.help}")
    print("* = differs from its default")
    return 0


def _validate(args: argparse.Namespace) -> int:
    plan_from_args(args).validate(gpu_count=args.gpu_count)
    print("plan is valid")
    return 0


def _diff(args: argparse.Namespace) -> int:
    if len(args.plans) == 2:
        old, new = (_plan_from_file(path) for path in args.plans)
    elif not args.plans and args.settings:
        old, new = plan_from_args(args, with_settings=False), plan_from_args(args)
    else:
        print("plan diff: give two plan files (A B), or input options with --set changes", file=sys.stderr)
        return EXIT_INVALID
    entries = old.diff(new)
    for entry in entries:
        name = entry["knob"] or entry["keys"][0]
        print(f"{name}: {_text(entry['old'])} -> {_text(entry['new'])}  [{entry['apply']}]")
    print(f"apply: {old.apply_class(new)}" if entries else "no differences")
    return 0


def _export(args: argparse.Namespace) -> int:
    plan = plan_from_args(args)
    text = {
        "overrides": lambda: "\n".join(plan.to_overrides()),
        "yaml": plan.to_yaml,
        "command": plan.to_command,
        "json": plan.to_json,
    }[args.format]()
    print(text.rstrip("\n"))
    return 0


def _reporting_problems(handler):
    """Run a handler; a plan that cannot be built or is invalid prints its problems and exits 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except PlanError as error:  # one problem: one line; several: each on a line of its own
            if len(error.messages) == 1:
                print(f"plan: {error.messages[0]}", file=sys.stderr)
            else:
                print("plan problems:", *error.messages, sep="\n  ", file=sys.stderr)
        except (ValueError, OSError) as error:
            print(f"plan: {error}", file=sys.stderr)
        return EXIT_INVALID
    return run


def add_plan_commands(subparsers: argparse._SubParsersAction) -> None:
    plan = subparsers.add_parser("plan", **described("plan"))
    actions = plan.add_subparsers(dest="plan_action", required=True, metavar="ACTION")

    show = actions.add_parser("show", help="the knob table: values, defaults, apply class")
    add_plan_inputs(show)
    show.set_defaults(func=_reporting_problems(_show))

    validate = actions.add_parser("validate", help="check the plan; exit 2 listing every problem")
    add_plan_inputs(validate)
    validate.add_argument("--gpu-count", type=positive_int, metavar="N", help="GPUs on the machine that will run it")
    validate.set_defaults(func=_reporting_problems(_validate))

    diff = actions.add_parser("diff", help="what changes between plans A and B (.json plan or verl YAML), "
                                           "or what --set changes in the input plan")
    diff.add_argument("plans", nargs="*", metavar="PLAN_FILE")
    add_plan_inputs(diff)
    diff.set_defaults(func=_reporting_problems(_diff))

    export = actions.add_parser("export", help="the plan as verl overrides, YAML, a shell command or JSON")
    add_plan_inputs(export)
    export.add_argument("--format", choices=EXPORT_FORMATS, default="overrides")
    export.set_defaults(func=_reporting_problems(_export))
