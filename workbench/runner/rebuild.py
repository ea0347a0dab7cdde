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
- KEEPS_TRAINER (rebuild_rollout): the trainer stays as it is, FSDP workers, models, optimizer states, step count
  and data position, so nothing is checkpointed; the vLLM servers, their router and the agent loops are rebuilt under
  the new rollout settings and the trainer pushes its weights to the new servers (Apply -> first resumed step 0.44
  of a cold start on an H200, bench/results/h200_2026-12-02_overhead/);
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
from typing import Any, Callable, Iterator

import ray
from omegaconf import OmegaConf

from .. import control as c
from ..knob import KEEPS_PROCESSES, KEEPS_ROLLOUT, KEEPS_TRAINER
from .runtime import milestone, runtime_config

# A killed actor's processes leave the GPU when they exit, and Ray lets go of its name; this long at most is waited
# for either.
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
        doomed += _rollout_actors(rollout_owner.llm_server_manager)
        doomed += list(rollout_owner.reward_loop_manager.reward_loop_workers or [])
    for handle in doomed:
        ray.kill(handle, no_restart=True)
    for pool in trainer.resource_pool_manager.resource_pool_dict.values():
        for pg in pool.pgs or []:
            ray.util.remove_placement_group(pg)
    _wait_gpu_free(lambda held: not held if keeps == KEEPS_PROCESSES else not held & set(pids))


def _rollout_actors(servers) -> list:
    """The vLLM server actors of an LLMServerManager, and its router where that is an actor."""
    actors = [server for replica in servers.get_replicas() for server in replica.servers]
    if isinstance(servers.global_load_balancer, ray.actor.ActorHandle):
        actors.append(servers.global_load_balancer)
    return actors


def _pids(workers) -> list[int]:
    return ray.get([w.__ray_call__.remote(lambda _self: os.getpid()) for w in workers])


def _process_trees(actors) -> tuple[list[str | None], set[int]]:
    """Each actor's name, and the pids of the actors' processes and of every process they started (a vLLM server's
    engine core and GPU workers)."""
    def tree(_self):
        import psutil

        return (ray.get_runtime_context().get_actor_name(),
                [os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))])

    found = ray.get([a.__ray_call__.remote(tree) for a in actors])
    return [name for name, _ in found], {pid for _, pids in found for pid in pids}


def _wait_gpu_free(done: Callable[[set[int]], bool]) -> None:
    """Until `done(the pids of the processes holding GPU memory)`."""
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        deadline = time.time() + GPU_FREE_TIMEOUT_S
        while time.time() < deadline:
            if done({p.pid for h in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the killed workers still hold the GPU after {GPU_FREE_TIMEOUT_S:.0f} s")
    finally:
        pynvml.nvmlShutdown()


def _wait_names_free(names: list[str | None]) -> None:
    """Until Ray has let go of the killed actors' names: the new servers take the same ones."""
    deadline = time.time() + GPU_FREE_TIMEOUT_S
    for name in filter(None, names):
        while True:
            try:
                ray.get_actor(name)
            except ValueError:
                break
            if time.time() > deadline:
                raise RuntimeError(f"Ray still knows the killed actor {name!r} after {GPU_FREE_TIMEOUT_S:.0f} s")
            time.sleep(0.1)


def forget_rollout_server(worker: Any) -> None:
    """Ray `__ray_call__` target in each FSDP worker: its vLLM ServerAdapter looks its (rebuilt) server up again by
    name before the next weight push, and sets the delta-transfer engine up anew."""
    for part in (getattr(worker, "worker_dict", None) or {"": worker}).values():
        adapter = getattr(part, "rollout", None)
        if adapter is not None and hasattr(adapter, "server_handle"):
            adapter.server_handle = None
            adapter._delta_weight_transfer_engine_initialized = False


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


def rebuild(task_runner, trainer, rollout_owner, request: dict[str, Any], trainer_cls) -> Any:
    """Rebuild verl in the TaskRunner (its `trainer` is then the one to fit) for the request the trainer's step
    boundary left (trainer.py `_wb_rebuild`); returns the trainer whose rollout it uses. `trainer_cls(config)`: the
    class to build."""
    keeps = request["keeps"]
    milestone(f"rebuilding in place for segment {request['segment']} (keeps {keeps})")
    if keeps == KEEPS_TRAINER:
        return rebuild_rollout(task_runner, trainer, rollout_owner, request)
    teardown(trainer, keeps, rollout_owner, task_runner.agent_loop_manager)
    config = config_for(request, Path(os.environ[c.SESSION_ENV]))
    task_runner.config = config
    with kept_rollout(rollout_owner) if keeps != KEEPS_PROCESSES else contextlib.nullcontext():
        task_runner.trainer = trainer_cls(config)(config=config)
        task_runner.trainer.init()
    if keeps != KEEPS_ROLLOUT:
        task_runner.init_agent_loop_manager()
    milestone("rebuilt in place")
    return task_runner.trainer if keeps == KEEPS_PROCESSES else rollout_owner


def rebuild_rollout(task_runner, trainer, rollout_owner, request: dict[str, Any], server_manager=None) -> Any:
    """KEEPS_TRAINER: the rollout rebuilt under the new config beside the kept trainer, which then goes on from the
    step its fit ended on; returns the trainer, now the owner of the rollout. The servers, their router and the
    agent-loop workers are killed (the reward workers don't talk to the servers: kept); verl's LLMServerManager
    (`server_manager`) launches servers bound to the same FSDP workers, whose adapters look them up again; the
    trainer's on_init_end pushes its weights to them, as after a start. Should anything fail, the trainer, still
    whole, checkpoints at its step first: the supervisor's relaunch resumes from there."""
    if server_manager is None:
        from verl.workers.rollout.llm_server import LLMServerManager as server_manager

    trainer._wb_resume_fit()
    try:
        old = rollout_owner.llm_server_manager
        servers = _rollout_actors(old)
        names, pids = _process_trees(servers)
        doomed = servers + list(task_runner.agent_loop_manager.agent_loop_workers)
        for handle in doomed:
            ray.kill(handle, no_restart=True)
        _wait_names_free(names)
        _wait_gpu_free(lambda held: not held & pids)
        milestone("rollout torn down")
        config = config_for(request, Path(os.environ[c.SESSION_ENV]))
        task_runner.config = trainer.config = config
        new = server_manager.create(config=config, worker_group=trainer.actor_rollout_wg,
                                    rollout_resource_pool=old.rollout_resource_pool)
        ray.get([w.__ray_call__.remote(forget_rollout_server) for w in trainer.actor_rollout_wg.workers])
        trainer.llm_server_manager, trainer.reward_loop_manager = new, rollout_owner.reward_loop_manager
        trainer.checkpoint_manager.replicas = new.get_replicas()
        trainer.checkpoint_manager.sleep_replicas()
        task_runner.init_agent_loop_manager()
        trainer.on_init_end()  # the weights to the new servers; the workbench's boundary, "verl is ready"
    except Exception:
        trainer._wb_checkpoint_after_failure()
        raise
    milestone("rollout rebuilt in place")
    return trainer
