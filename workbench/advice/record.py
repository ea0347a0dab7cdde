"""What the advisor knows of a session beyond the segment it measures: the model's dimensions and the memory model
its segments calibrate, the plans that crashed (failures are measurements), the plan in force that advice is
judged against, and whether sequences ran padded.

Built from what any view can read (a session's steps, samples, segments, events and meta), so replays and live
sessions give the same record.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import pandas as pd

from .. import memory, memory_fit
from ..memory import PHASE_ROLE
from .core import inside_steps, limit

# Where in verl a traceback points, innermost last: (phase, words that name it). The rollout engine's own start-up
# and KV cache are "gen".
CRASH_PHASES = (
    ("update_critic", ("critic_train_mini_batch", "update_critic", "_update_critic")),
    ("values", ("compute_values", "_compute_values")),
    ("update_actor", ("update_actor", "actor_train_mini_batch", "_update_actor")),
    ("ref", ("compute_ref_log_prob", "_compute_ref_log_prob")),
    ("old_log_prob", ("compute_log_prob", "_compute_old_log_prob", "old_log_prob")),
    ("gen", ("llm_server", "launch_servers", "vllm", "kv cache", "init_hybrid", "generate_sequences")),
)
PHASE_WORDS = {"gen": "the rollout engine", "update_critic": "the critic's update", "values": "the critic's values",
               "update_actor": "the actor's update", "old_log_prob": "the old log-prob pass",
               "ref": "the reference log-prob pass", "": "an unknown phase"}
# GPUs whose size a session may not have sampled (replays of the reference traces carry no memory total).
GPU_MEMORY_MIB = {"NVIDIA H200": 143_771.0}
NO_FLASH_ATTN = "without remove-padding"  # the runner's event when flash-attn is missing


def crash_phase(traceback_tail: str) -> str:
    """The step phase a traceback ran out in: the marker found latest in the text ("" when none is)."""
    text = (traceback_tail or "").lower()
    found = [(text.rfind(word.lower()), phase) for phase, words in CRASH_PHASES for word in words]
    position, phase = max(found)
    return phase if position >= 0 else ""


@dataclass(frozen=True)
class Failure:
    """A segment whose run crashed: its plan, whether it ran out of memory, where, and the traceback's last line."""

    segment_id: int
    knobs: Mapping[str, Any]
    oom: bool
    phase: str
    exit_code: Any
    last_line: str

    @property
    def role(self) -> str:
        return "rollout" if self.phase == "gen" else PHASE_ROLE.get(self.phase, "")

    @property
    def text(self) -> str:
        what = "ran out of GPU memory" if self.oom else f"crashed (exit code {self.exit_code})"
        return f"segment {self.segment_id} {what} in {PHASE_WORDS.get(self.phase, self.phase)}"


@dataclass(frozen=True)
class MeasuredPlan:
    """A segment that ran good steps: its plan and its mean step after the warm-up step (colocate_async alternates
    long and short steps, so the mean of them, as the autopilot judges)."""

    segment_id: int
    knobs: Mapping[str, Any]
    step_s: float


@dataclass(frozen=True)
class SessionRecord:
    memory_model: memory_fit.MemoryModel
    mem_total_gib: float
    failures: tuple[Failure, ...]
    plan_in_force: Mapping[str, Any]
    plan_in_force_segment: int | None
    padded: bool | None
    roles: memory.Roles
    sequences: memory.Sequences
    measured_plans: tuple[MeasuredPlan, ...] = ()

    def measured(self, knobs: Mapping[str, Any]) -> MeasuredPlan | None:
        """The newest segment that measured exactly this plan (None if none did)."""
        same = [p for p in self.measured_plans if dict(p.knobs) == dict(knobs)]
        return same[-1] if same else None

    def predict_memory(self, knobs: Mapping[str, Any], basis: Mapping[str, Any] | None = None
                       ) -> memory.MemoryPrediction:
        """A plan's memory with the session's model, roles and measured sequences (scaled from `basis`)."""
        sequences = memory_fit.scaled_sequences(self.sequences, basis, knobs) if basis else self.sequences
        return self.memory_model.predict(knobs, self.mem_total_gib, self.roles, sequences)


def _last_line(tail: str) -> str:
    lines = [line.strip() for line in (tail or "").splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


def gpu_peak_gib(steps: pd.DataFrame, samples: pd.DataFrame, gpus: list[int] | None = None) -> float:
    """NVML's peak memory used (GiB) inside a segment's steps after its warm-up step, on `gpus` (all: None)."""
    measured = steps.sort_values("step").iloc[1:]
    inside = inside_steps(samples, measured)
    if gpus is not None:
        inside = inside[inside["gpu"].isin(gpus)]
    return float(inside["mem_used"].max()) / 1024 if len(inside) and inside["mem_used"].notna().any() else math.nan


def _mem_total(samples: pd.DataFrame, meta: Mapping[str, Any]) -> float:
    if len(samples) and "mem_total" in samples and samples["mem_total"].notna().any():
        return float(samples["mem_total"].max()) / 1024
    return GPU_MEMORY_MIB.get(meta.get("gpu_name"), math.nan) / 1024


def build_record(*, meta: Mapping[str, Any], segments: pd.DataFrame, knobs_of: Callable[[int], dict[str, Any]],
                 steps: pd.DataFrame, samples: pd.DataFrame, events: pd.DataFrame,
                 initial_knobs: Mapping[str, Any]) -> SessionRecord:
    """The record of a session from its tables: segments (id, status, reason), the knobs of each segment's plan,
    steps, samples and events (crash events carry the traceback tail and the out-of-memory verdict)."""
    events = events if len(events) else pd.DataFrame(columns=["kind", "text", "data"])
    padded = True if events["text"].astype(str).str.contains(NO_FLASH_ATTN).any() else None
    crashes = {int(e["segment"]): e for e in events.loc[events["kind"] == "crash", "data"] if isinstance(e, dict)
               and "segment" in e}
    mem_total = _mem_total(samples, meta)
    observations, failures, measured = [], [], []
    previous: dict[str, float] = {}
    rows = segments.sort_values("id").to_dict("records")
    for index, row in enumerate(rows):
        knobs = knobs_of(int(row["id"]))
        seg = steps[steps["segment_id"] == row["id"]] if len(steps) else steps
        hot = index > 0 and "hot apply" in str(rows[index - 1].get("reason") or "")
        if len(seg):
            obs = memory_fit.observation(row["id"], seg, knobs, padded=padded, inherited=previous if hot else None,
                                         gpu_peak_gib=gpu_peak_gib(seg, samples, list(knobs["gpus"])))
            observations += [obs] if obs else []
            measured.append((row, knobs, seg))
            previous = memory_fit.measured_allocated(seg, knobs)
        if row["status"] == "failed":
            crash = crashes.get(int(row["id"]), {})
            tail = crash.get("traceback_tail", "")
            oom = bool(crash.get("oom", "out of memory" in str(row.get("reason") or "")))
            failures.append(Failure(int(row["id"]), knobs, oom, crash_phase(tail), crash.get("exit_code"),
                                    _last_line(tail)))
    good = [(row, knobs, seg) for row, knobs, seg in measured if row["status"] != "failed"]
    basis_steps = good[-1][2] if good else (measured[-1][2] if measured else pd.DataFrame())
    roles = memory_fit.roles_from_steps(basis_steps) if len(basis_steps) else memory.Roles()
    sequences = memory_fit.sequences_from_steps(basis_steps, padded) if len(basis_steps) else \
        memory.Sequences(padded=padded)
    basis_knobs = good[-1][1] if good else None
    crash_fits = [memory_fit.Crash(f.segment_id, f.knobs, f.phase, roles,
                                   memory_fit.scaled_sequences(sequences, basis_knobs, f.knobs) if basis_knobs
                                   else sequences)
                  for f in failures if f.oom]
    actor_path, critic_path = _model_path(meta, "actor_rollout_ref"), _model_path(meta, "critic")
    shape = memory_fit.shape_for(meta, actor_path)
    # The critic's own dimensions only when it is another model (verl's value model of the same one: None).
    critic = memory_fit.shape_for(meta, critic_path, key="critic_model_shape") if critic_path != actor_path \
        else None
    model = memory_fit.MemoryModel.fit(shape, observations, mem_total, crash_fits, critic_shape=critic)
    in_force, in_force_segment = _plan_in_force(rows, knobs_of, steps, initial_knobs)
    return SessionRecord(model, mem_total, tuple(failures), in_force, in_force_segment, padded, roles, sequences,
                         tuple(_measured_plan(row, knobs, seg) for row, knobs, seg in good
                               if len(seg) > limit("min_steps")))


def _measured_plan(row: Mapping[str, Any], knobs: Mapping[str, Any], seg: pd.DataFrame) -> MeasuredPlan:
    after_warmup = pd.to_numeric(seg.sort_values("step")["timing_s/step"], errors="coerce").iloc[1:]
    return MeasuredPlan(int(row["id"]), knobs, float(after_warmup.mean()))


def _model_path(meta: Mapping[str, Any], role: str) -> str | None:
    """The model path the session's initial plan gives `role` ("actor_rollout_ref" or "critic")."""
    plan = meta.get("initial_plan")
    if not plan:
        return None
    for override in json.loads(plan).get("overrides", []):
        if override.startswith(f"{role}.model.path="):
            return override.split("=", 1)[1]
    return None


def _plan_in_force(rows: list[dict[str, Any]], knobs_of: Callable[[int], dict[str, Any]], steps: pd.DataFrame,
                   initial_knobs: Mapping[str, Any]) -> tuple[dict[str, Any], int | None]:
    """The newest segment's plan; after a crash the last plan that ran good steps (what a rollback relaunches)."""
    if not rows:
        return dict(initial_knobs), None
    newest = rows[-1]
    if newest["status"] != "failed":
        return knobs_of(int(newest["id"])), int(newest["id"])
    ran = set(steps["segment_id"]) if len(steps) else set()
    for row in reversed(rows):
        if row["status"] != "failed" and row["id"] in ran:
            return knobs_of(int(row["id"])), int(row["id"])
    return knobs_of(int(newest["id"])), int(newest["id"])
