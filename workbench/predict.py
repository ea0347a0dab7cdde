"""What-if: a changed plan's step time per phase and peak GPU memory, predicted before anything runs.

The model is calibrated on one measured segment of the session (`segment_cost`): its median seconds per phase
(verl's `timing_s/*`, warm-up step left out), its tokens, its trainer memory (`*/perf/max_memory_reserved_gb`)
and its NVML peak. A changed plan moves those numbers by the effects in EFFECTS, one per lever, each a factor on
the phases it touches with a relative uncertainty and the source of the number (PRIORS). Where no measurement
exists the factor is 1 and the knob is listed as unmodelled with a wider uncertainty, never silently ignored.

Priors come from real verl 0.9.1 runs on one H200 (0.5B-shaped Qwen2, 256 prompts × up to 512+512 tokens,
tests/data/README.md) or, where no run measured a lever, from how verl computes it (said so in the source).
Fused kernels, gradient checkpointing and dynamic batching act on parts of the log-prob passes whose weights follow
the model's shape (`pass_cost`: a transformer part and a full-vocabulary logits part), so their factors differ
between a 0.5B and a 1.5B model as the H200 measured. Memory comes from workbench.memory: a model of what each role keeps per parameter and each pass per token, from
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
# Generation moves between segments of the same plan, beside its step-to-step spread: 1 × H200 medians, 2026-11-30/
# 12-01, the plan's changes leaving generation alone: 1.5B hot vs restarted 7.41 / 5.39 s, 0.5B h200-tuning 2 → 3
# 10.33 / 7.97 s, hot-lever 1 → 2 6.17 / 6.65 s, quickstart on two days 9.14 / 8.13 s, fused C / D 8.14 / 8.15 s:
# the differences' root mean square is 19 % of generation, which a changed plan's band carries.
GEN_BETWEEN_SEGMENTS = 0.19


# colocate_async's generation per step over sync's. verl 0.9.1's colocate_async (trainer/ppo/v1/
# trainer_colocate_async.py) runs the rollout on the GPUs it trains on: once the trainer has its batch, on_sample_end
# aborts the unfinished requests and puts vLLM to sleep (weights and KV cache freed) for all of training, and
# on_step_end wakes it. So generation never overlaps training, on one GPU or several: what async adds is the next
# batch's prompts (num_warmup_batches) decoding beside this one's, which fills the engine's idle room only in the
# tail, where a batch's last long responses decode nearly alone, and the partial rollouts it aborts resume next step.
# Every other step generates two batches together and the next finds its batch ready (gen ~0.15 s): per step,
# generation shrinks only by that tail. 1 × H200, 2026-12-02 (0.5B shape, 128 prompts × ≤ 256 + 768, the fused round-1
# plan, bench/results/h200_2026-12-02_inplace, segment 2 → 3, colocate_async changed alone): the sync segment's
# median gen (steps 4–5: 6.17 / 5.83 s) against the colocate_async pair's mean (steps 7–8: 0.15 / 10.57 s); its other
# phases moved by less than their step-to-step spread.
_ASYNC_GEN_S = {"sync": (6.17 + 5.83) / 2, "colocate_async": (0.15 + 10.57) / 2}
COLOCATE_ASYNC_GEN = _ASYNC_GEN_S["colocate_async"] / _ASYNC_GEN_S["sync"]


@dataclass(frozen=True)
class Prior:
    factor: dict[str, float]
    uncertainty: float
    source: str


# The log-prob passes' cost, split by the model's shape (fused kernels and gradient checkpointing act on different
# parts of it). Each pass is a transformer part (every matmul, the lm head's included: the fused kernels still run
# it) and, without fused kernels, a logits part: verl materialising and reducing the full-vocabulary logits, whose
# work grows with the lm head's (vocabulary × hidden per token) while the transformer's grows with all the matmul
# parameters; so its share is the lm head's share of the matmul work (`lm_head_share`), 0.28 at the 0.5B shape and
# 0.15 at 1.5B. Gradient checkpointing recomputes the transformer part's forward only (HF checkpoints the decoder
# layers; the log-prob head runs once). Measured on 1 × H200, 2026-12-01, the 0.5B shape, 256 prompts × 512 + 512:
# verl's quickstart → fused kernels with checkpointing kept (the h200-tuning recording) and with it off
# (tests/data h200_fused_logprob A → C), medians of steps 2–4 / 2–3 and 6–10 / 2–3.
_UPDATE_ACTOR_S = {"quickstart": 41.32, "fused, checkpointing kept": 5.305}  # h200-tuning
_UPDATE_ACTOR_AC_S = {"quickstart": 39.594, "fused, checkpointing off": 4.029}  # fused A → C
_OLD_LOG_PROB_RATIOS = (1.82 / 10.991, 1.86 / 10.362)  # h200-tuning, fused A → C
# The checkpointed transformer part over the plain one: fused with checkpointing kept over fused with it off, per
# unit of the quickstart update (1.26; the critic, all transformer, measured 3.30 → 2.64 s without it in A → C: 1.25).
RECOMPUTE = (_UPDATE_ACTOR_S["fused, checkpointing kept"] / _UPDATE_ACTOR_S["quickstart"]) / (
    _UPDATE_ACTOR_AC_S["fused, checkpointing off"] / _UPDATE_ACTOR_AC_S["quickstart"])
REFERENCE_SHAPE = memory.KNOWN_SHAPES["qwen2.5-0.5b"]


def lm_head_share(shape: memory.ModelShape) -> float:
    """The lm head's share of a token's matmul work (vocabulary × hidden over that plus every layer's parameters)."""
    head = shape.vocab_size * shape.hidden_size
    return head / (shape.num_hidden_layers * shape.layer_params + head)


# The logits part per unit of lm-head share, in units of the plain transformer part: from the update's quickstart
# (checkpointing on) = RECOMPUTE + logits, fused without checkpointing = 1; the forward passes' from 1 / ratio - 1.
LOGITS_PER_HEAD_SHARE = {
    "update_actor": (_UPDATE_ACTOR_AC_S["quickstart"] / _UPDATE_ACTOR_AC_S["fused, checkpointing off"] - RECOMPUTE)
    / lm_head_share(REFERENCE_SHAPE),
    "old_log_prob": sum(1 / r - 1 for r in _OLD_LOG_PROB_RATIOS) / len(_OLD_LOG_PROB_RATIOS)
    / lm_head_share(REFERENCE_SHAPE),
}
LOGITS_PER_HEAD_SHARE["ref"] = LOGITS_PER_HEAD_SHARE["old_log_prob"]
TRAINED_PASSES = ("update_actor", "update_critic")  # the passes gradient checkpointing recomputes in
# Without fused kernels, the update's logits part in fuller micro batches: 1 × H200, 2026-11-30 (0.5B shape, tests/data
# A → B): dynamic batching at 24 576 tokens (from 4 sequences a micro batch) and checkpointing off took update_actor
# 34.52 → 24.07 s, old_log_prob (8 sequences → 32 768 tokens) 9.47 → 9.29 s. Checkpointing off explains 0.93 s of
# the update's (its transformer part), so the logits part went ×0.68; the forward pass's did not move.
_UPDATE_ACTOR_AB_S = (34.52, 24.07)


def _dynamic_logits_factor() -> float:
    part = RECOMPUTE / (RECOMPUTE + LOGITS_PER_HEAD_SHARE["update_actor"] * lm_head_share(REFERENCE_SHAPE))
    before, after = _UPDATE_ACTOR_AB_S
    logits_before = before * (1 - part)
    return (after - before * part / RECOMPUTE) / logits_before


DYNAMIC_LOGITS = {"update_actor": _dynamic_logits_factor()}
# Within dynamic batching, a pass's time goes as (micro batches)^MICRO_BATCH_EXPONENT: 1 × H200, 2026-11-30 (0.5B
# shape, h200-proof segments 1 → 2, 64 prompts × 256 + 256): every budget 4 096 → 32 768 tokens took old_log_prob
# 1.49 → 1.22 s and values 0.45 → 0.25 s (5 → 1 micro batches), update_critic 1.48 → 0.59 s and update_actor
# 4.37 → 3.68 s (6 → 2): 7.79 → 5.74 s in all, which the exponent 0.25 reproduces. Fixed micro batches (verl's
# quickstart) showed no such cost (values in 33 or 4 micro batches: 1.61 / 1.51 s, 1.5B).
MICRO_BATCH_EXPONENT = 0.25


def micro_batches(knobs: Mapping[str, Any], p: memory.Pass, sequences: memory.Sequences) -> int:
    """How many micro batches pass `p` runs in a step with dynamic batching: each mini batch of an update (the whole
    step for a no-grad pass) split by its token budget."""
    real = sequences.prompt + sequences.response
    real = real if real > 0 else float(knobs["max_prompt_length"]) + float(knobs["max_response_length"])
    count = sequences.count if sequences.count > 0 else float(knobs["train_batch_size"])
    splits = max(1, int(knobs["train_batch_size"]) // int(knobs["ppo_mini_batch_size"])) if p.grad else 1
    return splits * max(1, math.ceil(count / splits * real / float(knobs[p.budget])))


def pass_cost(phase: str, shape: memory.ModelShape, fused: bool, checkpointing: bool, dynamic: bool) -> float:
    """A pass's time relative to its plain transformer part (fused kernels, no checkpointing: 1)."""
    body = RECOMPUTE if checkpointing and phase in TRAINED_PASSES else 1.0
    if fused:
        return body
    logits = LOGITS_PER_HEAD_SHARE.get(phase, 0.0) * lm_head_share(shape)
    return body + logits * (DYNAMIC_LOGITS.get(phase, 1.0) if dynamic else 1.0)


PRIORS: dict[str, Prior] = {
    "fused_kernels": Prior(
        {}, 0.25,
        "1 × H200, 2026-12-01 (0.5B shape, 256 prompts × 512 + 512): quickstart → fused kernels took update_actor "
        "41.3 → 5.3 s with gradient checkpointing kept and 39.6 → 4.0 s without, old_log_prob 11.0 → 1.8 s; the "
        "part they remove (the full-vocabulary logits) scales with the lm head's share of the model's matmul work "
        "(1.5B measured ×0.215 on the update and ×0.24 on old_log_prob where the 0.5B runs said ×0.13 and ×0.17)"),
    "gradient_checkpointing": Prior(
        {}, 0.15,
        "1 × H200, 2026-12-01 (0.5B shape): checkpointing recomputes the transformer layers' forward, not the "
        "logits; without it that part took ×0.79 (the fused update with it kept against off, the critic 3.30 → 2.64 s)"),
    "rollout_enforce_eager": Prior(
        {"gen": 0.6}, 0.40,
        "not measured on this workload: vLLM decoding a 0.5B model without CUDA graphs is bound by kernel "
        "launches; ×0.6 is a guess with a wide band"),
    "colocate_async": Prior(
        {"gen": COLOCATE_ASYNC_GEN}, 0.30,
        "1 × H200, 2026-12-02 (0.5B shape, 128 prompts × ≤ 256 + 768, fused kernels, dynamic batching): sync "
        "14.0 s a step (gen 6.0 s) → colocate_async alone 8.4 / 18.6 s (gen 0.15 / 10.6 s), a pair mean of 13.5 s: "
        f"generation ×{COLOCATE_ASYNC_GEN:.2f}, training unchanged. The rollout and training share the GPUs, so "
        "generation never overlaps training: the next batch decoding beside this one only fills the tail of a "
        "batch's rollout. 2026-11-30's traces (64 prompts × 256 + 256, on verl's 2 s replay poll) measured ×0.64 and "
        "×0.77, inside the band"),
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
        "change memory, barely time, except the actor update's full-vocabulary logits without fused kernels: "
        "dynamic batching's fuller micro batches took that part ×0.68 (quickstart → tuned, 0.5B shape); within "
        "dynamic batching a pass's time goes as its micro batches^0.25 (every budget 4 096 → 32 768: 7.8 → 5.7 s "
        "of the trainer's passes, h200-proof)"),
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

def segment_cost(m: Any) -> SegmentCost | None:
    """The cost of the segment an advisor `Measurements` holds (steps after warm-up, in-step samples): each timing's
    median, robust to a stray step; under colocate_async its mean, the plan running long and short steps in turn
    (their median is one or the other, and the autopilot judges the plan by the mean)."""
    steps = m.steps
    alternating = m.knobs.get("trainer_mode") == "colocate_async"
    step_s = memory_fit.typical(steps, "timing_s/step", alternating)
    if not step_s > 0:
        return None
    phase_s = {p: v for p in PHASES
               if not math.isnan(v := memory_fit.typical(steps, f"timing_s/{p}", alternating))}
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
        tokens=memory_fit.typical(steps, "perf/total_num_tokens"),
        trainer_peak_gb=max(reserved, default=float("nan")),
        gpu_peak_gb=gpu_peak, mem_total_gb=mem_total,
        observation=memory_fit.observation(m.segment_id, steps, m.knobs, padded=getattr(m, "padded", None),
                                           gpu_peak_gib=gpu_peak),
    )


# ------------------------------------------------------------------------------------------------ the model
def _waves(knobs: Mapping[str, Any]) -> int:
    return math.ceil(int(knobs["train_batch_size"]) / int(knobs["rollout_max_num_seqs"]))


def _split_factors(phases: tuple[str, ...], shape: memory.ModelShape, before: tuple[bool, bool, bool],
                   after: tuple[bool, bool, bool]) -> dict[str, float]:
    """Each pass's time after over before, (fused, checkpointing, dynamic batching) as given."""
    return {p: pass_cost(p, shape, *after) / pass_cost(p, shape, *before) for p in phases}


def _effects(before: Mapping[str, Any], after: Mapping[str, Any], shape: memory.ModelShape,
             sequences: tuple[memory.Sequences, memory.Sequences]) -> list[tuple[str, dict[str, float], float]]:
    """(group, phase factors, relative uncertainty) for each changed lever; fused kernels first (at the basis's
    checkpointing), then checkpointing (with the fused kernels as they will be)."""
    changed = {name for name in after if after[name] != before.get(name)}
    groups = {_GROUP_OF[name] for name in changed if name in _GROUP_OF}
    effects = []

    def flip(group: str, on: bool) -> None:
        prior = PRIORS[group]
        factors = {p: (f if on else 1 / f) for p, f in prior.factor.items()}
        effects.append((group, factors, prior.uncertainty))

    fused = (bool(before["fused_kernels"]), bool(after["fused_kernels"]))
    checkpointing = (bool(before["gradient_checkpointing"]), bool(after["gradient_checkpointing"]))
    dynamic = (bool(before["use_dynamic_bsz"]), bool(after["use_dynamic_bsz"]))
    if "fused_kernels" in groups:
        effects.append(("fused_kernels", _split_factors(
            ("update_actor", "old_log_prob", "ref"), shape, (fused[0], checkpointing[0], dynamic[0]),
            (fused[1], checkpointing[0], dynamic[0])), PRIORS["fused_kernels"].uncertainty))
    if "gradient_checkpointing" in groups:
        effects.append(("gradient_checkpointing", _split_factors(
            TRAINED_PASSES, shape, (fused[1], checkpointing[0], dynamic[0]), (fused[1], checkpointing[1], dynamic[0])),
            PRIORS["gradient_checkpointing"].uncertainty))
    if dynamic == (True, True) and "batching" in groups:
        effects.append(("batching", {p.phase: (micro_batches(after, p, sequences[1]) / micro_batches(
            before, p, sequences[0])) ** MICRO_BATCH_EXPONENT for p in memory.PASSES}, PRIORS["batching"].uncertainty))
        groups.discard("batching")
    if dynamic[0] != dynamic[1] and not fused[1]:
        effects.append(("batching", _split_factors(("update_actor",), shape, (False, checkpointing[1], dynamic[0]),
                                                   (False, checkpointing[1], dynamic[1])), PRIORS["batching"].uncertainty))
        groups.discard("batching")
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


def _sequences(cost: SegmentCost, after: Mapping[str, Any]) -> tuple[memory.Sequences, memory.Sequences]:
    """The basis segment's measured sequences, and the same under the plan `after` (unknown: the plan's limits)."""
    if cost.observation is None:
        return memory.Sequences(), memory.Sequences()
    measured = cost.observation.sequences
    return measured, memory_fit.scaled_sequences(measured, cost.knobs, after)


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
    memory_model = memory_model or memory_model_for(cost)
    changed = [name for name in after if after[name] != before.get(name)]
    phase = dict(cost.phase_s)
    absolute: dict[str, float] = {}  # variance each moved phase adds (seconds²)
    sources: dict[str, str] = {}
    for group, factors, uncertainty in _effects(before, after, memory_model.shape, _sequences(cost, after)):
        for p, factor in factors.items():
            if p in phase:
                phase[p] *= factor
        moved = factors or dict.fromkeys(phase, 1.0)
        for p in moved:
            if p in phase:
                absolute[p] = absolute.get(p, 0.0) + (phase[p] * uncertainty) ** 2
        sources[group] = PRIORS[group].source if group in PRIORS else _SOURCES[group]
    unmodelled = tuple(name for name in changed if name not in _GROUP_OF)
    step = sum(phase.values()) + cost.other_s
    # The basis segment's own step-to-step spread, generation's move to another segment, the moved phases' prior
    # uncertainties, unmodelled knobs.
    variance = (step * cost.step_spread) ** 2 + sum(absolute.values()) + \
        (GEN_BETWEEN_SEGMENTS * phase.get("gen", 0.0)) ** 2 * bool(changed) + \
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
