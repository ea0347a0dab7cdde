"""Rules about generation and the step pattern, what remains once training is fast: rollout-bound steps (overlap,
the rollout engine's memory sized by the memory model, CUDA graphs, sequences and batched tokens), colocate_async's
alternating steps, idle GPUs, verl's replay-buffer poll, weight sync."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..control import REPLAY_POLL_S
from ..memory import kv_cache_tokens
from .core import (Finding, Measurements, finding, gain_evidence, limit, no_knob, predicted_gain, prediction_text,
                   training_is_fast)

# Measured on issue 16's 0.5B workloads after the fused round: colocate_async alone (2026-12-02, 128 prompts ×
# ≤ 256 + 768, bench/results/h200_2026-12-02_inplace) and with rollout memory 0.65 and batched tokens 16 384
# (2026-12-01, 128 prompts × 512 + 1 024, the advisor's round 2).
ASYNC_EVIDENCE = ("1 × H200, 2026-12-02: 14.0 s a step sync → colocate_async alone 8.4 / 18.6 s alternating, a pair "
                  "mean of 13.5 s; 1 × H200, 2026-12-01, with rollout memory 0.65 and batched tokens 16 384: 16.1 s → "
                  "17.8 / 9.7 s, a mean of 13.8 s")
# Why colocate_async gains little where the rollout shares the trainer's GPUs (workbench.predict.COLOCATE_ASYNC_GEN).
ASYNC_OVERLAP = ("the next batch's prompts decode beside this one's and fill the rollout's idle tail; generation "
                 "does not overlap training, since verl puts the rollout to sleep on the GPUs it shares while they "
                 "train, so the gain is that tail only")


def rollout_bound(m: Measurements) -> Finding | None:
    """Generation above rollout_share of the step; below it, once training is fast, where the what-if model
    predicts the rollout change saves at least min_predicted_gain of the step."""
    share = m.share("gen")
    if not share > 0 or (share < limit("rollout_share") and not training_is_fast(m)):
        return None
    change, effects = {}, []
    if m.knobs["trainer_mode"] == "sync":
        change["trainer_mode"] = "colocate_async"
        effects.append(f"{ASYNC_OVERLAP} ({ASYNC_EVIDENCE})")
    if m.knobs["rollout_enforce_eager"]:
        change["rollout_enforce_eager"] = False
        effects.append("vLLM captures CUDA graphs, so each decode step is one graph launch instead of hundreds of "
                       "kernel launches")
    sequences = int(m.knobs["train_batch_size"])
    if int(m.knobs["rollout_max_num_seqs"]) < sequences:
        change["rollout_max_num_seqs"] = sequences
        effects.append(f"all {sequences} prompts of a step decode at once instead of in waves of "
                       f"{m.knobs['rollout_max_num_seqs']}")
    # What a step's prompts prefill, from their measured lengths where verl logged them (a 256-token limit held
    # prompts of at most 55 tokens on the H200 runs): a larger batch than that buys nothing, and its change would
    # rebuild the rollout engine (a rollout knob: a costlier restart).
    prompts = m.metric("prompt_length/max")
    longest_prompt = int(prompts.max()) if len(prompts) else int(m.knobs["max_prompt_length"])
    batch_prompt_tokens = int(m.knobs["train_batch_size"]) * longest_prompt
    batched = m.knobs["rollout_max_batched_tokens"]
    if batched is not None and batched < batch_prompt_tokens:
        change["rollout_max_batched_tokens"] = min(batch_prompt_tokens, 2 * int(batched))
        effects.append(f"the batch's prompts ({batch_prompt_tokens:,} tokens at their longest) prefill in fewer "
                       "engine passes")
    memory = float(m.knobs["rollout_gpu_memory"])
    kv = _kv_cache(m, change)
    raised = _rollout_memory_room(m, change, kv)
    if raised > memory:
        change["rollout_gpu_memory"] = raised
        effects.append(f"a KV cache {raised / memory:.1f}× larger holds a step's {kv.sequences} sequences at their "
                       f"longest ({kv.needed:,} tokens, {kv.tokens / 1e6:.1f} M held now), so none waits for room "
                       "(sized by the memory model on this session's peaks)")
    kept = _kept_memory_note(memory, raised, kv)
    dominant = share >= limit("rollout_share")
    gain = predicted_gain(m, change)
    if not dominant and gain is None:
        return None
    title = "Generation (rollout) dominates the step" if dominant else \
        "Training is fast: generation is the largest lever left"
    why = "" if dominant else (f", below {limit('rollout_share'):.0%}, but the what-if model predicts its change "
                               f"saves {1 - gain.step_s / gain.measured_step_s:.0%} of the step")
    return finding(
        m, rule="rollout-bound", title=title, severity="medium",
        evidence={"gen_share": share, "gen_s": m.seconds("gen").tolist(), "step_s": m.seconds("step").tolist(),
                  "peak_memory_share": m.peak_memory_share, **gain_evidence(gain),
                  **({"kv_cache_tokens": kv.tokens, "kv_tokens_needed": kv.needed} if kv else {})},
        text=f"Generation took {share:.0%} of step time ({m.seconds_text('gen')} of {m.seconds_text('step')} "
             f"steps){why}",
        change=change,
        expected=("Shorter steps: " + "; ".join(effects) + "." + kept + prediction_text(m.predicted(change)))
        if effects else no_knob("the trainer already overlaps generation." + (
            kept or " The rollout engine has no memory left to grow into.")),
    )


@dataclass(frozen=True)
class KVCache:
    tokens: float  # what the rollout engine's KV cache holds per GPU (workbench.memory.kv_cache_tokens)
    needed: int  # a step's sequences at their longest (all on one engine: an upper bound)
    sequences: int


def _kv_cache(m: Measurements, change: dict) -> KVCache | None:
    """The KV cache as the plan with `change` sizes it, against what a step's sequences can fill (None where the
    memory model can't say: no GPU memory sampled)."""
    p = m.predicted(change)
    if p is None or p.memory is None or not p.mem_total_gb > 0:
        return None
    sequences = int(m.knobs["train_batch_size"])
    return KVCache(kv_cache_tokens({**m.knobs, **change}, p.memory.shape, p.mem_total_gb, p.memory.coefficients),
                   sequences * m.longest_sequence, sequences)


def _kept_memory_note(memory: float, raised: float, kv: KVCache | None) -> str:
    """Why the rollout memory share is not raised, where the KV cache was sized ("" where it is raised)."""
    if raised > memory or kv is None:
        return ""
    held = f"its KV cache holds {kv.tokens / 1e6:.1f} M tokens, {kv.tokens / kv.needed:.1f}× the {kv.needed:,} a " \
           f"step's {kv.sequences} sequences reach at their longest"
    if kv.tokens >= limit("kv_cache_margin") * kv.needed:
        return f" The rollout memory stays at {memory:g}: {held}, so a larger one keeps no more of them decoding."
    return f" The rollout memory stays at {memory:g} although {held}: no larger share fits under the memory target."


def _rollout_memory_room(m: Measurements, change: dict, kv: KVCache | None) -> float:
    """Where the KV cache may be too small for a step's sequences (it holds less than kv_cache_margin × what they
    need): the smallest rollout memory share (steps of 0.05, at most rollout_gpu_memory_max) whose cache holds that
    much, or the largest whose predicted peak, band included, stays under memory_target_peak of the GPU if none
    does. Otherwise, or where the memory model can't size the cache, the share in force: a larger KV cache than the
    sequences can fill keeps no more of them decoding."""
    memory = float(m.knobs["rollout_gpu_memory"])
    margin = limit("kv_cache_margin")
    if kv is None or kv.tokens >= margin * kv.needed:
        return memory
    best = memory
    for share in np.arange(memory + 0.05, limit("rollout_gpu_memory_max") + 1e-9, 0.05):
        p = m.predicted({**change, "rollout_gpu_memory": round(float(share), 2)})
        if p.memory.upper_gib >= limit("memory_target_peak") * p.mem_total_gb:
            break
        best = round(float(share), 2)
        if kv_cache_tokens({**m.knobs, **change, "rollout_gpu_memory": best}, p.memory.shape, p.mem_total_gb,
                           p.memory.coefficients) >= margin * kv.needed:
            break
    return best


def async_alternation(m: Measurements) -> Finding | None:
    if m.knobs["trainer_mode"] != "colocate_async":
        return None
    step = m.seconds("step")
    if len(step) < limit("min_steps"):
        return None
    differences = np.diff(step.to_numpy())
    alternating = len(differences) == 1 or bool(np.all(differences[1:] * differences[:-1] < 0))
    ratio = float(step.max() / step.min())
    if not alternating or ratio < limit("alternation_ratio"):
        return None
    odd, even = step.iloc[0::2], step.iloc[1::2]
    return finding(
        m, rule="async-alternation", title="colocate_async alternates long and short steps", severity="low",
        evidence={"step_s": step.tolist(), "long_short_ratio": ratio, "pair_mean_s": float(step.mean())},
        text=f"Steps alternated {', '.join(f'{s:.1f}' for s in step)} s (every other step {odd.mean():.1f} s, the "
             f"others {even.mean():.1f} s: a ratio of {ratio:.1f})",
        change={},
        expected=no_knob(
            "verl's colocate_async lets the next batch's prompts decode beside this step's (it puts the rollout to "
            "sleep while the GPUs train); a step whose batch is not yet generated waits for both, the next finds its "
            "batch ready (trainer.v1.colocate_async.num_warmup_batches, not a workbench knob). Judge this plan by "
            f"the mean of a pair, {float(step.mean()):.1f} s here (the autopilot does): {ASYNC_EVIDENCE}; "
            "2026-11-30: 16.0 / 6.8 / 12.9 / 6.1 s."),
    )


def gpu_idle(m: Measurements) -> Finding | None:
    util = m.util_samples
    if len(util) < limit("min_samples"):
        return None
    idle = float((util == 0).mean())
    if idle <= limit("gpu_idle_share"):
        return None
    if m.knobs["trainer_mode"] == "sync":
        change = {"trainer_mode": "colocate_async"}
        expected = (f"Some shorter steps: {ASYNC_OVERLAP}, not the gaps between phases ({ASYNC_EVIDENCE}).")
    elif m.knobs["trainer_mode"] == "separate_async" and not m.knobs["hybrid_switch"]:
        change = {"hybrid_switch": True}
        expected = "Idle trainer GPUs are lent to rollout between updates, so they generate instead of waiting."
    elif not m.knobs["use_dynamic_bsz"]:
        change = {"use_dynamic_bsz": True}
        expected = "Micro batches packed by token budget run longer kernels with fewer gaps between them."
    else:
        change, expected = {}, no_knob("the run already overlaps phases and packs micro batches by token budget; "
                                        "the timeline shows which phase leaves the GPU waiting.")
    return finding(
        m, rule="gpu-idle", title="GPUs sit idle during steps", severity="medium",
        evidence={"idle_share": idle, "samples": int(len(util)), "util_mean": float(util.mean())},
        text=f"GPU utilization read 0% in {idle:.0%} of {len(util)} in-step samples (mean {util.mean():.0f}%)",
        change=change, expected=expected,
    )


def gen_on_poll_grid(m: Measurements) -> Finding | None:
    gen = m.seconds("gen")
    if len(gen) < limit("min_steps"):
        return None
    grid = limit("verl_poll_s")
    late = gen % grid
    # Below one poll the batch was ready at the first check (colocate_async overlaps generation: ~0.2 s).
    if gen.min() < grid or not (late < limit("poll_grid_tolerance_s")).all():
        return None
    step = m.seconds("step")
    return finding(
        m, rule="gen-on-poll-grid", title="Generation time comes in steps of verl's 2 s replay-buffer poll",
        severity="low",
        evidence={"gen_s": gen.tolist(), "seconds_past_grid": late.tolist(), "poll_s": grid},
        text=f"Every timing_s/gen ({', '.join(f'{g:.2f}' for g in gen)} s) ended within "
             f"{late.max():.2f} s after a multiple of {grid:.0f} s",
        change={},
        expected=no_knob(
            f"verl 0.9.1's V1 ReplayBuffer sleeps {grid:.0f} s between checks, so a batch is seen up to {grid:.0f} s "
            f"after it finished (on average {grid / 2:.0f} s, {grid / 2 / step.median():.0%} of this segment's "
            f"median step); the workbench's runner polls every {REPLAY_POLL_S} s "
            "(its own replay-buffer poll), so a run started from the workbench does not pay it."),
    )


def weight_sync(m: Measurements) -> Finding | None:
    share = m.share("update_weights")
    if not share >= limit("weight_sync_share"):
        return None
    if m.knobs["actor_param_offload"] and m.peak_memory_share < limit("memory_room_peak"):
        change = {"actor_param_offload": False}
        expected = ("The actor's parameters stay on the GPU, so the sync to the rollout engine no longer reads "
                    "them back from the CPU first.")
    elif m.knobs["trainer_mode"] == "separate_async":
        change, expected = {}, no_knob(
            "separate_async sends the weights to the rollout GPUs over NCCL; how often is "
            "trainer.v1.separate_async.parameter_sync_step, which is not a workbench knob.")
    else:
        change, expected = {}, no_knob(
            "the sync is an on-GPU copy from the trainer to the rollout engine and no knob shortens it; check "
            "what else runs on these GPUs during update_weights.")
    return finding(
        m, rule="weight-sync", title="Weight sync to the rollout engine takes a large share of the step",
        severity="low",
        evidence={"update_weights_share": share, "update_weights_s": m.seconds("update_weights").tolist()},
        text=f"update_weights took {share:.0%} of step time ({m.seconds_text('update_weights')})",
        change=change, expected=expected,
    )
