"""Run a plan with verl from the command line, where verl's own entry point can't (a critic on GPUs of its own, a
LoRA critic): `python -m workbench.launch [--critic-gpus N] OVERRIDES...` — what `Plan.to_command()` emits then.

It takes Hydra overrides like `python -m verl.trainer.main_ppo`, records a new session directory for the run (so a
notebook can attach to it and read its steps), and runs the plan's one segment in this process.
"""

from __future__ import annotations

import argparse
import os
import sys

from .paths import new_session_dir
from .plan import Plan
from .store import Store
from .runs import write_segment_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.launch", description=__doc__)
    parser.add_argument("--critic-gpus", type=int, default=0, help="GPUs for the critic alone")
    parser.add_argument("overrides", nargs="*", help="verl Hydra overrides")
    args = parser.parse_args(argv)
    plan = Plan.from_verl(overrides=args.overrides)
    if args.critic_gpus:
        plan = plan.with_changes({"critic_gpus": args.critic_gpus})
    plan.validate()
    session_dir = new_session_dir()
    store = Store(session_dir)
    segment_id = store.begin_segment(plan.to_json(), reason="launched from the command line")
    os.environ.update(write_segment_config(session_dir, segment_id, plan))
    os.environ.update(plan.secrets_env())  # credentials reach the run by environment, never through the store
    print(f"workbench session: {session_dir}", file=sys.stderr)
    from .runner.launch import run_segment  # imports verl: after the plan's checks, which need none of it

    run_segment(session_dir, segment_id)
    store.end_segment(segment_id, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
