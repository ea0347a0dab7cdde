"""The memory model fit to a session: its own segments' measured peaks, its crashes as lower bounds, and the
model's dimensions (recorded, read from the model's config, or inferred from measured memory). workbench.memory
holds the model itself; this module is what a session's history makes of it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from .memory import (COEFFICIENTS, GIB, KNOWN_SHAPES, PASSES, Coefficients, MemoryPrediction, ModelShape, Roles,
                     Sequences, predict_memory, process_of, rollout_floor_gib)

CRASH_MARGIN = 1.02  # a crashed plan is fit to need at least this much more than the GPU had
MAX_ROLLOUT_SCALE = 8.0  # a rollout crash needing more is not the profiling pass's doing


# ------------------------------------------------------------------------------------------------ calibration
@dataclass(frozen=True)
class Observation:
    """One measured segment: its plan and what its trainer processes allocated at most (verl's
    perf/max_memory_allocated_gb, GiB), and the roles it ran."""

    segment_id: Any
    knobs: Mapping[str, Any]
    allocated_gib: Mapping[str, float]  # process → measured max allocated
    roles: Roles = Roles()
    sequences: Sequences = Sequences()
    gpu_peak_gib: float = math.nan  # NVML: the GPU's peak memory used in the measured steps


@dataclass(frozen=True)
class Crash:
    """A plan that ran out of memory: in `phase` when the traceback says which ("gen" for the rollout engine,
    "" when it doesn't say)."""

    segment_id: Any
    knobs: Mapping[str, Any]
    phase: str
    roles: Roles = Roles()
    sequences: Sequences = Sequences()


@dataclass(frozen=True)
class Calibration:
    """The coefficients a session's own measurements give, and how they were found."""

    coefficients: Coefficients
    observations: int
    residuals_gib: tuple[float, ...] = ()
    crashes: tuple[Any, ...] = ()
    why: tuple[str, ...] = field(default_factory=tuple)


def calibrate(observations: Iterable[Observation], shape: ModelShape, mem_total_gib: float,
              crashes: Iterable[Crash] = (), base: Coefficients = COEFFICIENTS,
              critic_shape: ModelShape | None = None) -> Calibration:
    """Refit the activation scale to the session's segments (least squares over measured − resident, with the
    prior scale counting as one observation), then raise it until every crashed plan predicts a peak at least
    at the GPU's capacity in the phase it crashed in: a crash says the plan needed more than there was."""
    observations, crashes = list(observations), list(crashes)
    why = []
    num, den = base.activation, 1.0  # the prior, as one observation of weight 1
    pairs = []
    for obs in observations:
        unit = predict_memory(obs.knobs, shape, mem_total_gib, coefficients=replace(base, activation=1.0),
                              roles=obs.roles, sequences=obs.sequences, critic_shape=critic_shape)
        for process, measured in obs.allocated_gib.items():
            rows = unit.phases[unit.phases["process"] == process]
            if rows.empty or not measured > 0:
                continue
            peak = rows.loc[rows["allocated_gib"].idxmax()]
            logits = _logits_gib(peak, obs.knobs, shape, base)
            act = peak["transient_gib"] - logits  # activations at scale 1
            if act > 0.5:  # only a pass whose activations matter says anything about their scale
                num += (measured - peak["resident_gib"] - logits) / act  # this pass's own scale
                den += 1.0
            pairs.append((obs, process, measured))
    coef = replace(base, activation=float(min(2.0, max(0.5, num / den))))
    if den > 1:
        why.append(f"activation scale {coef.activation:.2f} from {int(den - 1)} measured pass(es) and the prior "
                   f"{base.activation:.2f}")
    residuals = []
    for obs, process, measured in pairs:
        p = predict_memory(obs.knobs, shape, mem_total_gib, coefficients=coef, roles=obs.roles,
                           sequences=obs.sequences, critic_shape=critic_shape)
        residuals.append(measured - p.process_allocated_gib.get(process, math.nan))
    spread = max((abs(r) for r in residuals if not math.isnan(r)), default=0.0)
    if spread > coef.floor_gib:
        coef = replace(coef, floor_gib=spread)
        why.append(f"band at least {spread:.1f} GiB: the largest miss on this session's own segments")
    coef, said = _fit_rollout(observations, shape, mem_total_gib, coef, critic_shape)
    if said:
        why.append(said)
    for crash in crashes:
        coef, said = _lower_bound(crash, shape, mem_total_gib, coef, critic_shape)
        if said:
            why.append(said)
    return Calibration(coef, len(pairs), tuple(residuals), tuple(c.segment_id for c in crashes), tuple(why))


def _fit_rollout(observations: list[Observation], shape: ModelShape, mem_total_gib: float,
                 coef: Coefficients, critic_shape: ModelShape | None = None) -> tuple[Coefficients, str]:
    """The rollout engine's peak above its memory share, from the segments whose GPU peaked while generating
    (vLLM may take more than its share: up to 16 GiB more at 0.4 on the H200)."""
    needs = []
    for obs in observations:
        if not (obs.gpu_peak_gib > 0 and mem_total_gib > 0):
            continue
        p = predict_memory(obs.knobs, shape, mem_total_gib, coefficients=coef, roles=obs.roles,
                           sequences=obs.sequences, critic_shape=critic_shape)
        if obs.gpu_peak_gib > p.train_peak_gib:
            needs.append(coef.rollout_extra_gib + obs.gpu_peak_gib - p.gen_peak_gib)
    if not needs:
        return coef, ""
    extra = max(0.0, max(needs))
    return replace(coef, rollout_extra_gib=extra), (
        f"the rollout engine peaks {extra:.1f} GiB above its memory share (GPU peaks of {len(needs)} segment(s))")


def _logits_gib(row: pd.Series, knobs: Mapping[str, Any], shape: ModelShape, coef: Coefficients) -> float:
    p = next(p for p in PASSES if p.phase == row["phase"])
    if not p.logits:
        return 0.0
    per_token = 2.0 * shape.hidden_size if knobs["fused_kernels"] else \
        (coef.logits_train if p.grad else coef.logits_infer) * shape.vocab_size
    return row["tokens"] * per_token / GIB


def _lower_bound(crash: Crash, shape: ModelShape, mem_total_gib: float, coef: Coefficients,
                 critic_shape: ModelShape | None = None) -> tuple[Coefficients, str]:
    """Coefficients under which the crashed plan's training peak reaches the GPU's capacity."""
    if not mem_total_gib > 0:
        return coef, ""
    p = predict_memory(crash.knobs, shape, mem_total_gib, coefficients=coef, roles=crash.roles,
                       sequences=crash.sequences, critic_shape=critic_shape)
    if crash.phase == "gen" or (not crash.phase and p.gen_peak_gib >= p.train_peak_gib):
        # Only what the rollout engine's own knobs move is scaled (its profiling pass), never its share.
        weights = rollout_floor_gib(crash.knobs, shape, replace(coef, rollout_activation=0.0))
        per_scale = rollout_floor_gib(crash.knobs, shape, replace(coef, rollout_activation=1.0)) - weights
        share = float(crash.knobs["rollout_gpu_memory"]) * mem_total_gib
        rollout = max(share, rollout_floor_gib(crash.knobs, shape, coef))
        need = CRASH_MARGIN * mem_total_gib - (p.gen_peak_gib - rollout)
        scale = (need - weights) / per_scale if per_scale > 0 else math.inf
        if need <= rollout or scale > MAX_ROLLOUT_SCALE:
            return coef, ""  # not the profiling pass: the plan itself stays ruled out (advice.safety)
        return replace(coef, rollout_activation=scale), (
            f"segment {crash.segment_id} ran out of memory in the rollout engine: its start-up pass scaled to "
            f"{scale:.2f}")
    rows = p.phases if not crash.phase else p.phases[p.phases["phase"] == crash.phase]
    if rows.empty:
        return coef, ""
    row = rows.loc[rows["allocated_gib"].idxmax()]
    needed = CRASH_MARGIN * mem_total_gib - (p.train_peak_gib - max(p.process_allocated_gib.values()))
    act = row["transient_gib"] - _logits_gib(row, crash.knobs, shape, coef)
    short = needed - row["allocated_gib"]
    if short <= 0 or act <= 0:
        return coef, ""
    scale = coef.activation * (act + short) / act
    return replace(coef, activation=scale), (
        f"segment {crash.segment_id} ran out of memory in {row['phase']}: activations scaled to {scale:.2f} so "
        f"that plan needs {needed:.0f} GiB, more than the GPU has")


# ------------------------------------------------------------------------------------------------ from measurements
ALLOCATED_METRIC = "{role}/perf/max_memory_allocated_gb"  # verl: torch.cuda.max_memory_allocated() / 2**30


def roles_from_steps(steps: pd.DataFrame) -> Roles:
    """The roles a segment ran, from the phases verl timed."""
    return Roles(critic="timing_s/update_critic" in steps or "timing_s/values" in steps, ref="timing_s/ref" in steps)


def typical(steps: pd.DataFrame, column: str, mean: bool = False) -> float:
    """A step column's median (its mean where `mean`), NaNs dropped; NaN where it has none."""
    values = pd.to_numeric(steps[column], errors="coerce").dropna() if column in steps else pd.Series(dtype=float)
    return float(values.mean() if mean else values.median()) if len(values) else math.nan


def sequences_from_steps(steps: pd.DataFrame, padded: bool | None = None) -> Sequences:
    prompt, response = typical(steps, "prompt_length/mean"), typical(steps, "response_length/mean")
    return Sequences(prompt, response, typical(steps, "perf/total_num_tokens") / (prompt + response), padded)


def measured_allocated(steps: pd.DataFrame, knobs: Mapping[str, Any]) -> dict[str, float]:
    """Each trainer process's max allocated GiB over a segment's steps (actor and critic report the same process's
    figure when they share one)."""
    out: dict[str, float] = {}
    for role in ("actor", "critic"):
        column = ALLOCATED_METRIC.format(role=role)
        if column in steps:
            values = pd.to_numeric(steps[column], errors="coerce").dropna()
            if len(values):
                process = process_of(role, knobs)
                out[process] = max(out.get(process, 0.0), float(values.max()))
    return out


def measured_reserved(steps: pd.DataFrame) -> float:
    """The trainer's max reserved GiB over a segment's steps (verl's perf/max_memory_reserved_gb)."""
    columns = [c for c in ("actor/perf/max_memory_reserved_gb", "critic/perf/max_memory_reserved_gb") if c in steps]
    return float(pd.to_numeric(steps[columns].stack(), errors="coerce").max()) if columns else math.nan


def observation(segment_id: Any, steps: pd.DataFrame, knobs: Mapping[str, Any], *, padded: bool | None = None,
                inherited: Mapping[str, float] | None = None, gpu_peak_gib: float = math.nan) -> Observation | None:
    """A segment's measured peaks as a calibration point. `inherited`: the readings the same processes had
    reached before this segment began (a hot change keeps the process, and verl's figure is the process's max so
    far): a reading no higher says only that this plan needs no more, so it is left out."""
    allocated = measured_allocated(steps, knobs)
    allocated = {p: gib for p, gib in allocated.items() if gib > (inherited or {}).get(p, 0.0) + 0.01}
    if not allocated:
        return None
    return Observation(segment_id, dict(knobs), allocated, roles_from_steps(steps),
                       sequences_from_steps(steps, padded), gpu_peak_gib)


def shape_for(meta: Mapping[str, Any], model_dir: str | None = None,
              key: str = "model_shape") -> ModelShape | None:
    """A model's dimensions: the session's meta (`key`, recorded at launch), else the config.json in the plan's
    model directory when it is readable here."""
    shape = ModelShape.from_config(meta.get(key), "the session's recorded model shape")
    if shape is not None or model_dir is None:
        return shape
    config = Path(model_dir) / "config.json"
    try:
        return ModelShape.from_config(json.loads(config.read_text()), f"{config}")
    except (OSError, ValueError):
        return None


def infer_shape(observations: Iterable[Observation], mem_total_gib: float) -> ModelShape:
    """A session that recorded no model shape: the known shape whose predictions miss its measured peaks least
    (the 0.5B shape when nothing was measured)."""
    observations = list(observations)

    def miss(shape: ModelShape) -> float:
        total = 0.0
        for obs in observations:
            p = predict_memory(obs.knobs, shape, mem_total_gib, roles=obs.roles, sequences=obs.sequences)
            total += sum(abs(p.process_allocated_gib.get(proc, 0.0) - gib) for proc, gib in obs.allocated_gib.items())
        return total

    best = min(KNOWN_SHAPES.values(), key=miss) if observations else KNOWN_SHAPES["qwen2.5-0.5b"]
    return replace(best, source=f"inferred from measured memory: {best.source}" if observations else
                   f"assumed (nothing recorded or measured): {best.source}")


@dataclass(frozen=True)
class MemoryModel:
    """A session's memory model: its model's dimensions and the coefficients its measurements calibrated."""

    shape: ModelShape
    calibration: Calibration
    critic_shape: ModelShape | None = None  # when the critic's model differs from the policy's

    def predict(self, knobs: Mapping[str, Any], mem_total_gib: float, roles: Roles = Roles(),
                sequences: Sequences = Sequences()) -> MemoryPrediction:
        return predict_memory(knobs, self.shape, mem_total_gib, coefficients=self.calibration.coefficients,
                              roles=roles, sequences=sequences, critic_shape=self.critic_shape)

    @classmethod
    def fit(cls, shape: ModelShape | None, observations: Iterable[Observation], mem_total_gib: float,
            crashes: Iterable[Crash] = (), critic_shape: ModelShape | None = None) -> "MemoryModel":
        observations = list(observations)
        shape = shape or infer_shape(observations, mem_total_gib)
        critic_shape = critic_shape if critic_shape is not None and critic_shape.as_dict() != shape.as_dict() \
            else None
        return cls(shape, calibrate(observations, shape, mem_total_gib, crashes, critic_shape=critic_shape),
                   critic_shape)

    @property
    def text(self) -> str:
        s = self.shape
        return (f"{s.policy_params / 1e9:.2f}B parameters ({s.num_hidden_layers} layers × {s.hidden_size}, "
                f"vocabulary {s.vocab_size}; {s.source}); " + ("; ".join(self.calibration.why) or
                                                               "coefficients as fit on the H200 runs"))


def scaled_sequences(sequences: Sequences, before: Mapping[str, Any], after: Mapping[str, Any]) -> Sequences:
    """A segment's measured sequences under a plan with other length limits or batch size (real lengths scale
    with the limits: the random-weight models fill their responses)."""
    def ratio(name: str) -> float:
        return float(after[name]) / float(before[name])

    return Sequences(sequences.prompt * min(1.0, ratio("max_prompt_length")),
                     sequences.response * ratio("max_response_length"),
                     sequences.count * ratio("train_batch_size"), sequences.padded)
