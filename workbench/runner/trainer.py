"""The workbench's verl trainer: verl's own V1 trainer class with hooks at the step boundary.

`workbench_trainer(base)` subclasses whichever trainer verl picked for `trainer.v1.trainer_mode`, so sync,
colocate_async and separate_async all keep verl's behaviour; the subclass only
- writes every step's metrics to the session store (after verl computed them, before the next step),
- executes the supervisor's directives at the step boundary (boundary.py, shared with replay): pause/resume, hot
  apply, checkpoint-and-exit (for restart-class changes) and stop,
- passes the live batching settings to each worker call (dynamic batching, token budgets, micro-batch sizes: verl
  reads them per call from the batch's extra_info),
- switches fused kernels and gradient checkpointing in the live workers at the step boundary (levers.py), and checks
  a switch that changes log-probs on this step's batch before the next step runs,
- places the critic on its own GPUs when the plan asks for it (verl shares `global_pool` between all roles),
- records which process plays which role.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

import ray
from omegaconf import open_dict

from verl.single_controller.ray import ResourcePoolManager
from verl.trainer.ppo.utils import Role

from .. import checkpoints
from .. import control as c
from ..boundary import HotChange, StepBoundary
from ..knob import DYNAMIC_BSZ_INFO
from ..knobs import KNOBS, TOKEN_BUDGET_KNOBS, budget_of_call, settings_of_call
from ..store import Store
from . import levers
from .replay_buffer import shorten_poll
from .runtime import milestone

# The knobs the runner changes between steps, and the verl keys each sets (all of them): the hot knobs of the table.
HOT_KNOB_KEYS = {name: knob.keys for name, knob in KNOBS.items() if knob.apply == "hot"}
# The runner paths (knob.RunnerPath kinds) this trainer applies between steps; a hot knob on any other path would
# pass the supervisor's check and never reach verl (tests/test_knobs.py holds the table to this).
HOT_PATH_KINDS = ("call", "worker")
# verl trainer call -> {extra_info key: knob} the runner passes to it, from the knob table's call paths.
SETTINGS_OF_CALL = settings_of_call()
BUDGET_OF_CALL = budget_of_call()
# Sequences per data-parallel rank whose log-probs are recomputed before and after a hot switch that changes them.
PROBE_SEQUENCES_PER_RANK = 4
# The probe's rows in the TransferQueue: a partition of their own (verl samples training batches from "train"), fresh
# keys per log-prob call; and what verl's log-prob pass writes (workers/engine_workers.py infer_batch), left out of
# the inputs the probe copies.
PROBE_PARTITION = "workbench_logprob_probe"
LOG_PROB_OUTPUTS = ("log_probs", "entropy")
_PROBE_CALLS = itertools.count(1)


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
        critic_gpus = int(os.environ.get(c.CRITIC_GPUS_ENV, "0") or 0)
        if critic_gpus <= 0 or Role.Critic not in self.mapping:
            return
        spec = dict(self.resource_pool_manager.resource_pool_spec)
        spec["critic_pool"] = [critic_gpus] * self.config.trainer.nnodes
        self.mapping[Role.Critic] = "critic_pool"
        self.resource_pool_manager = ResourcePoolManager(resource_pool_spec=spec, mapping=self.mapping)

    def _init_dataloader(self):
        super()._init_dataloader()
        milestone("dataloader built")

    # ----------------------------------------------------------------- replay buffer: poll every 0.05 s, not 2 s
    def _build_replay_buffer(self):
        return shorten_poll(super()._build_replay_buffer(), self.trainer_mode)

    # ----------------------------------------------------------------- life cycle
    def on_init_end(self):
        super().on_init_end()
        if getattr(self, "_wb_store", None) is not None:
            self._wb_store.close()  # a trainer kept through an in-place rebuild ends its init again
        self._wb_store = Store(os.environ[c.SESSION_ENV])
        self._wb_step_offset = int(os.environ.get(c.STEP_OFFSET_ENV, "0") or 0)
        self._wb_boundary = StepBoundary(
            self._wb_store, int(os.environ[c.SEGMENT_ENV]), hot_apply=self._wb_hot_apply,
            checkpoint=self._wb_checkpoint, end_run=self._wb_end_run, rebuild=self._wb_rebuild,
            token=(Path(os.environ[c.SESSION_ENV]) / c.TOKEN_FILE).read_text().strip(),
        )
        self._wb_record_workers()
        self._wb_store.add_event(
            c.EV_STARTED,
            f"verl is ready at step {self._wb_step_offset + self.global_steps + 1} ({self.trainer_mode})",
            {"segment": self._wb_boundary.segment_id, "first_step": self._wb_step_offset + self.global_steps + 1,
             "budgets": self._wb_budgets()},
        )
        self._wb_store.set_meta(state=c.RUNNING)

    def _load_checkpoint(self):
        # A critic whose architecture changed (LoRA on/off) can't load the old critic's shards: resume the actor,
        # the data position and the step count, and start the critic afresh (the supervisor says so in an event).
        if os.environ.get(c.SKIP_CRITIC_RESUME_ENV) != "1" or not self.use_critic:
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

    # ----------------------------------------------------------------- live settings
    def _wb_live(self, knob: str) -> Any:
        """The knob's value in force (the trainer's config holds what the hot applies set), with verl's dataclass
        default where the config has no such key (critic.ppo_infer_max_token_len_per_gpu: only CriticConfig declares
        it, and verl's trainer reads it through that dataclass)."""
        return KNOBS[knob].read(self.config)

    def _wb_budgets(self) -> dict[str, Any]:
        return {knob: self._wb_live(knob) for knob in TOKEN_BUDGET_KNOBS}

    # Each verl call in SETTINGS_OF_CALL is overridden below the class (_with_live_settings) to call this first.
    def _wb_call_settings(self, batch, call: str) -> None:
        """Every batching setting verl reads for this call, from the settings in force: a fresh start's engine defaults
        with the hot changes on top. All of them each time, because a batch's extra_info carries what an earlier call of
        the step set. A call whose engine has no dynamic-batching flag of the plan's (verl 0.9.1's V1 critic keeps
        EngineConfig's default, True) is told True, so an actor call's False can't reach it."""
        info = {key: self._wb_live(knob) for key, knob in SETTINGS_OF_CALL[call].items()}
        info.setdefault(DYNAMIC_BSZ_INFO, True)
        batch.extra_info.update({key: value for key, value in info.items() if value is not None})

    # ----------------------------------------------------------------- step boundary
    def _compute_metrics(self, batch, metrics, timing_raw, global_steps, epoch):
        super()._compute_metrics(batch, metrics, timing_raw, global_steps=global_steps, epoch=epoch)
        row = {k: _scalar(v) for k, v in metrics.items()}
        row.update({f"{c.BUDGET_METRIC_PREFIX}{k}": v for k, v in self._wb_budgets().items()})
        step = self._wb_step_offset + global_steps
        self._wb_store.add_step(self._wb_boundary.segment_id, step, row)
        self._wb_step_batch = batch  # a hot switch's log-prob check recomputes part of it (verl clears it after this)
        try:
            self._wb_boundary(step)
        finally:
            self._wb_step_batch = None

    def _wb_hot_apply(self, changes: dict[str, Any], plan_json: str, step: int) -> HotChange:
        """Put hot changes in force for the next step: the batching settings by the trainer's config (read per call),
        fused kernels and gradient checkpointing in every worker process too. Checked in every worker first (a refusal
        changes nothing); a change that moves log-probs is checked on this step's batch, and switched back if the
        log-prob pass fails under it."""
        unknown = sorted(name for name in changes
                         if name not in HOT_KNOB_KEYS or KNOBS[name].runner.kind not in HOT_PATH_KINDS)
        if unknown:
            raise ValueError(f"not hot-applicable in the runner: {unknown}")
        before = {knob: self._wb_live(knob) for knob in changes}
        methods = tuple(dict.fromkeys(KNOBS[k].runner.method for k in changes if KNOBS[k].runner.kind == "worker"))
        wanted = self._wb_wanted(methods, lambda knob: changes.get(knob, self._wb_live(knob)))
        undo = self._wb_wanted(methods, self._wb_live)
        if wanted:
            self._wb_put_in_force(wanted, check_only=True)
        probe, check = self._wb_logprob_probe(changes)
        old = _attempt(probe) if probe else None
        if isinstance(old, Exception):
            probe, check = None, {"skipped": f"log-probs could not be computed before the switch: {old!r}"}
        try:
            self._wb_set_config(changes)
            reports = self._wb_put_in_force(wanted) if wanted else []
            if probe:
                new = _attempt(probe)
                if isinstance(new, Exception):
                    raise ValueError(f"the log-prob pass failed under the new setting, switched back: {new!r}")
                check = logprob_difference(old, new)
        except Exception:
            self._wb_set_config(before)
            if undo:
                self._wb_put_in_force(undo)
            raise
        note = (f" (log-probs of {check['tokens']} tokens before/after: max |Δ| {check['max_abs_diff']:.3g})"
                if "tokens" in check else "")
        return HotChange(before, note=note, data={"workers": reports, "logprob_check": check})

    def _wb_set_config(self, values: dict[str, Any]) -> None:
        for knob, value in values.items():
            for key in HOT_KNOB_KEYS[knob]:
                _set(self.config, key, value)

    # ----------------------------------------------------------------- levers in the workers (runner path "worker")
    def _wb_wanted(self, methods: tuple[str, ...], value_of) -> dict[str, dict[str, Any]]:
        """What the worker methods of the knob table want in force, given each knob's value (`value_of(knob)`)."""
        wanted: dict[str, dict[str, Any]] = {}
        for method in methods:
            wanted.update(getattr(self, method)(value_of))
        return wanted

    def _wb_fused_kernels(self, value_of) -> dict[str, dict[str, Any]]:
        backend = value_of("fused_kernel_backend") if value_of("fused_kernels") else None
        return {"fused_kernels": {"roles": list(KNOBS["fused_kernels"].roles), "backend": backend}}

    def _wb_gradient_checkpointing(self, value_of) -> dict[str, dict[str, Any]]:
        return {"gradient_checkpointing": {"roles": list(KNOBS["gradient_checkpointing"].roles),
                                           "on": bool(value_of("gradient_checkpointing"))}}

    def _wb_put_in_force(self, wanted: dict[str, dict[str, Any]], check_only: bool = False) -> list[dict[str, Any]]:
        """levers.put_in_force in every worker process of the run (one call per process: colocated roles share one);
        raises with every worker's problems, after checking all of them, if any has one."""
        groups = [self.actor_rollout_wg, getattr(self, "critic_wg", None), getattr(self, "ref_policy_wg", None)]
        handles = list(dict.fromkeys(h for wg in groups if wg is not None for h in wg.workers))
        reports = ray.get([h.__ray_call__.remote(levers.put_in_force, wanted, check_only) for h in handles])
        problems = sorted({p for report in reports for p in report["problems"]})
        if problems:
            raise ValueError("; ".join(problems))
        return reports

    # ----------------------------------------------------------------- log-prob check of a hot switch
    def _wb_logprob_probe(self, changes: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(the probe, {}) for a change that moves log-probs (it touches the old_log_prob phase); (None, why not) when
        it can't be checked here, ({}) when there's nothing to check."""
        if not any("old_log_prob" in KNOBS[k].phases for k in changes):
            return None, {}
        if self.trainer_mode != "sync":  # the rollout engine generates during the boundary and holds its memory
            return None, {"skipped": f"generation runs during the step boundary in {self.trainer_mode}"}
        if getattr(self, "_wb_step_batch", None) is None:
            return None, {"skipped": "no batch of this step at hand"}
        # Without dynamic batching verl splits a rank's share into micro batches of exactly that many sequences:
        # the probe's share must be a multiple of the micro-batch size before and after the change.
        sizes = [PROBE_SEQUENCES_PER_RANK]
        for value_of in (self._wb_live, lambda knob: changes.get(knob, self._wb_live(knob))):
            if not value_of("use_dynamic_bsz"):
                sizes.append(int(value_of("logprob_micro_batch")))
        return functools.partial(self._wb_probe_log_probs, math.lcm(*sizes)), {}

    def _wb_probe_log_probs(self, per_rank: int):
        """Response-token log-probs of the first `per_rank` sequences of each data-parallel rank's share of this
        step's batch, on the actor's current weights, with the old_log_prob call's settings in force. In sync mode
        the rollout engine holds its KV cache at the boundary (verl wakes it in on_step_end): the probe stays small.

        verl's compute_log_prob reads the fields of the keys it is handed and writes its log_probs under them, where
        the step's own log_probs lie: read back from there, a call that wrote nothing would hand back the step's
        values, the same before and after a switch. So each call gets copies of those sequences' inputs under keys
        of its own, in a partition verl's sampler never reads, and only what it wrote there is read back."""
        import transfer_queue as tq
        from transfer_queue import KVBatchMeta
        from verl.workers.utils.padding import response_from_nested

        batch, wg = self._wb_step_batch, self.actor_rollout_wg
        if "actor" not in wg._dispatch_info:  # as verl's _balance_batch finds the actor's data-parallel size
            wg._dispatch_info["actor"] = wg._query_dispatch_info("actor")
        dp_size = max(wg._dispatch_info["actor"]) + 1
        n = per_rank * dp_size
        if n > len(batch.keys):
            raise ValueError(f"this step's batch has {len(batch.keys)} sequences, the probe needs {per_rank} for each "
                             f"of {dp_size} ranks")
        rows = tq.kv_batch_get(keys=list(batch.keys[:n]), partition_id=batch.partition_id)
        inputs = rows.exclude(*(name for name in LOG_PROB_OUTPUTS if name in rows.keys()))
        probe = KVBatchMeta(partition_id=PROBE_PARTITION, keys=[f"probe-{next(_PROBE_CALLS)}-{i}" for i in range(n)],
                            tags=list(batch.tags[:n]))
        tq.kv_batch_put(keys=probe.keys, partition_id=PROBE_PARTITION, fields=inputs, tags=probe.tags)
        try:
            probe.extra_info.update({"calculate_entropy": False, "compute_loss": False,
                                     "temperature": self.config.actor_rollout_ref.rollout.temperature})
            self._wb_call_settings(probe, "_compute_old_log_prob")
            wg.compute_log_prob(probe)
            try:
                data = tq.kv_batch_get(keys=probe.keys, partition_id=PROBE_PARTITION,
                                       select_fields=["log_probs", "response_mask"])
            except Exception as error:  # the queue's words for a field no one wrote
                raise ValueError(f"the log-prob pass wrote no log-probs back: {error}") from error
        finally:
            tq.kv_clear(keys=probe.keys, partition_id=PROBE_PARTITION)
        mask = data["response_mask"]
        return response_from_nested(data["log_probs"], mask).values()[mask.values().bool()].float().cpu()

    def _wb_checkpoint(self, step: int) -> str:
        made_room = checkpoints.words(checkpoints.make_room(os.environ[c.SESSION_ENV]))
        t0 = time.time()
        self._save_checkpoint()
        seconds = time.time() - t0
        return f" ({seconds:.1f} s" + (f"; {made_room} first: the disk had no room for two" if made_room else "") + ")"

    def _wb_checkpoint_after_failure(self) -> None:
        """An in-place rebuild that kept this trainer failed (rebuild.rebuild_rollout): its state, still whole, is
        checkpointed at its step, where the supervisor's relaunch resumes (the boundary wrote none)."""
        step = self._wb_step_offset + self.global_steps
        try:
            words = self._wb_checkpoint(step)
        except Exception as error:
            self._wb_store.add_event(c.EV_ERROR, f"the checkpoint after the failed rebuild failed too ({error!r}): "
                                     "the relaunch resumes from the newest checkpoint before it", {"step": step})
            return
        self._wb_store.add_event(c.EV_CHECKPOINT, f"checkpoint at step {step}{words}, after the failed rebuild",
                                 {"step": step})

    def _wb_end_run(self) -> None:
        self._wb_planned_steps = self.total_training_steps
        self.total_training_steps = self.global_steps  # verl's loop ends after this step

    def _wb_resume_fit(self) -> None:
        """Before the next fit of a trainer kept through an in-place rebuild (rebuild.rebuild_rollout): it goes on
        after the step the boundary ended on (verl's loop counted one past it; fit counts it again), for the run's
        planned length, with a dump executor again (fit shut it down)."""
        self.total_training_steps = self._wb_planned_steps
        self.global_steps -= 1
        self.wb_rebuild_request = None
        self._init_dump_executor()

    def _wb_rebuild(self, payload: dict[str, Any], segment_id: int) -> str:
        """A restart-class change verl takes in place, at the boundary (after its checkpoint where it needs one): the
        new segment's config for the TaskRunner, which rebuilds verl, or only its rollout, once this fit has ended
        (task_runner.py, rebuild.py); returns words for the event."""
        session_dir = Path(os.environ[c.SESSION_ENV])
        path = c.segment_config_path(session_dir, segment_id)
        path.parent.mkdir(exist_ok=True)
        path.write_text(payload["config_yaml"])
        self.wb_rebuild_request = {"segment": segment_id, "keeps": payload["keeps"], "env": payload["env"],
                                   "config_path": str(path)}
        pruned = checkpoints.words(checkpoints.prune(session_dir))  # rollback and resume need the newest only
        return f"; {pruned}" if pruned else ""


def _attempt(fn):
    """fn()'s result, or the exception it raised."""
    try:
        return fn()
    except Exception as error:  # a failed log-prob pass is a finding of the check, not an error of the boundary
        return error


def logprob_difference(old, new) -> dict[str, Any]:
    """How far two log-prob passes over the same response tokens lie apart."""
    if old.shape != new.shape:
        return {"skipped": f"the passes saw different tokens ({tuple(old.shape)} vs {tuple(new.shape)})"}
    diff = (old - new).abs()
    return {"tokens": int(diff.numel()), "max_abs_diff": float(diff.max()) if diff.numel() else 0.0,
            "mean_abs_diff": float(diff.mean()) if diff.numel() else 0.0}


def _with_live_settings(call: str):
    """The override of verl's trainer call `call` that hands it the live batching settings first."""
    def call_with_settings(self, batch, metrics):
        self._wb_call_settings(batch, call)
        return getattr(super(WorkbenchTrainerMixin, self), call)(batch, metrics)

    call_with_settings.__name__ = call_with_settings.__qualname__ = call
    return call_with_settings


for _call in SETTINGS_OF_CALL:
    setattr(WorkbenchTrainerMixin, _call, _with_live_settings(_call))

_TRAINERS: dict[type, type] = {}


def workbench_trainer(base: type) -> type:
    """verl's trainer class for the mode, with the workbench's step-boundary hooks in front."""
    if base not in _TRAINERS:
        _TRAINERS[base] = type(f"Workbench{base.__name__}", (WorkbenchTrainerMixin, base), {})
    return _TRAINERS[base]
