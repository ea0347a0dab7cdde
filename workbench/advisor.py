"""The advisor: names the bottleneck in a segment's measurements and offers the knob change that fixes it.

Every rule reads the same `Measurements`: one segment's steps (verl's `timing_s/*` metrics) without the segment's
first step, and the GPU samples taken inside the remaining steps' windows `[t - timing_s/step, t]`. The first step
of a segment carries one-off start-up work (allocator growth, CUDA graph capture, first weight sync) that later
steps do not repeat: on the H200 the first step took 30.4 s where the next three took 11.6–15.5 s. A rule stays
silent when what it needs was not measured (a missing or all-NaN column, fewer than two steps after the first).

Thresholds live in THRESHOLDS, each with the reason for its value; the rules are listed in RULES. The measured facts
the proposals quote come from real verl 0.9.1 runs on one H200 (2026-11-30 and 2026-12-01, tests/data/README.md).
Some rules read verl's cost model rather than shares of the step (actor MFU against what the FLOPs allow, memory
per token) and quote the gain workbench.predict expects for the proposed plan, with the sources of its numbers.
Knobs that change the algorithm (knobs.ALGORITHM_KNOBS) are never proposed.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from . import predict as what_if
from .knobs import MICRO_BATCH_KNOBS, knobs_in_group
from .knobs import TOKEN_BUDGET_KNOBS as BUDGET_KNOBS
from .control import REPLAY_POLL_S
from .store import SAMPLE_COLUMNS
from .telemetry.balance import THRESHOLDS as BALANCE_THRESHOLDS
from .telemetry.balance import balance_frame


SEVERITIES = ("high", "medium", "low")
GIB_PER_MIB = 1 / 1024
OFFLOAD_KNOBS = knobs_in_group("offload")
TOKEN_BUDGET_STEP = 1024
# The budgets the H200 fused-kernel run used (tests/data/h200_fused_logprob_2026-12-01, C_fused): 13–15 % actor MFU.
FUSED_BUDGETS = {"actor_token_budget": 16384, "logprob_token_budget": 32768, "ref_token_budget": 32768,
                 "critic_token_budget": 32768}
FUSED_EVIDENCE = ("on the H200 (tests/data/h200_fused_logprob_2026-12-01, same model and workload) fused kernels "
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
        0.50, "Peak GPU memory / total below which token budgets are raised: half the memory unused while the "
              "budget decides how much work each micro batch gets."),
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
    "rollout_gpu_memory_max": Threshold(
        0.90, "Highest rollout_gpu_memory proposed: vLLM's share of memory, leaving 10 % for the CUDA context "
              "and fragmentation (the knob allows 0.95)."),
}


def _limit(name: str) -> float:
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


@dataclass(frozen=True)
class Measurements:
    """One segment's steps after its warm-up step, and the samples of the plan's GPUs inside those steps."""

    segment_id: Any
    warmup_step: int
    steps: pd.DataFrame
    samples: pd.DataFrame
    spare_gpus: tuple[int, ...]
    procs: pd.DataFrame | None
    knobs: Mapping[str, Any]

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
        if len(both) < _limit("min_steps") or both.iloc[:, 1].sum() <= 0:
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
        """This segment's plan with `change`, predicted by workbench.predict (None if the steps lack timings)."""
        if self.cost is None:
            return None
        return what_if.predict(self.cost, {**self.knobs, **change})

    def seconds_text(self, phase: str) -> str:
        seconds = self.seconds(phase)
        return f"{seconds.min():.1f}–{seconds.max():.1f} s"

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
        return float(np.clip(_limit("memory_target_peak") / peak, 1.0, _limit("max_budget_scale")))

    @property
    def memory_budget_scale(self) -> float:
        """How much budgets may grow, sized from the trainer's measured memory per token (workbench.predict's
        memory model) where verl logged it, else from the NVML peak alone (`budget_scale`)."""
        if self.cost is None or np.isnan(self.cost.trainer_peak_gb) or np.isnan(self.cost.mem_total_gb):
            return self.budget_scale
        return what_if.budget_scale_for_memory(self.cost, _limit("memory_target_peak"), _limit("max_budget_scale"))

    def scaled_budget(self, tokens: int, scale: float) -> int:
        """`tokens` × scale rounded down to a multiple of 1024, never below one longest sequence."""
        return max(self.longest_sequence, int(tokens * scale) // TOKEN_BUDGET_STEP * TOKEN_BUDGET_STEP)


def _changes(m: Measurements, **proposed: Any) -> dict[str, Any]:
    """The proposed knob values that differ from the plan's (a no-op is no proposal)."""
    return {knob: value for knob, value in proposed.items() if m.knobs.get(knob) != value}


def _finding(m: Measurements, *, rule: str, title: str, severity: str, evidence: dict[str, Any], text: str,
             change: dict[str, Any], expected: str) -> Finding:
    return Finding(rule=rule, title=title, evidence={**evidence, **m.scope},
                   evidence_text=f"{text} ({m.scope_text}).", change=change, expected=expected, severity=severity)


def _no_knob(reason: str) -> str:
    return f"No knob change proposed: {reason}"


# ---------------------------------------------------------------------------------------------------------- rules
def rollout_bound(m: Measurements) -> Finding | None:
    share = m.share("gen")
    if not share >= _limit("rollout_share"):
        return None
    change, effects = {}, []
    if m.knobs["trainer_mode"] == "sync":
        change["trainer_mode"] = "colocate_async"
        effects.append("generation overlaps training on the same GPUs (H200: 8.1 s a step with colocate_async "
                       "against 11.6–15.5 s sync on the same workload)")
    memory = float(m.knobs["rollout_gpu_memory"])
    if m.peak_memory_share < _limit("memory_target_peak"):
        room = _limit("memory_target_peak") - m.peak_memory_share
        raised = min(_limit("rollout_gpu_memory_max"), np.floor((memory + room) * 20) / 20)  # steps of 0.05
        if raised > memory:
            change["rollout_gpu_memory"] = round(float(raised), 2)
            effects.append(f"a KV cache {raised / memory:.1f}× larger keeps more sequences decoding at once")
    if m.knobs["rollout_enforce_eager"]:
        change["rollout_enforce_eager"] = False
        effects.append("vLLM captures CUDA graphs, so each decode step is one graph launch instead of hundreds of "
                       "kernel launches")
    sequences = int(m.knobs["train_batch_size"])
    if int(m.knobs["rollout_max_num_seqs"]) < sequences:
        change["rollout_max_num_seqs"] = sequences
        effects.append(f"all {sequences} prompts of a step decode at once instead of in waves of "
                       f"{m.knobs['rollout_max_num_seqs']}")
    batch_prompt_tokens = int(m.knobs["train_batch_size"]) * int(m.knobs["max_prompt_length"])
    batched = m.knobs["rollout_max_batched_tokens"]
    if batched is not None and batched < batch_prompt_tokens:
        change["rollout_max_batched_tokens"] = min(batch_prompt_tokens, 2 * int(batched))
        effects.append("the batch's prompts prefill in fewer engine passes")
    return _finding(
        m, rule="rollout-bound", title="Generation (rollout) dominates the step", severity="medium",
        evidence={"gen_share": share, "gen_s": m.seconds("gen").tolist(), "step_s": m.seconds("step").tolist(),
                  "peak_memory_share": m.peak_memory_share},
        text=f"Generation took {share:.0%} of step time ({m.seconds_text('gen')} of {m.seconds_text('step')} steps)",
        change=change,
        expected=("Shorter steps: " + "; ".join(effects) + "." + _prediction_text(m.predicted(change)))
        if effects else _no_knob(
            "the trainer already overlaps generation and the rollout engine has no memory left to grow into."),
    )


def critic_heavy(m: Measurements) -> Finding | None:
    actor = m.seconds("update_actor")
    critic = pd.concat([m.seconds("values"), m.seconds("update_critic")], axis=1).dropna(how="all")
    if len(actor) < _limit("min_steps") or critic.empty or actor.sum() <= 0:
        return None
    critic_s, actor_s = float(critic.sum().sum()), float(actor.sum())
    ratio = critic_s / actor_s
    if ratio < _limit("critic_to_actor"):
        return None
    if m.spare_gpus and m.knobs["critic_gpus"] == 0:
        spare = m.spare_gpus[0]
        change = {"gpus": [*m.knobs["gpus"], spare], "critic_gpus": 1}
        expected = (f"The critic moves to idle GPU {spare} and its work leaves the actor GPUs: about "
                    f"{critic_s / len(critic):.1f} s less on them per step in sync mode.")
    else:
        change = _changes(m, critic_lora_rank=8)
        prediction = m.predicted(change) if change else None
        if prediction is not None and prediction.step_s >= prediction.measured_step_s:
            # Measured on the H200: a LoRA critic saves memory but its update is slower on a small model.
            change, expected = {}, _no_knob(
                f"a LoRA critic is predicted to make the step slower, not faster ({prediction.text}; "
                f"{what_if.PRIORS['critic_lora'].source}), and no spare GPU was sampled for the critic.")
        else:
            expected = ("A rank-8 LoRA critic trains a small fraction of the value model's parameters, so its "
                        "gradients and optimizer step shrink and update_critic gets shorter." if change else _no_knob(
                            "the critic already trains LoRA adapters and no spare GPU was sampled."))
    return _finding(
        m, rule="critic-heavy", title="The critic costs a large share of the actor's training time",
        severity="medium",
        evidence={"critic_s": critic_s, "update_actor_s": actor_s, "critic_to_actor": ratio,
                  "spare_gpus": list(m.spare_gpus)},
        text=f"values + update_critic took {critic_s:.1f} s against {actor_s:.1f} s of update_actor, "
             f"a ratio of {ratio:.2f}",
        change=change, expected=expected,
    )


def actor_update_bound(m: Measurements) -> Finding | None:
    share = m.share("update_actor")
    if not share > _limit("actor_update_share") or _loop_bound(m):
        return None  # a loop-bound actor gains little from batching: logprob-loop names the lever
    dynamic = bool(m.knobs["use_dynamic_bsz"])
    tokens = m.tokens_per_micro_batch("actor_token_budget", "actor_micro_batch")
    if dynamic and tokens >= _limit("small_actor_budget"):
        return None
    scale = m.budget_scale
    budget = m.scaled_budget(tokens, scale)
    change = _changes(m, use_dynamic_bsz=True, actor_token_budget=budget)
    room = m.peak_memory_share < _limit("memory_room_peak")
    if room and m.knobs["gradient_checkpointing"]:
        change["gradient_checkpointing"] = False
    batching = "dynamic batching on" if dynamic else \
        f"dynamic batching off ({m.knobs['actor_micro_batch']} sequences × {m.longest_sequence} tokens)"
    others = "" if dynamic else (
        "; use_dynamic_bsz also packs log-prob, ref and critic micro batches by their budgets ("
        + ", ".join(f"{knob} {m.budget(knob)}" for knob in BUDGET_KNOBS[1:]) + ")")
    return _finding(
        m, rule="actor-update-bound", title="The actor update dominates the step", severity="medium",
        evidence={"update_actor_share": share, "update_actor_s": m.seconds("update_actor").tolist(),
                  "use_dynamic_bsz": dynamic, "actor_tokens_per_micro_batch": tokens,
                  "peak_memory_share": m.peak_memory_share, "budget_scale": scale},
        text=f"update_actor took {share:.0%} of step time ({m.seconds_text('update_actor')}) with {batching}, "
             f"{tokens} tokens per micro batch; {m.peak_memory_text}",
        change=change,
        expected=("Fewer, fuller actor micro batches" + (" without recomputing activations" if room else "")
                  + f": on the H200, dynamic batching at 24 576 tokens/GPU without gradient checkpointing cut "
                  f"update_actor from 29.9–35.7 s to 23.5–26.1 s{others}." if change else _no_knob(
                      f"the budget can't grow without memory headroom ({m.peak_memory_text}).")),
    )


def gpu_idle(m: Measurements) -> Finding | None:
    util = m.util_samples
    if len(util) < _limit("min_samples"):
        return None
    idle = float((util == 0).mean())
    if idle <= _limit("gpu_idle_share"):
        return None
    if m.knobs["trainer_mode"] == "sync":
        change = {"trainer_mode": "colocate_async"}
        expected = ("Generation overlaps training and fills the gaps between phases (H200: 8.1 s a step with "
                    "colocate_async against 11.6–15.5 s sync).")
    elif m.knobs["trainer_mode"] == "separate_async" and not m.knobs["hybrid_switch"]:
        change = {"hybrid_switch": True}
        expected = "Idle trainer GPUs are lent to rollout between updates, so they generate instead of waiting."
    elif not m.knobs["use_dynamic_bsz"]:
        change = {"use_dynamic_bsz": True}
        expected = "Micro batches packed by token budget run longer kernels with fewer gaps between them."
    else:
        change, expected = {}, _no_knob("the run already overlaps phases and packs micro batches by token budget; "
                                        "the timeline shows which phase leaves the GPU waiting.")
    return _finding(
        m, rule="gpu-idle", title="GPUs sit idle during steps", severity="medium",
        evidence={"idle_share": idle, "samples": int(len(util)), "util_mean": float(util.mean())},
        text=f"GPU utilization read 0% in {idle:.0%} of {len(util)} in-step samples (mean {util.mean():.0f}%)",
        change=change, expected=expected,
    )


def _role_on(m: Measurements, node: Any, gpu: int) -> str | None:
    """The role seen most often on that GPU in the process table, if there is one."""
    if m.procs is None or m.procs.empty or "role" not in m.procs:
        return None
    here = m.procs[m.procs["gpu"] == gpu]
    if "node" in here:
        here = here[here["node"].fillna("") == node]
    roles = here["role"].dropna()
    return str(roles.mode().iloc[0]) if len(roles) else None


def util_spread(m: Measurements) -> Finding | None:
    if m.per_gpu.empty:
        return None
    means = m.per_gpu.set_index(["node", "gpu"])["util_mean"].dropna()
    if len(means) < 2 or len(m.util_samples) < _limit("min_samples"):
        return None
    spread = float(means.max() - means.min())
    if spread <= _limit("util_spread_points"):
        return None
    (busy_node, busy_gpu), (idle_node, idle_gpu) = means.idxmax(), means.idxmin()
    several_nodes = means.index.get_level_values("node").nunique() > 1

    def label(node: Any, gpu: int) -> str:
        return f"{node} GPU {gpu}" if several_nodes else f"GPU {gpu}"

    busy, idle = label(busy_node, busy_gpu), label(idle_node, idle_gpu)
    role = _role_on(m, idle_node, idle_gpu)
    pools = {"critic": "critic_gpus", "reward": "reward_gpus"}
    if role in pools and m.knobs[pools[role]] > 0:
        change = {pools[role]: 0}
        expected = (f"The {role} shares the actor's GPUs again and {idle} joins the actor pool, so no GPU waits "
                    "on a light role.")
    elif role in ("actor/rollout/ref", "colocated") and m.knobs["trainer_mode"] == "separate_async" \
            and not m.knobs["hybrid_switch"]:
        change = {"hybrid_switch": True}
        expected = f"{idle}, a trainer GPU, is lent to rollout while it would wait."
    else:
        change, expected = {}, _no_knob(
            f"no placement knob moves {'its ' + role if role else 'the unattributed'} work; compare the roles on "
            f"{idle} and {busy} in the process table.")
    where = f" ({role})" if role else ""
    return _finding(
        m, rule="util-spread", title=f"{idle} idles while {busy} works", severity="medium",
        evidence={"spread_points": spread, "busiest_gpu": int(busy_gpu), "idlest_gpu": int(idle_gpu),
                  "util_mean": {label(node, gpu): float(u) for (node, gpu), u in means.items()},
                  "idlest_role": role},
        text=f"Mean utilization ranged {spread:.0f} points across GPUs: {busy} {means.max():.0f}%, "
             f"{idle}{where} {means.min():.0f}%",
        change=change, expected=expected,
    )


def memory_headroom(m: Measurements) -> Finding | None:
    peak = m.peak_memory_share
    if not m.knobs["use_dynamic_bsz"] or not peak < _limit("memory_headroom_peak"):
        return None
    scale = m.memory_budget_scale
    current = {knob: m.budget(knob) for knob in BUDGET_KNOBS}
    change = _changes(m, **{knob: m.scaled_budget(tokens, scale) for knob, tokens in current.items()})
    listed = ", ".join(f"{knob} {current[knob]} → {value}" for knob, value in change.items())
    return _finding(
        m, rule="memory-headroom", title="GPU memory left unused: token budgets can grow", severity="low",
        evidence={"peak_memory_share": peak, "budget_scale": scale, "budgets": current},
        text=f"{m.peak_memory_text} with dynamic batching on; budgets can grow {scale:.2f}× "
             f"towards a {_limit('memory_target_peak'):.0%} peak",
        change=change,
        expected=(f"Fuller micro batches and fewer of them ({listed}); the peak stays near or under "
                  f"{_limit('memory_target_peak'):.0%}."),
    )


def oom_risk(m: Measurements) -> Finding | None:
    peak = m.peak_memory_share
    total_gib = float(m.per_gpu["mem_total"].max()) * GIB_PER_MIB if not m.per_gpu.empty else float("nan")
    reserved = {role: float(pd.to_numeric(m.steps[f"{role}/perf/max_memory_reserved_gb"], errors="coerce").max())
                for role in ("actor", "critic") if f"{role}/perf/max_memory_reserved_gb" in m.steps}
    measured = [gb for gb in reserved.values() if not np.isnan(gb)]
    reserved_share = max(measured, default=float("nan")) / total_gib
    if not (peak >= _limit("oom_peak") or reserved_share >= _limit("oom_peak")):
        return None
    worst = np.nanmax([peak, reserved_share])
    scale = _limit("memory_target_peak") / worst
    if m.knobs["use_dynamic_bsz"]:
        change = _changes(m, **{knob: m.scaled_budget(m.budget(knob), scale) for knob in BUDGET_KNOBS})
        action = f"Token budgets {scale:.2f}× as large"
    else:
        change = _changes(m, **{knob: max(1, int(m.knobs[knob]) // 2) for knob in MICRO_BATCH_KNOBS
                                if m.knobs[knob] is not None})
        action = "Micro batches half as large"
    if not change:
        # Budgets already hold one sequence: optimizer state, needed once per mini batch, is the next to go.
        change = _changes(m, actor_optimizer_offload=True, critic_optimizer_offload=True)
        action = "Optimizer state kept on the CPU between updates"
    reserved_text = ", ".join(f"{role} max reserved {gb:.1f} GiB" for role, gb in reserved.items())
    return _finding(
        m, rule="oom-risk", title="GPU memory is nearly full: out-of-memory risk", severity="high",
        evidence={"peak_memory_share": peak, "max_memory_reserved_gb": reserved, "reserved_share": reserved_share,
                  "mem_total_gib": total_gib},
        text=f"{m.peak_memory_text}; {reserved_text or 'no reserved-memory metric'}",
        change=change,
        expected=(f"{action} should bring the peak towards {_limit('memory_target_peak'):.0%} of GPU memory, so a "
                  "longer batch no longer risks an out-of-memory crash." if change else _no_knob(
                      "budgets are at one sequence and optimizer state is already offloaded.")),
    )


def weight_sync(m: Measurements) -> Finding | None:
    share = m.share("update_weights")
    if not share >= _limit("weight_sync_share"):
        return None
    if m.knobs["actor_param_offload"] and m.peak_memory_share < _limit("memory_room_peak"):
        change = {"actor_param_offload": False}
        expected = ("The actor's parameters stay on the GPU, so the sync to the rollout engine no longer reads "
                    "them back from the CPU first.")
    elif m.knobs["trainer_mode"] == "separate_async":
        change, expected = {}, _no_knob(
            "separate_async sends the weights to the rollout GPUs over NCCL; how often is "
            "trainer.v1.separate_async.parameter_sync_step, which is not a workbench knob.")
    else:
        change, expected = {}, _no_knob(
            "the sync is an on-GPU copy from the trainer to the rollout engine and no knob shortens it; check "
            "what else runs on these GPUs during update_weights.")
    return _finding(
        m, rule="weight-sync", title="Weight sync to the rollout engine takes a large share of the step",
        severity="low",
        evidence={"update_weights_share": share, "update_weights_s": m.seconds("update_weights").tolist()},
        text=f"update_weights took {share:.0%} of step time ({m.seconds_text('update_weights')})",
        change=change, expected=expected,
    )


def pcie_offload(m: Measurements) -> Finding | None:
    offloaded = [knob for knob in OFFLOAD_KNOBS if m.knobs[knob]]
    if not offloaded or m.per_gpu.empty:
        return None
    busiest = m.per_gpu[["pcie_tx_p90", "pcie_rx_p90"]].max(axis=1).dropna()
    if busiest.empty or busiest.max() <= _limit("pcie_near_saturation_mb_s"):
        return None
    row = m.per_gpu.loc[busiest.idxmax()]
    gpu = int(row["gpu"])
    room = m.peak_memory_share < _limit("memory_room_peak")
    change = {knob: False for knob in offloaded} if room else {}
    return _finding(
        m, rule="pcie-offload", title="Offload traffic saturates PCIe", severity="medium",
        evidence={"gpu": gpu, "pcie_tx_p90_mb_s": float(row["pcie_tx_p90"]),
                  "pcie_rx_p90_mb_s": float(row["pcie_rx_p90"]), "offloaded": offloaded,
                  "peak_memory_share": m.peak_memory_share},
        text=f"PCIe on GPU {gpu} ran at {busiest.max() / 1000:.0f} GB/s in one direction at the 90th percentile "
             f"(limit {_limit('pcie_near_saturation_mb_s') / 1000:.0f} GB/s) with {', '.join(offloaded)} on; "
             f"{m.peak_memory_text}",
        change=change,
        expected=("Parameters and optimizer state stay on the GPU, so the steps stop waiting on host transfers."
                  if room else _no_knob(f"memory peaks above {_limit('memory_room_peak'):.0%}, too full to keep "
                                        "the offloaded state on the GPU.")),
    )


def _loop_bound(m: Measurements) -> bool:
    """verl's log-prob pass is the Python loop (fused kernels off) and the actor runs far below its FLOPs."""
    mfu = m.metric("perf/mfu/actor")
    return not m.knobs["fused_kernels"] and len(mfu) >= _limit("min_steps") and \
        float(mfu.median()) < _limit("logprob_loop_mfu")


def _prediction_text(prediction: what_if.Prediction | None) -> str:
    if prediction is None:
        return ""
    sources = "; ".join(prediction.sources.values())
    return f" Predicted for this segment: {prediction.text} (workbench.predict from: {sources})."


def logprob_loop(m: Measurements) -> Finding | None:
    if not _loop_bound(m):
        return None
    mfu = m.metric("perf/mfu/actor")
    per_token = m.metric("timing_per_token_ms/update_actor")
    change: dict[str, Any] = {"fused_kernels": True, **_changes(m, fused_kernel_backend="torch")}
    if not m.knobs["use_dynamic_bsz"]:
        change.update(use_dynamic_bsz=True, **FUSED_BUDGETS)
    if m.knobs["gradient_checkpointing"] and _room_without_checkpointing(m, change):
        change["gradient_checkpointing"] = False
    # What goes with the kernels is dropped again, last first, while the what-if model predicts an OOM.
    prediction = m.predicted(change)
    for extra in (("gradient_checkpointing",), ("use_dynamic_bsz", *FUSED_BUDGETS)):
        if prediction is None or not prediction.oom:
            break
        change = {k: v for k, v in change.items() if k not in extra}
        prediction = m.predicted(change)
    padded = not m.knobs["remove_padding"]
    why = ("with use_remove_padding off (no flash-attn), verl 0.9.1 computes log-probs with a Python loop "
           "(verl/utils/torch_functional.py logprobs_from_logits_v2)" if padded else
           "verl materialises the full vocabulary logits for every log-prob pass")
    per_token_text = f", {per_token.median():.3f} ms per token in update_actor" if len(per_token) else ""
    return _finding(
        m, rule="logprob-loop", title="Log-probs run as many small kernels: fused kernels are the lever",
        severity="high",
        evidence={"actor_mfu": mfu.tolist(), "update_actor_ms_per_token": per_token.tolist(),
                  "fused_kernels": False, "remove_padding": not padded,
                  "update_actor_s": m.seconds("update_actor").tolist(),
                  "old_log_prob_s": m.seconds("old_log_prob").tolist(), "peak_memory_share": m.peak_memory_share,
                  "predicted_step_s": prediction.step_s if prediction else None,
                  "predicted_gpu_peak_share": prediction.gpu_peak_share if prediction else None},
        text=f"Actor MFU {mfu.min():.1%}–{mfu.max():.1%} (below {_limit('logprob_loop_mfu'):.0%}){per_token_text}; "
             f"update_actor {m.seconds_text('update_actor')}, old_log_prob {m.seconds_text('old_log_prob')}; "
             f"fused kernels off and {why}",
        change=change,
        expected=f"The fused lm-head + log-prob path replaces the loop; {FUSED_EVIDENCE}."
                 + _prediction_text(prediction),
    )


def gen_on_poll_grid(m: Measurements) -> Finding | None:
    gen = m.seconds("gen")
    if len(gen) < _limit("min_steps"):
        return None
    grid = _limit("verl_poll_s")
    late = gen % grid
    # Below one poll the batch was ready at the first check (colocate_async overlaps generation: ~0.2 s).
    if gen.min() < grid or not (late < _limit("poll_grid_tolerance_s")).all():
        return None
    step = m.seconds("step")
    return _finding(
        m, rule="gen-on-poll-grid", title="Generation time comes in steps of verl's 2 s replay-buffer poll",
        severity="low",
        evidence={"gen_s": gen.tolist(), "seconds_past_grid": late.tolist(), "poll_s": grid},
        text=f"Every timing_s/gen ({', '.join(f'{g:.2f}' for g in gen)} s) ended within "
             f"{late.max():.2f} s after a multiple of {grid:.0f} s",
        change={},
        expected=_no_knob(
            f"verl 0.9.1's V1 ReplayBuffer sleeps {grid:.0f} s between checks, so a batch is seen up to {grid:.0f} s "
            f"after it finished (on average {grid / 2:.0f} s, {grid / 2 / step.median():.0%} of this segment's "
            f"median step); the workbench's runner polls every {REPLAY_POLL_S} s "
            "(workbench/runner/replay_buffer.py), so a run started from the workbench does not pay it."),
    )


def _room_without_checkpointing(m: Measurements, change: Mapping[str, Any]) -> bool:
    """Whether activations fit without recomputation: the what-if model's GPU peak with `change` and checkpointing
    off stays under the target share; without trainer memory readings, the NVML peak is below memory_room_peak."""
    prediction = m.predicted({**change, "gradient_checkpointing": False})
    if prediction is not None and prediction.mem_total_gb > 0 and not np.isnan(prediction.trainer_peak_gb):
        return prediction.gpu_peak_share < _limit("memory_target_peak")
    return m.peak_memory_share < _limit("memory_room_peak")


def checkpointing_headroom(m: Measurements) -> Finding | None:
    change = {"gradient_checkpointing": False}
    if not m.knobs["gradient_checkpointing"] or not _room_without_checkpointing(m, {}):
        return None
    prediction = m.predicted(change)
    return _finding(
        m, rule="checkpointing-headroom", title="Gradient checkpointing is on with memory to spare", severity="low",
        evidence={"peak_memory_share": m.peak_memory_share,
                  "update_actor_s": m.seconds("update_actor").tolist(),
                  "update_critic_s": m.seconds("update_critic").tolist(),
                  "predicted_step_s": prediction.step_s if prediction else None},
        text=f"gradient_checkpointing on while {m.peak_memory_text}",
        change=change,
        expected="Activations are kept instead of recomputed, so the backward passes of update_actor and "
                 f"update_critic skip one forward each ({what_if.PRIORS['gradient_checkpointing'].source})."
                 + _prediction_text(prediction),
    )


RULES: tuple[Callable[[Measurements], Finding | None], ...] = (
    oom_risk, logprob_loop, rollout_bound, actor_update_bound, critic_heavy, gpu_idle, util_spread, pcie_offload,
    memory_headroom, checkpointing_headroom, weight_sync, gen_on_poll_grid,
)


# ---------------------------------------------------------------------------------------------------------- entry
def measurements(steps: pd.DataFrame, samples: pd.DataFrame, knobs: Mapping[str, Any], *, segment_id: Any = None,
                 procs: pd.DataFrame | None = None) -> Measurements | None:
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
    if len(measured) < _limit("min_steps"):
        return None
    in_steps = _inside_steps(samples, measured)
    plan_gpus = in_steps["gpu"].isin(set(knobs["gpus"]))
    return Measurements(segment_id=segment_id, warmup_step=warmup_step, steps=measured.reset_index(drop=True),
                        samples=in_steps[plan_gpus], spare_gpus=_spare_gpus(in_steps[~plan_gpus]), procs=procs,
                        knobs=dict(knobs))


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
    idle = per_gpu[per_gpu["idle_share"] >= _limit("spare_gpu_idle_share")]
    return tuple(int(gpu) for gpu in idle["gpu"])


def _inside_steps(samples: pd.DataFrame | None, steps: pd.DataFrame) -> pd.DataFrame:
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


def advise(steps: pd.DataFrame, samples: pd.DataFrame, knobs: Mapping[str, Any], *, segment_id: Any = None,
           procs: pd.DataFrame | None = None) -> list[Finding]:
    """Every rule's finding for one segment (the newest if None), most severe first."""
    m = measurements(steps, samples, knobs, segment_id=segment_id, procs=procs)
    if m is None:
        return []
    findings = [finding for rule in RULES if (finding := rule(m)) is not None]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def findings_frame(findings: list[Finding]) -> pd.DataFrame:
    """One row per finding, columns in Finding's field order."""
    return pd.DataFrame([asdict(f) for f in findings], columns=list(FINDING_COLUMNS))
