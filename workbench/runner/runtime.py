"""What a plan's verl config needs on this machine and under the workbench (imports no verl: testable on a CPU)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from .. import redact
from ..control import ACTOR_HF_ENV, ACTOR_HF_EXPORT_ENV, CHECKPOINT_DIR
from .worker_hooks import flash_attn_available

SETUP_HOOK = "workbench.runner.worker_hooks.setup"


def runtime_config(config: DictConfig, session_dir: Path) -> tuple[DictConfig, list[str]]:
    """The plan's verl config plus what this machine and the workbench need; returns (config, notes for the user)."""
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    notes = []
    with open_dict(config):
        # Credentials come by environment, never through the store (workbench/redact.py).
        for key, value in redact.secrets_from_env().items():
            OmegaConf.update(config, key, value, force_add=True)
        missing = redact.placeholders(OmegaConf.to_container(config, resolve=False))
        if missing:
            raise ValueError(f"{', '.join(missing)}: a credential the plan keeps out of the store, but this run was "
                             f"not handed it ({redact.SECRETS_ENV}); start the session from the plan that holds it")
        config.trainer.default_local_dir = str(session_dir / CHECKPOINT_DIR)
        config.trainer.resume_mode = "auto"
        # An HF export beside the FSDP shards lets a restart on a different GPU count carry the actor weights over;
        # the supervisor says when no such restart can come (one GPU), and the checkpoint is written faster.
        save_contents = list(config.actor_rollout_ref.actor.checkpoint.save_contents)
        if "hf_model" not in save_contents and os.environ.get(ACTOR_HF_EXPORT_ENV) != "0":
            config.actor_rollout_ref.actor.checkpoint.save_contents = [*save_contents, "hf_model"]
        actor_hf = os.environ.get(ACTOR_HF_ENV)
        if actor_hf:
            config.actor_rollout_ref.model.path = actor_hf
            config.trainer.resume_mode = "disable"
            notes.append(f"restarting from the exported actor weights {actor_hf} (GPU count changed)")
        if not flash_attn_available():
            # verl defaults to flash-attention kernels; without flash-attn, padded sdpa is what works everywhere.
            for model in (config.actor_rollout_ref.model, config.critic.model):
                model.use_remove_padding = False
                if model.get("override_config") is None:
                    model.override_config = {}
                model.override_config.attn_implementation = "sdpa"
            notes.append("flash-attn is not installed: actor/ref/critic use sdpa attention without remove-padding")
        runtime_env = config.ray_kwargs.ray_init.runtime_env
        runtime_env["worker_process_setup_hook"] = SETUP_HOOK
        if runtime_env.get("env_vars") is None:
            runtime_env.env_vars = {}
        env_vars = runtime_env.env_vars
        for name, value in os.environ.items():
            if name.startswith("WORKBENCH_") and name != redact.SECRETS_ENV:
                env_vars[name] = value
        # Ray workers must import the workbench (setup hook, trainer): pass on where it lives.
        package_root = str(Path(__file__).resolve().parents[2])
        pythonpath = os.environ.get("PYTHONPATH", "")
        if package_root not in pythonpath.split(os.pathsep):
            pythonpath = os.pathsep.join(p for p in (package_root, pythonpath) if p)
        env_vars["PYTHONPATH"] = pythonpath
        env_vars.update({k: v for k, v in segment_env(session_dir).items() if k not in env_vars})
    return config, notes


def segment_env(session_dir: Path) -> dict[str, str]:
    """What every segment's Ray workers get so that a restart is cheaper and its start-up can be read:
    compile caches kept in the session directory (vLLM's torch.compile artifacts, Inductor, Triton), so a relaunch
    reuses what the first launch compiled. verl turns vLLM's cache off (`VLLM_DISABLE_COMPILE_CACHE=1`, for caches
    shared by concurrent engines that torch < 2.10 could corrupt); one cache per session is written by one engine at a
    time, and torch >= 2.10 writes it atomically. `WORKBENCH_COMPILE_CACHE=0` keeps verl's setting. vLLM logs at INFO
    so that workbench/startup.py sees each of its start-up phases."""
    env = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}
    if os.environ.get("WORKBENCH_COMPILE_CACHE", "1") != "0":
        cache = session_dir / "cache"
        env.update(VLLM_DISABLE_COMPILE_CACHE="0", VLLM_CACHE_ROOT=str(cache / "vllm"),
                   TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
    return env


def milestone(words: str) -> None:
    """A start-up milestone in the run's log, stamped as verl stamps its lines (workbench/startup.py reads it)."""
    now = datetime.now()
    print(f"[workbench] {now:%Y-%m-%d %H:%M:%S},{now.microsecond // 1000:03d} {words}", flush=True)
