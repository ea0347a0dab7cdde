"""What-if: a changed plan's step time per phase and peak GPU memory, predicted before anything runs.

The model is calibrated on one measured segment of the session (`segment_cost`): its median seconds per phase
(verl's `timing_s/*`, warm-up step left out), its tokens, its trainer memory (`*/perf/max_memory_reserved_gb`)
and its NVML peak. A changed plan moves those numbers by the effects in EFFECTS, one per lever, each a factor on
the phases it touches with a relative uncertainty and the source of the number (PRIORS). Where no measurement
exists the factor is 1 and the knob is listed as unmodelled with a wider uncertainty, never silently ignored.

Priors come from real verl 0.9.1 runs on one H200 (0.5B-shaped Qwen2, 256 prompts × up to 512+512 tokens,
tests/data/README.md) or, where no run measured a lever, from how verl computes it (said so in the source).
Memory comes from workbench.memory: a model of what each role keeps per parameter and each pass per token, from
the model's dimensions, calibrated on the session's own segments (workbench.memory_fit) — so it scales with the
model. A prediction carries its memory band; `fits` says whether the peak, band included, stays under the
out-of-memory line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd

from . import memory, memory_fit
from .knob import PHASES
from .knobs import model_groups

PER_TOKEN_PHASES = ("reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
MIB_PER_GIB = 1024.0
OOM_SHARE = memory.OOM_LINE_SHARE
NEAR_FULL_SHARE = 0.90
UNMODELLED_UNCERTAINTY = 0.30


@dataclass(frozen=True)
class Prior:
    factor: dict[str, float]
    uncertainty: float
    source: str


PRIORS: dict[str, Prior] = {
    "fused_kernels": Prior(
        {"update_actor": 0.14, "old_log_prob": 0.185, "ref": 0.185}, 0.25,
        "1 × H200, 2026-12-01 (0.5B shape, 256 prompts × 512 + 512): quickstart → fused kernels took old_log_prob "
        "10.1–10.7 → 1.7–2.2 s (×0.185) and update_actor 38.3–40.9 → 3.9–4.6 s (×0.105), of which ×0.75 is "
        "gradient checkpointing off (below), leaving ×0.14 for the kernels"),
    "gradient_checkpointing": Prior(
        {"update_actor": 0.75, "update_critic": 0.75}, 0.15,
        "verl recomputes each layer's forward in the backward pass with checkpointing on: one extra forward of "
        "forward+backward ≈ 1/3 more work, so off ≈ ×0.75 (not fit to a run)"),
    "rollout_enforce_eager": Prior(
        {"gen": 0.6}, 0.40,
        "not measured on this workload: vLLM decoding a 0.5B model without CUDA graphs is bound by kernel "
        "launches; ×0.6 is a guess with a wide band"),
    "colocate_async": Prior(
        {"gen": 0.5}, 0.40,
        "1 × H200, 2026-11-30 (0.5B shape): colocate_async alternated 16.0 / 6.8 / "
        "12.9 / 6.1 s steps against 11.6–15.5 s sync; about half of generation overlapped"),
    "critic_lora": Prior(
        {"update_critic": 3.5}, 0.30,
        "1 × H200, 2026-11-30 (0.5B shape): a rank-8 LoRA critic made update_critic 2.13 s against "
        "0.60 s full fine-tuning"),
    "rollout_logprob_bypass": Prior(
        {"old_log_prob": 0.05}, 0.50,
        "verl 0.9.1 trainer_base._compute_old_log_prob with bypass_mode copies rollout_log_probs instead of a "
        "forward pass (not measured)"),
    "batching": Prior(
        {}, 0.10,
        "1 × H200, 2026-11-30: the quickstart plan and its hot budget neighbour ran alike; budgets and micro batches "
        "change memory, barely time, while the per-token loop dominates"),
    "rollout_engine": Prior(
        {}, 0.10,
        "1 × H200, 2026-12-01: agent-loop workers 2 → 8 left gen at 8.12–8.17 s; rollout memory and scheduling knobs "
        "are not measured separately"),
    "offload": Prior({}, 0.15, "not measured: offload moves parameters or optimizer state over PCIe each step"),
}

# The effect groups _effects models; each knob names its own in the knob table (knob.UNMODELLED where none).
MODEL_GROUPS = ("fused_kernels", "gradient_checkpointing", "rollout_enforce_eager", "rollout_logprob_bypass",
                "critic_lora", "trainer_mode", "tokens", "waves", "batching", "rollout_engine", "offload")
_GROUP_OF = model_groups()


@dataclass(frozen=True)
class SegmentCost:
    """One measured segment, reduced to what the model needs."""

    segment_id: Any
    knobs: Mapping[str, Any]
    steps: tuple[int, ...]
    phase_s: Mapping[str, float]
    other_s: float
    step_s: float
    step_spread: float  # half the min–max range of the measured steps / median step
    tokens: float
    trainer_peak_gb: float  # the trainer's max reserved memory (GiB)
    gpu_peak_gb: float  # NVML: the GPU's peak memory used
    mem_total_gb: float
    observation: memory_fit.Observation | None = None  # the measured peaks, as the memory model reads them


@dataclass(frozen=True)
class Prediction:
    """A plan's predicted step (seconds per phase and in all), peak memory per GPU, and how sure it is."""

    basis_segment: Any
    basis_steps: tuple[int, ...]
    phase_s: dict[str, float]
    measured_phase_s: dict[str, float]
    step_s: float
    uncertainty: float  # relative, one side
    measured_step_s: float
    trainer_peak_gb: float
    gpu_peak_gb: float
    mem_total_gb: float
    sources: dict[str, str]
    unmodelled: tuple[str, ...]
    memory: memory.MemoryPrediction | None = None
    warnings: dict[str, str] = field(default_factory=dict)

    @property
    def step_range_s(self) -> tuple[float, float]:
        return self.step_s * (1 - self.uncertainty), self.step_s * (1 + self.uncertainty)

    @property
    def speedup(self) -> float:
        return self.measured_step_s / self.step_s if self.step_s > 0 else float("nan")

    @property
    def gpu_peak_share(self) -> float:
        return self.gpu_peak_gb / self.mem_total_gb if self.mem_total_gb > 0 else float("nan")

    @property
    def oom(self) -> bool:
        return self.gpu_peak_share >= OOM_SHARE

    @property
    def memory_band_gb(self) -> float:
        return self.memory.band_gib if self.memory is not None else 0.0

    @property
    def fits(self) -> bool:
        """Whether the peak, its upper band included, stays under the out-of-memory line."""
        return self.memory.fits if self.memory is not None else not self.oom

    def frame(self) -> pd.DataFrame:
        """One row per phase: measured and predicted seconds."""
        rows = [{"phase": p, "measured_s": self.measured_phase_s.get(p, float("nan")),
                 "predicted_s": self.phase_s.get(p, float("nan"))} for p in (*PHASES, "other")]
        rows.append({"phase": "step", "measured_s": self.measured_step_s, "predicted_s": self.step_s})
        return pd.DataFrame(rows)

    @property
    def text(self) -> str:
        low, high = self.step_range_s
        band = self.memory_band_gb
        memory = (f"peak GPU memory {self.gpu_peak_gb:.0f} ± {band:.0f} of {self.mem_total_gb:.0f} GiB "
                  f"({self.gpu_peak_share:.0%})" if self.mem_total_gb > 0 else
                  f"trainer memory {self.trainer_peak_gb:.0f} ± {band:.0f} GiB")
        return (f"{self.step_s:.1f} s a step ({low:.1f}–{high:.1f}) against {self.measured_step_s:.1f} s measured "
                f"in segment {self.basis_segment} ({self.speedup:.2f}×); {memory}")


# ------------------------------------------------------------------------------------------------ calibration
def _median(steps: pd.DataFrame, column: str) -> float:
    if column not in steps:
        return float("nan")
    values = pd.to_numeric(steps[column], errors="coerce").dropna()
    return float(values.median()) if len(values) else float("nan")


def segment_cost(m: Any) -> SegmentCost | None:
    """The cost of the segment an advisor `Measurements` holds (steps after warm-up, in-step samples)."""
    steps = m.steps
    step_s = _median(steps, "timing_s/step")
    if not step_s > 0:
        return None
    phase_s = {p: v for p in PHASES if not math.isnan(v := _median(steps, f"timing_s/{p}"))}
    durations = pd.to_numeric(steps["timing_s/step"], errors="coerce").dropna()
    reserved = [float(pd.to_numeric(steps[c], errors="coerce").max()) for c in
                ("actor/perf/max_memory_reserved_gb", "critic/perf/max_memory_reserved_gb") if c in steps]
    per_gpu = m.per_gpu
    gpu_peak = mem_total = float("nan")
    if not per_gpu.empty and per_gpu["mem_used_max"].notna().any():
        gpu_peak = float(per_gpu["mem_used_max"].max()) / MIB_PER_GIB
        mem_total = float(per_gpu["mem_total"].max()) / MIB_PER_GIB
    return SegmentCost(
        segment_id=m.segment_id, knobs=dict(m.knobs), steps=tuple(int(s) for s in steps["step"]), phase_s=phase_s,
        other_s=max(0.0, step_s - sum(phase_s.values())), step_s=step_s,
        step_spread=float((durations.max() - durations.min()) / 2 / step_s),
        tokens=_median(steps, "perf/total_num_tokens"), trainer_peak_gb=max(reserved, default=float("nan")),
        gpu_peak_gb=gpu_peak, mem_total_gb=mem_total,
        observation=memory_fit.observation(m.segment_id, steps, m.knobs, padded=getattr(m, "padded", None),
                                           gpu_peak_gib=gpu_peak),
    )


# ------------------------------------------------------------------------------------------------ the model
def _waves(knobs: Mapping[str, Any]) -> int:
    return math.ceil(int(knobs["train_batch_size"]) / int(knobs["rollout_max_num_seqs"]))


def _effects(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[tuple[str, dict[str, float], float]]:
    """(group, phase factors, relative uncertainty) for each changed lever."""
    changed = {name for name in after if after[name] != before.get(name)}
    groups = {_GROUP_OF[name] for name in changed if name in _GROUP_OF}
    effects = []

    def flip(group: str, on: bool) -> None:
        prior = PRIORS[group]
        factors = {p: (f if on else 1 / f) for p, f in prior.factor.items()}
        effects.append((group, factors, prior.uncertainty))

    if "fused_kernels" in groups:
        flip("fused_kernels", bool(after["fused_kernels"]))
    if "gradient_checkpointing" in groups:
        flip("gradient_checkpointing", not after["gradient_checkpointing"])
    if "rollout_enforce_eager" in groups:
        flip("rollout_enforce_eager", not after["rollout_enforce_eager"])
    if "rollout_logprob_bypass" in groups:
        flip("rollout_logprob_bypass", bool(after["rollout_logprob_bypass"]))
    if "critic_lora" in groups and (before["critic_lora_rank"] > 0) != (after["critic_lora_rank"] > 0):
        flip("critic_lora", after["critic_lora_rank"] > 0)
    if "trainer_mode" in groups and "separate_async" not in (before["trainer_mode"], after["trainer_mode"]):
        flip("colocate_async", after["trainer_mode"] == "colocate_async")
    if "tokens" in groups:
        ratio = (after["train_batch_size"] / before["train_batch_size"]) * (
            (after["max_prompt_length"] + after["max_response_length"])
            / (before["max_prompt_length"] + before["max_response_length"]))
        factors = dict.fromkeys(PER_TOKEN_PHASES, ratio)
        factors["gen"] = after["max_response_length"] / before["max_response_length"]
        effects.append(("tokens", factors, 0.20))
    if groups & {"tokens", "waves"}:
        waves = _waves(after) / _waves(before)
        if waves != 1:
            effects.append(("waves", {"gen": waves}, 0.20))
    for group in ("batching", "rollout_engine", "offload"):
        if group in groups:
            effects.append((group, {}, PRIORS[group].uncertainty))
    return effects


_SOURCES = {
    "tokens": "per-token phases scale with prompts × sequence length; generation with the response length "
              "(the random model fills it: ~253 of 256 tokens on the H200)",
    "waves": "more sequences than max_num_seqs decode in waves, one after another",
}


def memory_model_for(cost: SegmentCost) -> memory_fit.MemoryModel:
    """The memory model one segment calibrates on its own (a session's history calibrates a better one)."""
    return memory_fit.MemoryModel.fit(None, [cost.observation] if cost.observation else [], cost.mem_total_gb)


def predict_memory(cost: SegmentCost, after: Mapping[str, Any],
                   model: memory_fit.MemoryModel | None = None) -> memory.MemoryPrediction:
    """The plan with knob values `after`: its peak memory, from the roles and sequences `cost` measured."""
    model = model or memory_model_for(cost)
    obs = cost.observation
    roles = obs.roles if obs else memory.Roles()
    sequences = memory_fit.scaled_sequences(obs.sequences, cost.knobs, after) if obs else memory.Sequences()
    return model.predict(after, cost.mem_total_gb, roles, sequences)


def predict(cost: SegmentCost, after: Mapping[str, Any], memory_model: memory_fit.MemoryModel | None = None
            ) -> Prediction:
    """The plan with knob values `after`, predicted from the measured segment `cost` (memory by `memory_model`,
    else by one calibrated on `cost` alone)."""
    before = cost.knobs
    phase = dict(cost.phase_s)
    absolute: dict[str, float] = {}  # variance each moved phase adds (seconds²)
    sources: dict[str, str] = {}
    for group, factors, uncertainty in _effects(before, after):
        for p, factor in factors.items():
            if p in phase:
                phase[p] *= factor
        moved = factors or dict.fromkeys(phase, 1.0)
        for p in moved:
            if p in phase:
                absolute[p] = absolute.get(p, 0.0) + (phase[p] * uncertainty) ** 2
        sources[group] = PRIORS[group].source if group in PRIORS else _SOURCES[group]
    changed = [name for name in after if after[name] != before.get(name)]
    unmodelled = tuple(name for name in changed if name not in _GROUP_OF)
    step = sum(phase.values()) + cost.other_s
    # The basis segment's own step-to-step spread, the moved phases' prior uncertainties, unmodelled knobs.
    variance = (step * cost.step_spread) ** 2 + sum(absolute.values()) + \
        (UNMODELLED_UNCERTAINTY * step) ** 2 * bool(unmodelled)
    uncertainty = math.sqrt(variance) / step if step > 0 else float("nan")

    mem = predict_memory(cost, after, memory_model)
    prediction = Prediction(
        basis_segment=cost.segment_id, basis_steps=cost.steps, phase_s={**phase, "other": cost.other_s},
        measured_phase_s={**cost.phase_s, "other": cost.other_s}, step_s=step, uncertainty=uncertainty,
        measured_step_s=cost.step_s, trainer_peak_gb=max(mem.process_reserved_gib.values(), default=math.nan),
        gpu_peak_gb=mem.gpu_peak_gib, mem_total_gb=cost.mem_total_gb, sources=sources, unmodelled=unmodelled,
        memory=mem,
    )
    return _with_warnings(prediction, changed)


def _with_warnings(p: Prediction, changed: list[str]) -> Prediction:
    warnings: dict[str, str] = {}
    if p.mem_total_gb > 0 and (p.gpu_peak_share >= NEAR_FULL_SHARE or not p.fits):
        verdict = "out of memory predicted" if p.oom else "GPU memory nearly full" if p.fits else \
            "out of memory possible"
        where = p.memory.peak_phase if p.memory is not None else "training"
        warnings["plan"] = (f"{verdict}: peak {p.gpu_peak_gb:.0f} ± {p.memory_band_gb:.0f} of "
                            f"{p.mem_total_gb:.0f} GiB ({p.gpu_peak_share:.0%}, in {where}; trainer "
                            f"{p.trainer_peak_gb:.0f} GiB) after changing {', '.join(changed)}")
    for name in p.unmodelled:
        warnings[name] = f"{name}: no measurement predicts its effect; the prediction is wider for it"
    return Prediction(**{**p.__dict__, "warnings": warnings})


def closest_cost(costs: list[SegmentCost], after: Mapping[str, Any]) -> SegmentCost | None:
    """The measured segment whose plan differs from `after` in the fewest knobs (the newest among equals)."""
    if not costs:
        return None
    return min(reversed(costs), key=lambda c: sum(after[n] != c.knobs.get(n) for n in after))
