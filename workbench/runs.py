"""A segment being executed, as the supervisor sees it: the Run interface (a live verl process here, a replay in
replay.py), the live run's process and its segment config, what a relaunch must do differently to resume, what a
recording must say about the machine it ran on, and reading a run's log after it ended.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from . import checkpoints
from . import control as c
from .lifecycle import gpu_count
from .memory_fit import shape_for
from .plan import Plan
from .procs import kill_tree
from .ray_cluster import SessionRayCluster
from .verl_config import roles_in_use

TAIL_LINES = 60
OOM_SCAN_LINES = 2000


def log_tail(log_path: Path, lines: int) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def traceback_tail(log_path: Path, lines: int = TAIL_LINES) -> str:
    """The end of a run's log from its last traceback on (or the last lines when there is none)."""
    try:
        text = log_path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    starts = [i for i, line in enumerate(text) if "Traceback (most recent call last)" in line]
    tail = text[starts[-1]:] if starts else text
    return "\n".join(tail[-lines:])


def looks_like_oom(text: str) -> bool:
    return any(m in text for m in ("OutOfMemoryError", "CUDA out of memory", "out of memory"))


class Run:
    """A segment being executed: a live verl process or a replay. The supervisor only talks to this interface;
    directives reach the run through the store's command queue (control.RUNNER_DIRECTIVES)."""

    log_path: Path
    # Why changes are no longer taken once this run has ended well (a replay's says to play it again).
    end_words = "the run ended"
    # Whether it rebuilds verl in place for a restart-class change that allows it (runner/rebuild.py), or is
    # relaunched for every one (a replay plays the recorded relaunch).
    rebuilds_in_place = False

    def poll(self) -> int | None:  # exit code once finished
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def cannot_apply(self, plan: "Plan") -> str | None:
        """Why this run can't take that plan (a replay without such a recorded segment), or None."""
        return None


def write_segment_config(session_dir: Path, segment_id: int, plan: Plan) -> dict[str, str]:
    """Write the segment's composed verl config for the runner (which reads no plan); returns the environment the
    run needs besides (the placement verl's config can't hold)."""
    path = c.segment_config_path(session_dir, segment_id)
    path.parent.mkdir(exist_ok=True)
    OmegaConf.save(plan.config, path)
    return {c.CRITIC_GPUS_ENV: str(plan.workbench["critic_gpus"]),
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, plan.workbench["gpus"])),
            c.ACTOR_HF_EXPORT_ENV: "1" if checkpoints.hf_export_needed(gpu_count()) else "0"}


def checkpoint_bytes(plan: Plan) -> int | None:
    """How big the plan's checkpoints will be, from its models' config.json (None where they can't be read)."""
    actor = shape_for({}, str(plan.config.actor_rollout_ref.model.path))
    critic = shape_for({}, str(plan.config.critic.model.path)) if roles_in_use(plan.config).critic else None
    return checkpoints.expected_bytes(actor, critic, hf_export=checkpoints.hf_export_needed(gpu_count()))


class LiveRun(Run):
    """`python -m workbench.runner.launch` in its own process group, with the GPUs of the plan."""

    rebuilds_in_place = True

    def __init__(self, session_dir: Path, segment_id: int, plan: Plan, env: dict[str, str],
                 ray: SessionRayCluster | None = None):
        self.log_path = session_dir / c.LOG_DIR / f"segment-{segment_id}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self.ray = ray  # the session's Ray cluster, if it keeps one (workbench/ray_cluster.py)
        env = {**os.environ, **env, **(ray.env_for(plan) if ray else {}), **write_segment_config(session_dir, segment_id, plan),
               c.SUPERVISOR_PID_ENV: str(os.getpid())}  # the run dies with this supervisor (procs.die_with_supervisor)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "workbench.runner.launch", "--session", str(session_dir), "--segment", str(segment_id)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        kill_tree(self.proc.pid)
        self.proc.wait()
        if self.ray is not None:
            self.ray.end_run_processes()  # its Ray workers are the cluster's children, not this run's


def restart_environment(previous: Plan, new: Plan, session_dir: Path, checkpoint_step: int | None) -> tuple[dict[str, str], list[str]]:
    """What a relaunch must do differently to resume, and what it can't carry over (said to the user)."""
    env: dict[str, str] = {}
    losses: list[str] = []
    old_rank = previous.knob_values()["critic_lora_rank"]
    new_rank = new.knob_values()["critic_lora_rank"]
    if old_rank != new_rank:
        env[c.SKIP_CRITIC_RESUME_ENV] = "1"
        losses.append(
            f"critic weights and optimizer state start afresh: the critic's architecture changed "
            f"(LoRA rank {old_rank} → {new_rank}); actor, data position and step count are resumed"
        )
    if actor_world_size(previous) != actor_world_size(new) and checkpoint_step is not None:
        # FSDP shards are saved per rank: a different world size can only start from the exported HF weights.
        hf = session_dir / c.CHECKPOINT_DIR / f"global_step_{checkpoint_step}" / "actor" / "huggingface"
        env.update({c.ACTOR_HF_ENV: str(hf), c.STEP_OFFSET_ENV: str(checkpoint_step), c.SKIP_CRITIC_RESUME_ENV: "1"})
        losses.append(
            f"the actor's GPU count changed ({actor_world_size(previous)} → {actor_world_size(new)}): FSDP shards can't "
            f"be resharded, so the run restarts from the step-{checkpoint_step} actor weights (HF export); lost: "
            "optimizer state, critic state, data position; the reference policy becomes that actor"
        )
    return env, losses


def machine_meta(plan: Plan) -> dict[str, Any]:
    """What a recording must say about where it was measured: machine, GPUs, driver, versions, model shape."""
    import platform
    from importlib import metadata

    meta: dict[str, Any] = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d"), "python": platform.python_version()}
    for package in ("torch", "verl", "vllm", "ray", "transformers"):
        try:
            meta[f"{package}_version"] = metadata.version(package)
        except metadata.PackageNotFoundError:
            meta[f"{package}_version"] = None
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in plan.workbench["gpus"]]
        meta.update(
            gpu_name=pynvml.nvmlDeviceGetName(handles[0]), gpu_count=pynvml.nvmlDeviceGetCount(),
            gpus_used=len(handles), driver=pynvml.nvmlSystemGetDriverVersion(),
        )
    except Exception as e:
        meta["gpu_error"] = repr(e)
    # The memory model reads these (workbench.memory): recorded here, a replay knows them without the model files.
    for key, path in (("model_shape", plan.config.actor_rollout_ref.model.path),
                      ("critic_model_shape", plan.config.critic.model.path)):
        model_config = Path(str(path)) / "config.json"
        if model_config.exists():
            shape = json.loads(model_config.read_text())
            meta[key] = {k: shape.get(k) for k in (
                "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "torch_dtype", "tie_word_embeddings")}
    return meta


def actor_world_size(plan: Plan) -> int:
    wb = plan.workbench
    return len(wb["gpus"]) - wb["critic_gpus"] - wb["reward_gpus"] - wb["rollout_gpus"]
