"""A restart-class change rebuilt in place: verl's trainer built anew inside the running TaskRunner.

A relaunch rebuilds every process of a run: on an H200, 47 s of imports, TaskRunner and TransferQueue, 27 s of FSDP
workers, 78 s of vLLM, 23 s of agent-loop workers (bench/results/h200_2026-12-02_restart/); each fresh process pays
17-25 s of Python imports alone (h200_2026-12-02_probe/import_times.json). Here the Ray job, the TaskRunner and the
TransferQueue stay; the trainer's FSDP workers are killed and verl's trainer is built from the new segment's config;
what the change leaves alone of the rollout (knob.REBUILD_KEEPS, the knob table's `runner.keeps`) is handed to it as
it is:
- KEEPS_ROLLOUT: the vLLM servers, the agent-loop and reward workers. The new actor workers find the servers by name
  (verl's vLLM ServerAdapter looks them up lazily) and push their weights over the same IPC socket (named by the Ray
  job), as after a checkpoint load;
- KEEPS_SERVERS: the servers and reward workers; the agent loops are rebuilt (their client class follows the
  trainer mode: colocate_async's resumes aborted requests);
- KEEPS_PROCESSES: the rollout is rebuilt too.
Proven on an H200 with plain verl 0.9.1 before the workbench used it (bench/gpu/inplace_probe.py; boundary -> first
resumed step: 0.31 / 0.48 / 0.72 of a cold start). The supervisor sends only changes that leave the run's processes'
environment alone, from a sync run (handles.restart_keeps); anything else is a relaunch, and so is a rebuild that
fails before verl is ready (control.EV_REBUILD_FAILED).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Iterator

import ray
from omegaconf import OmegaConf

from .. import control as c
from ..knob import KEEPS_PROCESSES, KEEPS_ROLLOUT
from .runtime import milestone, runtime_config

# A killed worker's process leaves the GPU when it exits; this long at most is waited for it.
GPU_FREE_TIMEOUT_S = 90.0
# What a relaunch's environment said about resuming (runs.restart_environment) is about one launch: a rebuild sets
# what its own change needs and clears the rest (the critic resumes unless the new change rebuilt it; the actor
# resumes from the checkpoint, not from an exported HF model).
PER_CHANGE_ENV = (c.SKIP_CRITIC_RESUME_ENV, c.ACTOR_HF_ENV)


def config_for(request: dict[str, Any], session_dir: Path):
    """The new segment's verl config as the runner runs it, with the environment its change needs in force."""
    for name in PER_CHANGE_ENV:
        os.environ.pop(name, None)
    os.environ.update(request["env"])
    os.environ[c.SEGMENT_ENV] = str(request["segment"])
    config, _ = runtime_config(OmegaConf.load(request["config_path"]), session_dir)
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    return config


def teardown(trainer, keeps: str, rollout_owner, agent_loop_manager) -> None:
    """Kill the trainer's FSDP workers and what of the rollout `keeps` does not keep (the servers and reward workers
    are `rollout_owner`'s, the trainer that built them), remove the trainer's placement groups, and wait until the
    killed workers have left the GPU."""
    groups = [getattr(trainer, name, None) for name in ("actor_rollout_wg", "critic_wg", "ref_policy_wg")]
    workers = list(dict.fromkeys(w for wg in groups if wg is not None for w in wg.workers))
    pids = _pids(workers)
    doomed = list(workers)
    if keeps != KEEPS_ROLLOUT and agent_loop_manager is not None:
        doomed += list(agent_loop_manager.agent_loop_workers)
    if keeps == KEEPS_PROCESSES:
        servers = rollout_owner.llm_server_manager
        for replica in servers.get_replicas():
            doomed += list(replica.servers)
        if isinstance(servers.global_load_balancer, ray.actor.ActorHandle):
            doomed.append(servers.global_load_balancer)
        doomed += list(rollout_owner.reward_loop_manager.reward_loop_workers or [])
    for handle in doomed:
        ray.kill(handle, no_restart=True)
    for pool in trainer.resource_pool_manager.resource_pool_dict.values():
        for pg in pool.pgs or []:
            ray.util.remove_placement_group(pg)
    _wait_gone(pids, everything=keeps == KEEPS_PROCESSES)


def _pids(workers) -> list[int]:
    return ray.get([w.__ray_call__.remote(lambda _self: os.getpid()) for w in workers])


def _wait_gone(pids: list[int], everything: bool) -> None:
    """Until none of `pids` holds GPU memory (with `everything`, no process at all: a killed vLLM server's engine
    processes are its children, whose pids the TaskRunner doesn't know)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        deadline = time.time() + GPU_FREE_TIMEOUT_S
        while time.time() < deadline:
            held = {p.pid for h in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
            if not (held if everything else held & set(pids)):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the killed workers still hold the GPU after {GPU_FREE_TIMEOUT_S:.0f} s")
    finally:
        pynvml.nvmlShutdown()


@contextlib.contextmanager
def kept_rollout(owner, trainer_base=None) -> Iterator[None]:
    """While verl's trainer sets itself up: its LLMServerManager and RewardLoopManager (as `trainer_base`, verl's
    module where its trainer looks them up, names them) hand it `owner`'s, the servers bound to the new actor
    workers."""
    if trainer_base is None:
        import verl.trainer.ppo.v1.trainer_base as trainer_base

    servers, reward = owner.llm_server_manager, owner.reward_loop_manager

    class KeptServers:
        @staticmethod
        def create(config, worker_group=None, rollout_resource_pool=None, **_):
            for replica in servers.get_replicas():
                first = replica.world_size * replica.replica_rank
                replica.workers = worker_group.workers[first:first + replica.world_size]
            servers.worker_group, servers.rollout_resource_pool = worker_group, rollout_resource_pool
            return servers

    class KeptReward:
        def __new__(cls, *args, **kwargs):
            return reward

    originals = trainer_base.LLMServerManager, trainer_base.RewardLoopManager
    trainer_base.LLMServerManager, trainer_base.RewardLoopManager = KeptServers, KeptReward
    try:
        yield
    finally:
        trainer_base.LLMServerManager, trainer_base.RewardLoopManager = originals


def rebuild(task_runner, trainer, rollout_owner, request: dict[str, Any], trainer_cls) -> tuple[Any, Any]:
    """Rebuild verl in the TaskRunner for the request the trainer's step boundary left (trainer.py `_wb_rebuild`);
    returns (the new trainer, the trainer whose rollout it uses). `trainer_cls(config)`: the class to build."""
    keeps = request["keeps"]
    milestone(f"rebuilding in place for segment {request['segment']} (keeps {keeps})")
    teardown(trainer, keeps, rollout_owner, task_runner.agent_loop_manager)
    config = config_for(request, Path(os.environ[c.SESSION_ENV]))
    task_runner.config = config
    with kept_rollout(rollout_owner) if keeps != KEEPS_PROCESSES else contextlib.nullcontext():
        task_runner.trainer = trainer_cls(config)(config=config)
        task_runner.trainer.init()
    if keeps != KEEPS_ROLLOUT:
        task_runner.init_agent_loop_manager()
    milestone("rebuilt in place")
    return task_runner.trainer, (task_runner.trainer if keeps == KEEPS_PROCESSES else rollout_owner)
