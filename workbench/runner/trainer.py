"""The workbench's verl trainer: verl's own V1 trainer class with hooks at the step boundary.

`workbench_trainer(base)` subclasses whichever trainer verl picked for `trainer.v1.trainer_mode`, so sync,
colocate_async and separate_async all keep verl's behaviour; the subclass only
- writes every step's metrics to the session store (after verl computed them, before the next step),
- executes the supervisor's directives at the step boundary (boundary.py, shared with replay): pause/resume, hot
  apply of token budgets, checkpoint-and-exit (for restart-class changes) and stop,
- passes the live token budgets to each worker call (verl reads them per call from the batch's extra_info),
- places the critic on its own GPUs when the plan asks for it (verl shares `global_pool` between all roles),
- records which process plays which role.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import ray
from omegaconf import open_dict

from verl.single_controller.ray import ResourcePoolManager
from verl.trainer.ppo.utils import Role

from .. import control as c
from ..boundary import HotChange, StepBoundary
from ..knobs import KNOBS, budget_of_call
from ..store import Store
from .replay_buffer import shorten_poll
from .runtime import CRITIC_GPUS_ENV, SEGMENT_ENV, SESSION_ENV, SKIP_CRITIC_RESUME_ENV, STEP_OFFSET_ENV

# The knobs the runner changes between steps, and the verl keys each sets (all of them): the hot knobs of the table.
HOT_KNOB_KEYS = {name: knob.keys for name, knob in KNOBS.items() if knob.apply == "hot"}
# The runner paths (knobs.RunnerPath kinds) this trainer applies between steps; a hot knob on any other path would
# pass the supervisor's check and never reach verl (tests/test_knobs.py holds the table to this).
HOT_PATH_KINDS = ("call_budget",)
# verl trainer call -> the token-budget knob passed to it, from the knob table's call_budget paths.
BUDGET_OF_CALL = budget_of_call()


def _select(config, path: str):
    node = config
    for part in path.split("."):
        node = node.get(part) if node is not None else None
    return node


def _set(config, path: str, value) -> None:
    *parents, leaf = path.split(".")
    node = config
    for part in parents:
        node = node[part]
    with open_dict(node):
        node[leaf] = value


def _scalar(v: Any) -> Any:
    if hasattr(v, "item"):
        try:
            return v.item()
        except (ValueError, RuntimeError):
            return None
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return None


class WorkbenchTrainerMixin:
    """Mixed in front of a verl V1 PPOTrainer class (see `workbench_trainer`)."""

    # ----------------------------------------------------------------- placement
    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        critic_gpus = int(os.environ.get(CRITIC_GPUS_ENV, "0") or 0)
        if critic_gpus <= 0 or Role.Critic not in self.mapping:
            return
        spec = dict(self.resource_pool_manager.resource_pool_spec)
        spec["critic_pool"] = [critic_gpus] * self.config.trainer.nnodes
        self.mapping[Role.Critic] = "critic_pool"
        self.resource_pool_manager = ResourcePoolManager(resource_pool_spec=spec, mapping=self.mapping)

    # ----------------------------------------------------------------- replay buffer: poll every 0.05 s, not 2 s
    def _build_replay_buffer(self):
        return shorten_poll(super()._build_replay_buffer(), self.trainer_mode)

    # ----------------------------------------------------------------- life cycle
    def on_init_end(self):
        super().on_init_end()
        self._wb_store = Store(os.environ[SESSION_ENV])
        self._wb_step_offset = int(os.environ.get(STEP_OFFSET_ENV, "0") or 0)
        self._wb_budgets = {knob: _select(self.config, keys[0]) for knob, keys in HOT_KNOB_KEYS.items()}
        self._wb_boundary = StepBoundary(
            self._wb_store, int(os.environ[SEGMENT_ENV]), hot_apply=self._wb_hot_apply,
            checkpoint=self._wb_checkpoint, end_run=self._wb_end_run,
            token=(Path(os.environ[SESSION_ENV]) / c.TOKEN_FILE).read_text().strip(),
        )
        self._wb_record_workers()
        self._wb_store.add_event(
            c.EV_STARTED,
            f"verl is ready at step {self._wb_step_offset + self.global_steps + 1} ({self.trainer_mode})",
            {"segment": self._wb_boundary.segment_id, "first_step": self._wb_step_offset + self.global_steps + 1,
             "budgets": self._wb_budgets},
        )
        self._wb_store.set_meta(state=c.RUNNING)

    def _load_checkpoint(self):
        # A critic whose architecture changed (LoRA on/off) can't load the old critic's shards: resume the actor,
        # the data position and the step count, and start the critic afresh (the supervisor says so in an event).
        if os.environ.get(SKIP_CRITIC_RESUME_ENV) != "1" or not self.use_critic:
            return super()._load_checkpoint()
        self.use_critic = False
        try:
            return super()._load_checkpoint()
        finally:
            self.use_critic = True

    def _wb_record_workers(self) -> None:
        """Which process plays which role. The rollout servers and reward workers, Ray actors of their own, are
        recognised by the sampler from their process titles (telemetry/roles.py)."""
        node = socket.gethostname()
        groups = {"actor_rollout_ref": self.actor_rollout_wg}
        if self.use_critic:
            groups["critic"] = self.critic_wg
        roles_by_pid: dict[int, set[str]] = {}
        for role, wg in groups.items():
            pids = ray.get([w.__ray_call__.remote(lambda _self: os.getpid()) for w in wg.workers])
            for pid in pids:
                roles_by_pid.setdefault(pid, set()).add(role)
        for pid, roles in roles_by_pid.items():
            self._wb_store.add_worker(pid, "+".join(sorted(roles)), node, self._wb_boundary.segment_id)
        self._wb_store.add_worker(os.getpid(), "driver", node, self._wb_boundary.segment_id)

    # ----------------------------------------------------------------- live token budgets
    # Each verl call in BUDGET_OF_CALL is overridden below the class (_with_live_budget) to call this first.
    def _wb_with_budget(self, batch, knob: str) -> None:
        budget = getattr(self, "_wb_budgets", {}).get(knob)
        if budget is not None and self.config.actor_rollout_ref.actor.use_dynamic_bsz:
            batch.extra_info["use_dynamic_bsz"] = True
            batch.extra_info["max_token_len_per_gpu"] = int(budget)

    # ----------------------------------------------------------------- step boundary
    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        row = {k: _scalar(v) for k, v in metrics.items()}
        row.update({f"{c.BUDGET_METRIC_PREFIX}{k}": v for k, v in self._wb_budgets.items()})
        step = self._wb_step_offset + global_steps
        self._wb_store.add_step(self._wb_boundary.segment_id, step, row)
        self._wb_boundary(step)

    def _wb_hot_apply(self, changes: dict[str, Any], plan_json: str, step: int) -> HotChange:
        unknown = sorted(name for name in changes
                         if name not in HOT_KNOB_KEYS or KNOBS[name].runner.kind not in HOT_PATH_KINDS)
        if unknown:
            raise ValueError(f"not hot-applicable in the runner: {unknown}")
        before = {knob: self._wb_budgets[knob] for knob in changes}
        for knob, value in changes.items():
            for key in HOT_KNOB_KEYS[knob]:
                _set(self.config, key, int(value))
            self._wb_budgets[knob] = int(value)
        return HotChange(before)

    def _wb_checkpoint(self, step: int) -> str:
        t0 = time.time()
        self._save_checkpoint()
        return f" ({time.time() - t0:.1f} s)"

    def _wb_end_run(self) -> None:
        self.total_training_steps = self.global_steps  # verl's loop ends after this step


def _with_live_budget(call: str, knob: str):
    """The override of verl's trainer call `call` that hands it `knob`'s live token budget first."""
    def call_with_budget(self, batch, metrics):
        self._wb_with_budget(batch, knob)
        return getattr(super(WorkbenchTrainerMixin, self), call)(batch, metrics)

    call_with_budget.__name__ = call_with_budget.__qualname__ = call
    return call_with_budget


for _call, _knob in BUDGET_OF_CALL.items():
    setattr(WorkbenchTrainerMixin, _call, _with_live_budget(_call, _knob))

_TRAINERS: dict[type, type] = {}


def workbench_trainer(base: type) -> type:
    """verl's trainer class for the mode, with the workbench's step-boundary hooks in front."""
    if base not in _TRAINERS:
        _TRAINERS[base] = type(f"Workbench{base.__name__}", (WorkbenchTrainerMixin, base), {})
    return _TRAINERS[base]
