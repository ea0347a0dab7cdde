"""What every advice rule reads and writes: the thresholds (each with the reason for its value), a `Finding`, and
`Measurements` — one segment's steps without its warm-up step, the GPU samples inside those steps, and what the
session's history adds (workbench.advice.record: the model's memory, crashes, the plan in force).

The first step of a segment carries one-off start-up work (allocator growth, CUDA graph capture, first weight
sync) that later steps do not repeat: on the H200 the first step took 30.4 s where the next three took
11.6–15.5 s. A rule stays silent when what it needs was not measured (a missing or all-NaN column, fewer than two
steps after the first).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, Mapping

import numpy as np
import pandas as pd

from .. import predict as what_if
from ..knobs import knobs_in_group
from ..knobs import TOKEN_BUDGET_KNOBS as BUDGET_KNOBS
from ..store import SAMPLE_COLUMNS
from ..telemetry.balance import THRESHOLDS as BALANCE_THRESHOLDS
from ..telemetry.balance import balance_frame

SEVERITIES = ("high", "medium", "low")
GIB_PER_MIB = 1 / 1024
OFFLOAD_KNOBS = knobs_in_group("offload")
TOKEN_BUDGET_STEP = 1024
# The budgets the H200 fused-kernel run used (H200, 2026-12-01, 0.5B shape): 13–15 % actor MFU.
FUSED_BUDGETS = {"actor_token_budget": 16384, "logprob_token_budget": 32768, "ref_token_budget": 32768,
                 "critic_token_budget": 32768}
FUSED_EVIDENCE = ("on one H200 (2026-12-01, a 0.5B-shaped Qwen2, 256 prompts × 512 + 512 tokens) fused kernels "
                  "with dynamic batching at 16 384 / 32 768 tokens and no gradient checkpointing took update_actor "
                  "38.3–40.9 → 3.9–4.6 s, old_log_prob 10.1–10.7 → 1.7–2.2 s and the step 62.9–66.7 → 18.3–21.4 s")


@dataclass(frozen=True)
class Threshold:
    value: float
    why: str


THRESHOLDS: dict[str, Threshold] = {
    "min_steps": Threshold(
        2, "Steps after the warm-up step needed before any rule speaks: one step is an anecdote, and the H200 "
           "steps 2–4 still varied by 34 % (11.6–15.5 s)."),
    "min_samples": Threshold(
        10, "GPU samples inside the measured steps needed before a sample-based rule speaks: two seconds at 5 Hz, "
            "less than one phase of a step."),
    "rollout_share": Threshold(
        0.40, "Generation is one of six phases of a sync PPO step; at 40 % of the step it is the largest by far, and "
              "overlapping or speeding it up wins the most (H200 reference run: 48 %)."),
    "critic_to_actor": Threshold(
        0.25, "Critic time (values + update_critic) over actor-update time. At a quarter, the critic's work fills "
              "one GPU beside four actor GPUs (the seeds' 4:1 layout); above it the critic is worth its own GPU or "
              "a cheaper LoRA update."),
    "actor_update_share": Threshold(
        0.50, "update_actor above half the step leaves every other phase together smaller than it; verl's "
              "quickstart settings spent 60 % of the step there on the H200."),
    "small_actor_budget": Threshold(
        16384, "Tokens per GPU per actor micro batch below verl's own default ppo_max_token_len_per_gpu (16 384) "
               "run the update as many small kernels; the H200 gain (update_actor 29.9–35.7 s → 23.5–26.1 s) came "
               "at 24 576."),
    "gpu_idle_share": Threshold(
        0.15, "Share of in-step samples with 0 % utilization. Phase changes and weight sync cost a few percent; at "
              "15 % one second in seven is paid for and unused (H200: 11 % quickstart, 17 % reference run)."),
    "spare_gpu_idle_share": Threshold(
        0.90, "Share of in-step samples at 0 % utilization for a GPU outside the plan to count as spare: another "
              "job's busy GPU is no spare, and NVML reads a few non-zero blips even on an unused GPU."),
    "util_spread_points": Threshold(
        BALANCE_THRESHOLDS.util_spread_points,
        "Points of mean utilization between the busiest and the idlest GPU (the telemetry balance verdict's "
        "value): data-parallel ranks doing equal work sit within a few points of each other."),
    "memory_headroom_peak": Threshold(
        0.50, "The training phases' peak / GPU memory below which token budgets are raised: half the memory unused "
              "while the budgets decide how much work each micro batch gets. The peak is the trainer's max reserved "
              "memory (verl's perf/max_memory_reserved_gb), not NVML's: on the H200 generation set the GPU's peak "
              "(vLLM's 0.4 share: 51–52 % with the fused plans of 2026-12-01, the trainer at 40–49 %), and no "
              "budget touches it."),
    "memory_room_peak": Threshold(
        0.60, "Peak GPU memory / total below which one memory-for-speed trade (gradient checkpointing off, offload "
              "off) is proposed: on the H200 the quickstart → tuned change raised the peak from 53 % to 71 %, so "
              "from 60 % such a step stays under the OOM line."),
    "memory_target_peak": Threshold(
        0.80, "Peak share a raised budget aims at: budgets grow by target / peak, as if all memory grew with the "
              "budget (weights and optimizer don't, so the real peak lands lower; the rule fires again if room "
              "is left)."),
    "max_budget_scale": Threshold(
        4.0, "Most a budget grows in one change: activation memory is not exactly linear in tokens, so large "
             "jumps are taken in measured steps."),
    "oom_peak": Threshold(
        BALANCE_THRESHOLDS.memory_near_full,
        "Peak GPU memory (NVML) or PyTorch's max reserved memory / total above which the next longer batch may "
        "not fit (the telemetry balance verdict's value)."),
    "weight_sync_share": Threshold(
        0.10, "timing_s/update_weights share of the step: an on-GPU copy from the trainer to the rollout engine "
              "took 1–2 % on the H200; at 10 % the sync itself is a cost worth removing."),
    "pcie_near_saturation_mb_s": Threshold(
        BALANCE_THRESHOLDS.pcie_near_saturation_mb_s,
        "PCIe MB/s in one direction at the 90th percentile of in-step samples (the telemetry balance verdict's "
        "value: 80 % of a Gen5 x16 link). PCIe is full duplex, so each direction is held against its own limit."),
    "logprob_loop_mfu": Threshold(
        0.05, "Actor MFU (verl's perf/mfu/actor) below which the actor's FLOPs are not what limits it: verl's "
              "quickstart settings ran at 1.3–1.8 % on the H200, the same plan with fused log-prob kernels at "
              "13–15 %; a 0.5B model's matmuls alone would allow tens of percent."),
    "verl_poll_s": Threshold(
        2.0, "verl 0.9.1's V1 ReplayBuffer poll_interval (replay_buffer.py): generation is seen finished only on "
             "this grid."),
    "poll_grid_tolerance_s": Threshold(
        0.25, "How close to a multiple of the 2 s poll every measured timing_s/gen must end to count as on the grid "
              "(H200: 4.10, 6.09, 8.13, 10.16, 12.09, 16.15 s, all within 0.2 s); by chance two continuous values "
              "land there 1.6 % of the time, three 0.2 %."),
    "alternation_ratio": Threshold(
        1.4, "Long over short step under colocate_async above which the steps alternate by design, not by noise: "
             "the H200's sync steps varied by up to 1.34× (11.6–15.5 s), its colocate_async ones by 1.8–2.6× "
             "(2026-11-30: 16.0 / 6.8 / 12.9 / 6.1 s; 2026-12-01: 17.8 / 9.7 s)."),
    "min_predicted_gain": Threshold(
        0.10, "Share of the step a change must be predicted to save for a rule to offer it on its predicted gain "
              "alone (once training is fast, generation and the critic remain at a quarter of the step each, below "
              "their share thresholds): below a tenth, two measured steps can't tell the gain from generation's "
              "move between segments (19 % of generation on the H200, a quarter of a fast step)."),
    "kv_cache_margin": Threshold(
        2.0, "The rollout engine's KV cache (workbench.memory.kv_cache_tokens) over what a step's sequences need at "
             "their longest, below which more rollout memory is proposed: the estimate came within 3 % of the size "
             "vLLM logged on the H200 (4.69 M tokens at 0.4, 0.5B shape), and twice leaves room for what it does "
             "not model at other sizes (CUDA graphs, non-torch memory). Above it vLLM already holds every sequence "
             "at once (the 0.5B workload of issue 16: 128 × 1 024 tokens, 3 % of its cache)."),
    "rollout_gpu_memory_max": Threshold(
        0.90, "Highest rollout_gpu_memory proposed: vLLM's share of memory, leaving 10 % for the CUDA context "
              "and fragmentation (the knob allows 0.95)."),
}


def limit(name: str) -> float:
    """A threshold's value."""
    return THRESHOLDS[name].value


@dataclass(frozen=True)
class Finding:
    """One bottleneck the measurements show and the knob change that addresses it (empty when no knob does)."""

    rule: str
    title: str
    evidence: dict[str, Any]
    evidence_text: str
    change: dict[str, Any]
    expected: str
    severity: str


FINDING_COLUMNS = tuple(f.name for f in fields(Finding))


def value_range(values: pd.Series, spec: str, unit: str = "") -> str:
    """"low–high unit" in `spec`, or one value where both ends read the same ("2.0%", never "2.0%–2.0%")."""
    low, high = format(values.min(), spec), format(values.max(), spec)
    return f"{low}{unit}" if low == high else f"{low}–{high}{unit}"


@dataclass(frozen=True)
class Measurements:
    """One segment's steps after its warm-up step, the samples of the plan's GPUs inside those steps, and the
    session's record (None when only this segment is known)."""

    segment_id: Any
    warmup_step: int
    steps: pd.DataFrame
    samples: pd.DataFrame
    spare_gpus: tuple[int, ...]
    procs: pd.DataFrame | None
    knobs: Mapping[str, Any]
    record: Any = None  # advice.record.SessionRecord (which reads the samples through this module)

    @property
    def padded(self) -> bool | None:
        """Whether sequences were held padded (the runner said flash-attn was missing); None: as the plan says."""
        return self.record.padded if self.record is not None else None

    @property
    def scope(self) -> dict[str, Any]:
        segment = self.segment_id.item() if hasattr(self.segment_id, "item") else self.segment_id  # numpy → JSON
        return {"segment_id": segment, "steps": [int(s) for s in self.steps["step"]],
                "warmup_step_excluded": self.warmup_step}

    @property
    def scope_text(self) -> str:
        steps = self.steps["step"]
        return f"steps {steps.min()}–{steps.max()}; step {self.warmup_step} left out as warm-up"

    def seconds(self, phase: str) -> pd.Series:
        column = f"timing_s/{phase}"
        if column not in self.steps:
            return pd.Series(dtype=float)
        return pd.to_numeric(self.steps[column], errors="coerce").dropna()

    def share(self, phase: str) -> float:
        """Seconds in `phase` over step seconds, summed over the steps that report both (NaN if none do)."""
        both = pd.concat([self.seconds(phase), self.seconds("step")], axis=1, join="inner").dropna()
        if len(both) < limit("min_steps") or both.iloc[:, 1].sum() <= 0:
            return float("nan")
        return float(both.iloc[:, 0].sum() / both.iloc[:, 1].sum())

    def metric(self, column: str) -> pd.Series:
        """A step metric of the measured steps, NaNs dropped (empty when verl did not log it)."""
        if column not in self.steps:
            return pd.Series(dtype=float)
        return pd.to_numeric(self.steps[column], errors="coerce").dropna()

    @functools.cached_property
    def cost(self) -> what_if.SegmentCost | None:
        """The segment as the what-if model's calibration."""
        return what_if.segment_cost(self)

    def predicted(self, change: Mapping[str, Any]) -> what_if.Prediction | None:
        """This segment's plan with `change`, predicted by workbench.predict with the session's memory model (None
        if the steps lack timings)."""
        if self.cost is None:
            return None
        model = self.record.memory_model if self.record is not None else None
        return what_if.predict(self.cost, {**self.knobs, **change}, model)

    def seconds_text(self, phase: str) -> str:
        return value_range(self.seconds(phase), ".1f", " s")

    @functools.cached_property
    def per_gpu(self) -> pd.DataFrame:
        """telemetry.balance's per-GPU summary of the in-step samples."""
        return balance_frame(self.samples) if len(self.samples) else pd.DataFrame()

    @property
    def util_samples(self) -> pd.Series:
        return self.samples.get("util", pd.Series(dtype=float)).dropna()

    @functools.cached_property
    def peak_memory_share(self) -> float:
        """Highest peak mem_used / mem_total of any plan GPU in the measured steps (NaN if unknown)."""
        if self.per_gpu.empty:
            return float("nan")
        shares = self.per_gpu["mem_used_share"].dropna()
        return float(shares.max()) if len(shares) else float("nan")

    @functools.cached_property
    def trainer_reserved_gib(self) -> float:
        """The trainer's max reserved memory in the measured steps, its roles' largest (verl's
        perf/max_memory_reserved_gb; NaN where verl logged none)."""
        reserved = [self.metric(f"{role}/perf/max_memory_reserved_gb").max() for role in ("actor", "critic")]
        return float(np.nanmax(reserved)) if not np.isnan(reserved).all() else float("nan")

    @property
    def trainer_peak_share(self) -> float:
        """The trainer's max reserved memory over GPU memory; the NVML peak where either is unknown."""
        total_gib = float(self.per_gpu["mem_total"].max()) * GIB_PER_MIB if not self.per_gpu.empty else float("nan")
        if not total_gib > 0 or np.isnan(self.trainer_reserved_gib):
            return self.peak_memory_share
        return self.trainer_reserved_gib / total_gib

    @property
    def peak_memory_text(self) -> str:
        if np.isnan(self.peak_memory_share):
            return "GPU memory not sampled"
        row = self.per_gpu.loc[self.per_gpu["mem_used_share"].idxmax()]
        return (f"peak GPU memory {row['mem_used_max'] * GIB_PER_MIB:.1f} of {row['mem_total'] * GIB_PER_MIB:.1f} "
                f"GiB ({self.peak_memory_share:.0%})")

    def budget(self, knob: str) -> int:
        """The token budget in force in the measured steps (hot changes included), else the plan's value."""
        column = f"workbench/budget/{knob}"
        if column in self.steps:
            recorded = pd.to_numeric(self.steps[column], errors="coerce").dropna()
            if len(recorded):
                return int(recorded.iloc[-1])
        return int(self.knobs[knob])

    @property
    def longest_sequence(self) -> int:
        return int(self.knobs["max_prompt_length"]) + int(self.knobs["max_response_length"])

    def tokens_per_micro_batch(self, budget_knob: str, micro_batch_knob: str) -> int:
        """Tokens a micro batch may hold as the plan stands: the budget, or sequences × longest sequence."""
        micro = self.knobs.get(micro_batch_knob)
        if self.knobs["use_dynamic_bsz"] or micro is None:
            return self.budget(budget_knob)
        return int(micro) * self.longest_sequence

    @property
    def budget_scale(self) -> float:
        """How much budgets may grow from the memory headroom (1 when memory was not measured)."""
        peak = self.peak_memory_share
        if not peak > 0:
            return 1.0
        return float(np.clip(limit("memory_target_peak") / peak, 1.0, limit("max_budget_scale")))

    def headroom_budgets(self, target_share: float) -> dict[str, int]:
        """The token budgets grown as far as the memory model lets them (sized from the memory per token it
        calibrated on this session), the peak with its band staying under `target_share` of GPU memory; the
        budgets in force when nothing grows or memory was not measured."""
        current = {knob: self.budget(knob) for knob in BUDGET_KNOBS}
        low, high = 1.0, limit("max_budget_scale")
        if self.cost is None or not self.cost.mem_total_gb > 0:
            return current

        def fits(scale: float) -> bool:
            p = self.predicted({k: self.scaled_budget(v, scale) for k, v in current.items()})
            return p is not None and p.memory is not None and \
                p.memory.upper_gib < target_share * p.mem_total_gb
        if not fits(low):
            return current
        for _ in range(12):  # bisection to well under one 1024-token step
            middle = (low + high) / 2
            low, high = (middle, high) if fits(middle) else (low, middle)
        return {k: max(v, self.scaled_budget(v, low)) for k, v in current.items()}

    def scaled_budget(self, tokens: int, scale: float) -> int:
        """`tokens` × scale rounded down to a multiple of 1024, never below one longest sequence."""
        return max(self.longest_sequence, int(tokens * scale) // TOKEN_BUDGET_STEP * TOKEN_BUDGET_STEP)


def loop_bound(m: Measurements) -> bool:
    """verl's log-prob pass is the Python loop (fused kernels off) and the actor runs far below its FLOPs: training
    is not yet fast, and what it costs dwarfs what other levers could gain."""
    mfu = m.metric("perf/mfu/actor")
    return not m.knobs["fused_kernels"] and len(mfu) >= limit("min_steps") and \
        float(mfu.median()) < limit("logprob_loop_mfu")


def training_is_fast(m: Measurements) -> bool:
    """Evidence that training no longer dominates: fused log-prob kernels on, or the actor's MFU measured at or above
    logprob_loop_mfu."""
    mfu = m.metric("perf/mfu/actor")
    return bool(m.knobs["fused_kernels"]) or (len(mfu) >= limit("min_steps") and
                                              float(mfu.median()) >= limit("logprob_loop_mfu"))


def predicted_gain(m: Measurements, change: Mapping[str, Any]) -> what_if.Prediction | None:
    """The what-if prediction of `change` where it saves at least min_predicted_gain of the measured step (None
    where it saves less, or nothing predicts it)."""
    prediction = m.predicted(change) if change else None
    if prediction is None or not prediction.measured_step_s > 0:
        return None
    gain = 1 - prediction.step_s / prediction.measured_step_s
    return prediction if gain >= limit("min_predicted_gain") else None


def gain_evidence(prediction: what_if.Prediction | None) -> dict[str, Any]:
    """A prediction as evidence: the step it predicts, its band and what it rests on."""
    if prediction is None:
        return {}
    low, high = prediction.step_range_s
    return {"predicted_step_s": prediction.step_s, "predicted_band_s": [low, high],
            "predicted_gain_s": prediction.measured_step_s - prediction.step_s,
            "predicted_sources": dict(prediction.sources)}


def changes(m: Measurements, **proposed: Any) -> dict[str, Any]:
    """The proposed knob values that differ from the plan's (a no-op is no proposal)."""
    return {knob: value for knob, value in proposed.items() if m.knobs.get(knob) != value}


def finding(m: Measurements, *, rule: str, title: str, severity: str, evidence: dict[str, Any], text: str,
             change: dict[str, Any], expected: str) -> Finding:
    return Finding(rule=rule, title=title, evidence={**evidence, **m.scope},
                   evidence_text=f"{text} ({m.scope_text}).", change=change, expected=expected, severity=severity)


def no_knob(reason: str) -> str:
    return f"No knob change proposed: {reason}"



# ---------------------------------------------------------------------------------------------------------- entry
def measurements(steps: pd.DataFrame, samples: pd.DataFrame, knobs: Mapping[str, Any], *, segment_id: Any = None,
                 procs: pd.DataFrame | None = None, record: Any = None) -> Measurements | None:
    """What the rules read: the segment (newest if None) minus its first step; None if too few steps are left."""
    if steps is None or steps.empty:
        return None
    if segment_id is None:
        segment_id = steps["segment_id"].max()
    segment = steps[steps["segment_id"] == segment_id].sort_values("step")
    if segment.empty:
        return None
    warmup_step = int(segment["step"].iloc[0])
    measured = segment.iloc[1:]
    if len(measured) < limit("min_steps"):
        return None
    in_steps = inside_steps(samples, measured)
    plan_gpus = in_steps["gpu"].isin(set(knobs["gpus"]))
    return Measurements(segment_id=segment_id, warmup_step=warmup_step, steps=measured.reset_index(drop=True),
                        samples=in_steps[plan_gpus], spare_gpus=_spare_gpus(in_steps[~plan_gpus]), procs=procs,
                        knobs=dict(knobs), record=record)


def segment_costs(steps: pd.DataFrame, samples: pd.DataFrame,
                  knobs_by_segment: Mapping[Any, Mapping[str, Any]]) -> list[what_if.SegmentCost]:
    """The what-if model's calibration: every segment with enough measured steps, in the order given."""
    costs = []
    for segment_id, knobs in knobs_by_segment.items():
        m = measurements(steps, samples, knobs, segment_id=segment_id)
        if m is not None and (cost := m.cost) is not None:
            costs.append(cost)
    return costs


def _spare_gpus(outside_plan: pd.DataFrame) -> tuple[int, ...]:
    """GPUs of this machine outside the plan that sat idle through the measured steps (another job's busy GPU
    is no spare). Plan GPU indices are per node, so on several nodes no index names a spare GPU unambiguously."""
    if outside_plan.empty or outside_plan["node"].nunique() > 1:
        return ()
    per_gpu = balance_frame(outside_plan)
    idle = per_gpu[per_gpu["idle_share"] >= limit("spare_gpu_idle_share")]
    return tuple(int(gpu) for gpu in idle["gpu"])


def inside_steps(samples: pd.DataFrame | None, steps: pd.DataFrame) -> pd.DataFrame:
    """Samples inside any step window [t - timing_s/step, t], with node "" where the sampler named none
    (balance_frame groups by node, and a missing node would drop the row)."""
    if samples is None or samples.empty or "timing_s/step" not in steps:
        return pd.DataFrame(columns=list(SAMPLE_COLUMNS))
    t = samples["t"].to_numpy()
    inside = np.zeros(len(samples), dtype=bool)
    for end, length in zip(steps["t"], pd.to_numeric(steps["timing_s/step"], errors="coerce")):
        inside |= (t >= end - length) & (t <= end)  # NaN lengths compare False: that step has no window
    window = samples[inside]
    node = window["node"].fillna("") if "node" in window else ""
    return window.assign(node=node)


def prediction_text(prediction: what_if.Prediction | None) -> str:
    if prediction is None:
        return ""
    sources = "; ".join(prediction.sources.values())
    return f" Predicted for this segment: {prediction.text} (from: {sources})."
