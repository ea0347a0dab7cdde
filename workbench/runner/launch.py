"""Run one segment of a session as a real verl PPO run: `python -m workbench.runner.launch --session DIR --segment N`.

Whoever launches the run (the supervisor, or `python -m workbench.launch` for a plan run from the command line) has
written the segment's composed verl config (control.segment_config_path) and set the run's environment
(control.CRITIC_GPUS_ENV, credentials): the runner reads no plan. verl's `run_ppo` never shuts Ray down, so each
segment runs in its own process, and ending this process tree is what frees the GPUs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from .. import control as c
from ..store import Store
from ..control import SEGMENT_ENV, SESSION_ENV
from ..procs import die_with_supervisor
from ..ray_cluster import join_or_own_ray
from .runtime import runtime_config
from .task_runner import WorkbenchTaskRunner


def run_segment(session_dir: Path, segment_id: int) -> None:
    config_path = c.segment_config_path(session_dir, segment_id)
    if not config_path.exists():
        raise SystemExit(f"session {session_dir} has no config for segment {segment_id} ({config_path})")
    store = Store(session_dir)
    os.environ[SESSION_ENV] = str(session_dir)
    os.environ[SEGMENT_ENV] = str(segment_id)
    config, notes = runtime_config(OmegaConf.load(config_path), session_dir)
    for note in [*notes, join_or_own_ray()]:  # before verl's ray.init: a session cluster that can't take it is left
        if note:
            store.add_event(c.EV_RUNTIME, note)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=WorkbenchTaskRunner)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.runner.launch", description=__doc__)
    parser.add_argument("--session", type=Path, required=True, help="session directory")
    parser.add_argument("--segment", type=int, required=True, help="segment id in that session's store")
    args = parser.parse_args(argv)
    die_with_supervisor()
    run_segment(args.session, args.segment)
    return 0


if __name__ == "__main__":
    sys.exit(main())
