"""Run one segment of a session as a real verl PPO run: `python -m workbench.runner.launch --session DIR --segment N`.

The supervisor starts this as its own process (verl's `run_ppo` never shuts Ray down, so ending this process tree is
what frees the GPUs). Without `--session`, it takes Hydra overrides like `verl.trainer.main_ppo` does, records a new
session directory for the run, and runs it: that is what `plan.to_command()` emits for plans that need the workbench
(critic on its own GPUs, LoRA critic).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from ..store import Store
from .runtime import CRITIC_GPUS_ENV, SEGMENT_ENV, SESSION_ENV, die_with_supervisor, runtime_config
from .task_runner import WorkbenchTaskRunner

def run_segment(session_dir: Path, segment_id: int) -> None:
    from ..plan import Plan

    store = Store(session_dir)
    segment = store.segment(segment_id)
    if segment is None:
        raise SystemExit(f"session {session_dir} has no segment {segment_id}")
    plan = Plan.from_json(segment["plan_json"])
    os.environ[SESSION_ENV] = str(session_dir)
    os.environ[SEGMENT_ENV] = str(segment_id)
    os.environ[CRITIC_GPUS_ENV] = str(plan.workbench.get("critic_gpus", 0))
    config, notes = runtime_config(plan.config, session_dir)
    for note in notes:
        store.add_event("runtime", note)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=WorkbenchTaskRunner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.runner.launch", description=__doc__)
    parser.add_argument("--session", type=Path, help="session directory (the supervisor passes it)")
    parser.add_argument("--segment", type=int, help="segment id in that session's store")
    parser.add_argument("--critic-gpus", type=int, default=0, help="GPUs for the critic alone (overrides mode)")
    parser.add_argument("overrides", nargs="*", help="verl Hydra overrides (overrides mode)")
    args = parser.parse_args(argv)
    if args.session is not None:
        die_with_supervisor()
        if args.segment is None:
            parser.error("--session needs --segment")
        run_segment(args.session, args.segment)
        return 0
    from ..plan import Plan
    from ..session import new_session_dir

    plan = Plan.from_verl(overrides=args.overrides)
    if args.critic_gpus:
        plan = plan.with_changes({"critic_gpus": args.critic_gpus})
    plan.validate()
    session_dir = new_session_dir()
    store = Store(session_dir)
    segment_id = store.begin_segment(plan.to_json(), reason="launched from the command line")
    os.environ.update(plan.secrets_env())  # credentials reach the run by environment, never through the store
    print(f"workbench session: {session_dir}", file=sys.stderr)
    run_segment(session_dir, segment_id)
    store.end_segment(segment_id, "done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
