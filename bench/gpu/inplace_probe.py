"""Probe for issue 17 (GPU): can a restart-class change rebuild verl's trainer inside the running TaskRunner, and
what does each phase cost against a cold start?

A relaunch rebuilds every process (bench/results/h200_2026-12-02_restart/: 47 s of imports, TaskRunner and
TransferQueue, 27 s of FSDP workers, 78 s of vLLM, 23 s of agent-loop workers). This probe runs plain verl 0.9.1 (no
workbench session) with a TaskRunner that runs `--steps` steps, then rebuilds the trainer in place, in the same Ray
job, TaskRunner and TransferQueue, once per `--rebuild` (DEFAULT_REBUILDS below): checkpoint at the boundary, kill the
trainer's FSDP workers (and what of the rollout the rebuild does not keep), build verl's trainer from the config with
the change applied, resume from the checkpoint, run `--steps-after` steps. A kept rollout is handed to the new
trainer as it is: its actor workers find the vLLM servers by name (verl's ServerAdapter looks them up lazily) and
push their weights over the same IPC socket (named by the Ray job). Every phase is stamped (wall clock).

    python3 bench/gpu/inplace_probe.py OUT_DIR [--steps 2] [--steps-after 1] [--rebuild KEEP:k=v,...] -- OVERRIDE ...

OVERRIDE: the plan's Hydra overrides (a session's export, with bench/gpu/campaign.py's plain_overrides). Writes
OUT_DIR/inplace_probe.json: the stamps, each step's timing_s/* (the first `--steps` are plain verl's steps of that
plan), which rebuilds worked, and the error and traceback of the one that did not.
"""

from __future__ import annotations

import time

PROCESS_START = time.time()  # before the heavy imports: the cold start counts them

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import ray  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf, open_dict  # noqa: E402

from verl.trainer.main_ppo import TaskRunnerV1  # noqa: E402
from verl.utils.logging_utils import configure_verl_logging  # noqa: E402

GPU_FREE_TIMEOUT_S = 90.0


class _Clock:
    """Stamps (what, unix time) kept in the TaskRunner and printed as they come."""

    def __init__(self):
        self.stamps: list[tuple[str, float]] = []

    def __call__(self, what: str) -> None:
        now = time.time()
        self.stamps.append((what, now))
        print(f"[probe] {time.strftime('%H:%M:%S', time.gmtime(now))} {what}", flush=True)


def _step_clock(base: type, clock: _Clock, steps: list[dict]) -> type:
    """verl's trainer class, recording each step's timings at its boundary."""

    class Probe(base):
        def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
            super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
            steps.append({"step": int(global_steps), "t": time.time(),
                          **{k: float(v) for k, v in metrics.items() if k.startswith(("timing_s/", "perf/"))
                             and isinstance(v, (int, float))}})
            clock(f"step {global_steps} done ({metrics.get('timing_s/step', float('nan')):.1f} s)")

    Probe.__name__ = f"Probe{base.__name__}"
    return Probe


def _pids(handles) -> list[int]:
    """The live ones' process ids (a worker an earlier teardown killed has none)."""
    pids = []
    for ref in [h.__ray_call__.remote(lambda _self: os.getpid()) for h in handles]:
        try:
            pids.append(ray.get(ref, timeout=30))
        except Exception:  # a dead actor: nothing of it to wait for
            pass
    return pids


def _wait_gpu_free(killed_pids: list[int], everything: bool) -> list[int]:
    """Wait until the killed workers hold no GPU memory (and, with `everything`, no process does: a killed vLLM
    server's engine processes are its children, whose pids this process doesn't know); returns the pids left."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    deadline = time.time() + GPU_FREE_TIMEOUT_S
    while True:
        held = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        left = held if everything else [pid for pid in held if pid in killed_pids]
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


# The rebuilds the probe runs by default, in this order (each on top of the previous one's config):
#   all:     a change the rollout doesn't read; servers, agent loops and reward workers kept
#   none:    a rollout change; everything rebuilt, still in the same job / TaskRunner / TransferQueue
#   servers: sync -> colocate_async; the servers and reward workers kept, the agent loops rebuilt (their client class
#            follows the trainer mode); last, as colocate_async leaves partial rollouts in flight at its end
DEFAULT_REBUILDS = (
    ("all", {"actor_rollout_ref.actor.ppo_mini_batch_size": 64, "critic.ppo_mini_batch_size": 64}),
    ("none", {"actor_rollout_ref.rollout.gpu_memory_utilization": 0.45}),
    ("servers", {"trainer.v1.trainer_mode": "colocate_async"}),
)
KEEPS = ("all", "servers", "none")


class _ProbeTaskRunner(TaskRunnerV1.__ray_actor_class__):
    def probe(self, config, rebuilds, steps: int, steps_after: int) -> dict:
        import transfer_queue as tq
        from verl.trainer.ppo.v1 import get_trainer_cls

        clock, step_rows = _Clock(), []
        out = {"stamps": clock.stamps, "steps": step_rows, "rebuilds": []}
        clock("TaskRunner up")
        configure_verl_logging()
        config.transfer_queue.enable = True
        with open_dict(config):
            config.trainer.total_training_steps = steps
        OmegaConf.resolve(config)
        self.config = config
        tq.init(config.transfer_queue)
        clock("TransferQueue ready")

        def trainer_cls(cfg):
            return _step_clock(get_trainer_cls(cfg.trainer.v1.trainer_mode), clock, step_rows)

        trainer = trainer_cls(config)(config=config)
        trainer.init()
        self.trainer = trainer
        clock("trainer 1 ready")
        self.init_agent_loop_manager()
        clock("agent loops ready")
        trainer.fit(self.agent_loop_manager)
        clock("trainer 1 done")
        rollout_owner, total = trainer, steps
        for number, (keep, change) in enumerate(rebuilds, start=2):
            label = f"rebuild {number} (keep {keep}: {change})"
            record = {"keep": keep, "change": change, "ok": False}
            out["rebuilds"].append(record)
            trainer.global_steps = total  # fit leaves it one past the last step
            clock(f"{label}: checkpoint")
            trainer._save_checkpoint()
            total += steps_after
            config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
            with open_dict(config):
                for key, value in change.items():
                    OmegaConf.update(config, key, value, force_add=True)
                config.trainer.total_training_steps = total
                config.trainer.resume_mode = "auto"
            try:
                trainer, rollout_owner = self._rebuild(trainer, rollout_owner, keep, config, label, trainer_cls, clock)
                record["ok"] = True
            except Exception as error:  # the finding of the probe: what broke, and where; then rebuild it all
                clock(f"{label}: failed: {error!r}")
                record.update(error=repr(error), traceback=traceback.format_exc()[-6000:])
                try:
                    trainer, rollout_owner = self._rebuild(self.trainer, rollout_owner, "none", config,
                                                           f"{label} again, keep none", trainer_cls, clock)
                    record["recovered_by_rebuilding_all"] = True
                except Exception as again:
                    clock(f"{label}: rebuilding it all failed too: {again!r}")
                    record.update(error_again=repr(again), traceback_again=traceback.format_exc()[-6000:])
                    break
        tq.close()
        return out

    def _rebuild(self, trainer, rollout_owner, keep: str, config, label: str, trainer_cls, clock: _Clock):
        """Tear `trainer` down (keeping what `keep` says of `rollout_owner`'s rollout), build verl's trainer for
        `config` in its place, resume and fit; returns (the new trainer, the owner of the rollout it uses)."""
        from workbench.runner.rebuild import kept_rollout  # what the workbench took from this probe

        self._teardown(trainer, keep, rollout_owner, clock)
        clock(f"{label}: trainer init")
        with kept_rollout(rollout_owner) if keep != "none" else contextlib.nullcontext():
            self.trainer = trainer_cls(config)(config=config)  # the partial one, should init fail
            self.trainer.init()
        self.config = config
        clock(f"{label}: trainer ready")
        if keep != "all":
            self.init_agent_loop_manager()
            clock(f"{label}: agent loops ready")
        self.trainer.fit(self.agent_loop_manager)
        clock(f"{label}: done")
        return self.trainer, (self.trainer if keep == "none" else rollout_owner)

    def _teardown(self, trainer, keep: str, rollout_owner, clock: _Clock) -> None:
        """Kill the trainer's worker processes and what of the rollout is not kept (the servers and reward workers
        are `rollout_owner`'s, the trainer that built them), remove the trainer's placement groups, and wait until
        the GPU is left to what is kept."""
        clock(f"teardown (keep {keep})")
        groups = [getattr(trainer, name, None) for name in ("actor_rollout_wg", "critic_wg", "ref_policy_wg")]
        doomed = list(dict.fromkeys(w for wg in groups if wg is not None for w in wg.workers))
        worker_pids = _pids(doomed)
        if keep != "all" and self.agent_loop_manager is not None:
            doomed += list(self.agent_loop_manager.agent_loop_workers)
        if keep == "none":  # the rollout in use (a partial trainer's own, if it got that far, too)
            for owner in dict.fromkeys((rollout_owner, trainer)):
                manager = getattr(owner, "llm_server_manager", None)
                for replica in (manager.get_replicas() if manager is not None else []):
                    doomed += list(replica.servers)
                if isinstance(getattr(manager, "global_load_balancer", None), ray.actor.ActorHandle):
                    doomed.append(manager.global_load_balancer)
                doomed += list(getattr(getattr(owner, "reward_loop_manager", None), "reward_loop_workers", []) or [])
        for handle in doomed:
            try:
                ray.kill(handle, no_restart=True)
            except Exception as error:  # an actor that is already gone
                print(f"[probe] kill: {error!r}", flush=True)
        for pool in getattr(getattr(trainer, "resource_pool_manager", None), "resource_pool_dict", {}).values():
            for pg in pool.pgs or []:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception as error:  # removed by an earlier teardown
                    print(f"[probe] remove placement group: {error!r}", flush=True)
        left = _wait_gpu_free(worker_pids, everything=keep == "none")
        clock(f"teardown done ({len(doomed)} actors killed; GPU processes still there: {left})")


ProbeTaskRunner = ray.remote(_ProbeTaskRunner)


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu/inplace_probe.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--steps-after", type=int, default=1)
    parser.add_argument("--rebuild", action="append", default=[], metavar="KEEP:KEY=VALUE[,KEY=VALUE]",
                        help=f"a rebuild (KEEP: {', '.join(KEEPS)}); default: " + "; ".join(
                            f"{keep}:{','.join(f'{k}={v}' for k, v in change.items())}"
                            for keep, change in DEFAULT_REBUILDS))
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    rebuilds = [_rebuild(text) for text in args.rebuild] or list(DEFAULT_REBUILDS)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict = {"process_start": PROCESS_START, "argv": sys.argv[1:]}
    try:
        config = _config(args.overrides, args.out)
        result.update(_run(config, rebuilds, args.steps, args.steps_after))
    except Exception as error:
        result["error"] = repr(error)
        result["traceback"] = traceback.format_exc()[-6000:]
    shutil.rmtree(checkpoint_dir(args.out), ignore_errors=True)
    (args.out / "inplace_probe.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"[probe] wrote {args.out / 'inplace_probe.json'}", flush=True)
    return 0 if "error" not in result else 1


def _rebuild(text: str) -> tuple[str, dict]:
    keep, _, changes = text.partition(":")
    if keep not in KEEPS or "=" not in changes:
        raise SystemExit(f"--rebuild {text!r}: expected KEEP:KEY=VALUE[,KEY=VALUE] with KEEP one of {KEEPS}")
    return keep, {k: _value(v) for k, v in (kv.split("=", 1) for kv in changes.split(","))}


def checkpoint_dir(out: Path) -> Path:
    shm = Path("/dev/shm")
    return shm / f"inplace-probe-{os.getpid()}" if shm.is_dir() else out / "checkpoints"


def _config(overrides: list[str], out: Path):
    import verl.trainer.main_ppo as main_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    with initialize_config_dir(config_dir=str(Path(main_ppo.__file__).parent / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    with open_dict(config):
        # In host memory when there is a /dev/shm, as the workbench keeps a session's; the newest only.
        config.trainer.default_local_dir = str(checkpoint_dir(out))
        config.trainer.max_actor_ckpt_to_keep = config.trainer.max_critic_ckpt_to_keep = 1
        config.trainer.save_freq = -1
        config.trainer.resume_mode = "disable"
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return config


def _run(config, rebuilds, steps: int, steps_after: int) -> dict:
    """Ray as verl's run_ppo starts it, then the probe in its TaskRunner."""
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env

    runtime_env = get_ppo_ray_runtime_env(config)
    runtime_env.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
    ray_init = config.ray_kwargs.get("ray_init", {})
    runtime_env = OmegaConf.merge(runtime_env, ray_init.get("runtime_env", {}))
    ray.init(**OmegaConf.to_container(OmegaConf.create({**ray_init, "runtime_env": runtime_env})))
    runner = ProbeTaskRunner.remote()
    return ray.get(runner.probe.remote(config, rebuilds, steps, steps_after))


if __name__ == "__main__":
    sys.exit(main())
