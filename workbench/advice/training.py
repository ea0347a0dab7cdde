"""Rules about the trainer's passes: the log-prob loop, the actor's update, the critic's cost, memory for speed
(gradient checkpointing, budgets grown into measured headroom) and memory at risk."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd

from .. import memory, memory_fit
from .. import predict as what_if
from ..knobs import MICRO_BATCH_KNOBS, batching_knobs_read
from .core import (BUDGET_KNOBS, FUSED_BUDGETS, FUSED_EVIDENCE, GIB_PER_MIB, Finding, Measurements, changes,
                   finding, limit, loop_bound, no_knob, prediction_text, value_range)
from .safety import screen

# Measured: H200, 2026-11-30, 0.5B shape, 64 prompts × 256 + 256 tokens (the h200-proof recording, a hot change).
BUDGET_EVIDENCE = ("on one H200 (2026-11-30, 0.5B shape) raising every budget 4 096 → 32 768 tokens took the step "
                   "from 12.1–12.9 s to 10.3–12.3 s (median 12.5 → 10.6 s, ≈ 15 % shorter)")


def logprob_loop(m: Measurements) -> Finding | None:
    if not loop_bound(m):
        return None
    mfu = m.metric("perf/mfu/actor")
    per_token = m.metric("timing_per_token_ms/update_actor")
    change: dict[str, Any] = {"fused_kernels": True, **changes(m, fused_kernel_backend="torch")}
    if not m.knobs["use_dynamic_bsz"]:
        change.update(changes(m, use_dynamic_bsz=True, **FUSED_BUDGETS))
    kept = ""
    if m.knobs["gradient_checkpointing"]:
        if _room_without_checkpointing(m, change):
            change["gradient_checkpointing"] = False
        elif (without := m.predicted({**change, "gradient_checkpointing": False})) is not None and \
                without.memory is not None:
            kept = (f" Gradient checkpointing stays on: without it the peak would be {without.memory.text}, over "
                    f"the {limit('memory_target_peak'):.0%} this lever aims at.")
    # What doesn't fit of this is left out by the advisor's safety screen (workbench.advice.safety).
    prediction = m.predicted(change)
    padded = not m.knobs["remove_padding"] or bool(m.padded)
    why = ("with use_remove_padding off (no flash-attn), verl 0.9.1 computes log-probs with a Python loop "
           "(verl's logprobs_from_logits_v2)" if padded else
           "verl materialises the full vocabulary logits for every log-prob pass")
    per_token_text = f", {per_token.median():.3f} ms per token in update_actor" if len(per_token) else ""
    return finding(
        m, rule="logprob-loop", title="Log-probs run as many small kernels: fused kernels are the lever",
        severity="high",
        evidence={"actor_mfu": mfu.tolist(), "update_actor_ms_per_token": per_token.tolist(),
                  "fused_kernels": False, "remove_padding": not padded,
                  "update_actor_s": m.seconds("update_actor").tolist(),
                  "old_log_prob_s": m.seconds("old_log_prob").tolist(), "peak_memory_share": m.peak_memory_share,
                  "predicted_step_s": prediction.step_s if prediction else None,
                  "predicted_gpu_peak_share": prediction.gpu_peak_share if prediction else None},
        text=f"Actor MFU {value_range(mfu, '.1%')} (below {limit('logprob_loop_mfu'):.0%}){per_token_text}; "
             f"update_actor {m.seconds_text('update_actor')}, old_log_prob {m.seconds_text('old_log_prob')}; "
             f"fused kernels off and {why}",
        change=change,
        expected=f"The fused lm-head + log-prob path replaces the loop; {FUSED_EVIDENCE}.{kept}"
                 + prediction_text(prediction),
    )


def _room_without_checkpointing(m: Measurements, change: Mapping[str, Any]) -> bool:
    """Whether activations fit without recomputation: the memory model's GPU peak with `change` and checkpointing
    off, its band included, stays under the target share; with no GPU size known, the NVML peak is below
    memory_room_peak."""
    prediction = m.predicted({**change, "gradient_checkpointing": False})
    if prediction is not None and prediction.memory is not None and prediction.mem_total_gb > 0:
        return prediction.memory.upper_gib < limit("memory_target_peak") * prediction.mem_total_gb
    return m.peak_memory_share < limit("memory_room_peak")


def checkpointing_headroom(m: Measurements) -> Finding | None:
    change: dict[str, Any] = {"gradient_checkpointing": False}
    if not m.knobs["gradient_checkpointing"]:
        return None
    room, title = _room_without_checkpointing(m, {}), "Gradient checkpointing is on with memory to spare"
    if not room:
        if m.cost is None or not m.cost.mem_total_gb > 0:
            return None  # the GPU's size unknown: no memory-for-speed trade is judged safe
        # Not as the budgets stand: the fastest safe variant may keep activations with smaller micro batches.
        screened = screen(m, change)
        if screened.change.get("gradient_checkpointing") is not False:
            return None
        change, title = screened.change, "Gradient checkpointing is on: smaller micro batches make room without it"
    prediction = m.predicted(change)
    if prediction is None or not prediction.step_s < prediction.measured_step_s:
        return None
    return finding(
        m, rule="checkpointing-headroom", title=title, severity="low",
        evidence={"peak_memory_share": m.peak_memory_share,
                  "update_actor_s": m.seconds("update_actor").tolist(),
                  "update_critic_s": m.seconds("update_critic").tolist(),
                  "predicted_step_s": prediction.step_s, "predicted_gpu_peak_gib": prediction.gpu_peak_gb},
        text=f"gradient_checkpointing on while {m.peak_memory_text}",
        change=change,
        expected="Activations are kept instead of recomputed, so the backward passes of update_actor and "
                 f"update_critic skip one forward each ({what_if.PRIORS['gradient_checkpointing'].source})"
                 + ("." if room else "; budgets shrink where the memory model says the passes would not fit.")
                 + prediction_text(prediction),
    )


def actor_update_bound(m: Measurements) -> Finding | None:
    share = m.share("update_actor")
    if not share > limit("actor_update_share") or loop_bound(m):
        return None  # a loop-bound actor gains little from batching: logprob-loop names the lever
    dynamic = bool(m.knobs["use_dynamic_bsz"])
    tokens = m.tokens_per_micro_batch("actor_token_budget", "actor_micro_batch")
    if dynamic and tokens >= limit("small_actor_budget"):
        return None
    scale = m.budget_scale
    budget = m.scaled_budget(tokens, scale)
    change = changes(m, use_dynamic_bsz=True, actor_token_budget=budget)
    room = m.peak_memory_share < limit("memory_room_peak")
    if room and m.knobs["gradient_checkpointing"]:
        change["gradient_checkpointing"] = False
    batching = "dynamic batching on" if dynamic else \
        f"dynamic batching off ({m.knobs['actor_micro_batch']} sequences × {m.longest_sequence} tokens)"
    others = "" if dynamic else (
        "; use_dynamic_bsz also packs log-prob, ref and critic micro batches by their budgets ("
        + ", ".join(f"{knob} {m.budget(knob)}" for knob in BUDGET_KNOBS[1:]) + ")")
    return finding(
        m, rule="actor-update-bound", title="The actor update dominates the step", severity="medium",
        evidence={"update_actor_share": share, "update_actor_s": m.seconds("update_actor").tolist(),
                  "use_dynamic_bsz": dynamic, "actor_tokens_per_micro_batch": tokens,
                  "peak_memory_share": m.peak_memory_share, "budget_scale": scale},
        text=f"update_actor took {share:.0%} of step time ({m.seconds_text('update_actor')}) with {batching}, "
             f"{tokens} tokens per micro batch; {m.peak_memory_text}",
        change=change,
        expected=("Fewer, fuller actor micro batches" + (" without recomputing activations" if room else "")
                  + f": on the H200, dynamic batching at 24 576 tokens/GPU without gradient checkpointing cut "
                  f"update_actor from 29.9–35.7 s to 23.5–26.1 s{others}." if change else no_knob(
                      f"the budget can't grow without memory headroom ({m.peak_memory_text}).")),
    )


def critic_heavy(m: Measurements) -> Finding | None:
    actor = m.seconds("update_actor")
    critic = pd.concat([m.seconds("values"), m.seconds("update_critic")], axis=1).dropna(how="all")
    if len(actor) < limit("min_steps") or critic.empty or actor.sum() <= 0:
        return None
    critic_s, actor_s = float(critic.sum().sum()), float(actor.sum())
    ratio = critic_s / actor_s
    if ratio < limit("critic_to_actor"):
        return None
    if m.spare_gpus and m.knobs["critic_gpus"] == 0:
        spare = m.spare_gpus[0]
        change = {"gpus": [*m.knobs["gpus"], spare], "critic_gpus": 1}
        expected = (f"The critic moves to idle GPU {spare} and its work leaves the actor GPUs: about "
                    f"{critic_s / len(critic):.1f} s less on them per step in sync mode.")
    else:
        change = changes(m, critic_lora_rank=8)
        prediction = m.predicted(change) if change else None
        if prediction is not None and prediction.step_s >= prediction.measured_step_s:
            # Measured on the H200: a LoRA critic saves memory but its update is slower on a small model.
            change, expected = {}, no_knob(
                f"a LoRA critic is predicted to make the step slower, not faster ({prediction.text}; "
                f"{what_if.PRIORS['critic_lora'].source}), and no spare GPU was sampled for the critic.")
        else:
            expected = ("A rank-8 LoRA critic trains a small fraction of the value model's parameters, so its "
                        "gradients and optimizer step shrink and update_critic gets shorter." if change else no_knob(
                            "the critic already trains LoRA adapters and no spare GPU was sampled."))
    return finding(
        m, rule="critic-heavy", title="The critic costs a large share of the actor's training time",
        severity="medium",
        evidence={"critic_s": critic_s, "update_actor_s": actor_s, "critic_to_actor": ratio,
                  "spare_gpus": list(m.spare_gpus)},
        text=f"values + update_critic took {critic_s:.1f} s against {actor_s:.1f} s of update_actor, "
             f"a ratio of {ratio:.2f}",
        change=change, expected=expected,
    )


def _fuller(m: Measurements, budget: str, tokens: int) -> bool:
    """Whether a larger budget makes any micro batch of its passes larger (not when it already holds a whole
    mini batch or step)."""
    sequences = m.record.sequences if m.record is not None else memory_fit.sequences_from_steps(m.steps, m.padded)
    roles = m.record.roles if m.record is not None else memory_fit.roles_from_steps(m.steps)
    running = {"actor": True, "critic": roles.critic, "ref": roles.ref}
    grown = {**m.knobs, budget: tokens}
    return any(memory.micro_batch_tokens(grown, p, sequences) > memory.micro_batch_tokens(m.knobs, p, sequences) + 1
               for p in memory.PASSES if p.budget == budget and running[p.role])


def memory_headroom(m: Measurements) -> Finding | None:
    peak = m.trainer_peak_share
    if not m.knobs["use_dynamic_bsz"] or not peak < limit("memory_headroom_peak"):
        return None
    current = {knob: m.budget(knob) for knob in BUDGET_KNOBS}
    grown = m.headroom_budgets(limit("memory_target_peak"))
    change = changes(m, **{k: v for k, v in grown.items() if v > current[k] and _fuller(m, k, v)})
    if not change:
        return None  # the budgets already hold whole mini batches, or the model leaves no room
    listed = ", ".join(f"{knob} {current[knob]} → {value}" for knob, value in change.items())
    prediction = m.predicted(change)
    return finding(
        m, rule="memory-headroom", title="GPU memory left unused: token budgets can grow", severity="low",
        evidence={"peak_memory_share": m.peak_memory_share, "trainer_peak_share": peak, "budgets": current,
                  "grown": change, "predicted_gpu_peak_gib": prediction.gpu_peak_gb if prediction else None},
        text=f"{_trainer_peak_text(m)} with dynamic batching on; the memory model (calibrated on this session's "
             f"peaks) lets the budgets grow while the peak, band included, stays under "
             f"{limit('memory_target_peak'):.0%}",
        change=change,
        expected=(f"Fuller micro batches and fewer of them ({listed}): {BUDGET_EVIDENCE}."
                  + prediction_text(prediction)),
    )


def _trainer_peak_text(m: Measurements) -> str:
    """The training phases' peak in words (where the GPU's peak is generation's, both)."""
    if m.trainer_peak_share == m.peak_memory_share:
        return m.peak_memory_text
    total = m.trainer_reserved_gib / m.trainer_peak_share
    return (f"the trainer reserved at most {m.trainer_reserved_gib:.1f} of {total:.1f} GiB "
            f"({m.trainer_peak_share:.0%}; NVML: {m.peak_memory_text}, the rollout engine's share included)")


def oom_risk(m: Measurements) -> Finding | None:
    peak = m.peak_memory_share
    total_gib = float(m.per_gpu["mem_total"].max()) * GIB_PER_MIB if not m.per_gpu.empty else float("nan")
    reserved = {role: float(pd.to_numeric(m.steps[f"{role}/perf/max_memory_reserved_gb"], errors="coerce").max())
                for role in ("actor", "critic") if f"{role}/perf/max_memory_reserved_gb" in m.steps}
    measured = [gb for gb in reserved.values() if not np.isnan(gb)]
    reserved_share = max(measured, default=float("nan")) / total_gib
    if not (peak >= limit("oom_peak") or reserved_share >= limit("oom_peak")):
        return None
    worst = np.nanmax([peak, reserved_share])
    scale = limit("memory_target_peak") / worst
    # Shrink what verl reads: token budgets where a pass packs by tokens (the critic always does in verl 0.9.1),
    # micro-batch sizes where it doesn't.
    read = batching_knobs_read(m.knobs["use_dynamic_bsz"])
    budgets = {knob: m.scaled_budget(m.budget(knob), scale) for knob in BUDGET_KNOBS if knob in read}
    micro = {knob: max(1, int(m.knobs[knob]) // 2) for knob in MICRO_BATCH_KNOBS
             if knob in read and m.knobs[knob] is not None}
    change = changes(m, **budgets, **micro)
    action = " and ".join(part for part, knobs in ((f"Token budgets {scale:.2f}× as large", budgets),
                                                   ("micro batches half as large", micro)) if knobs).capitalize()
    if not change:
        # Budgets already hold one sequence: optimizer state, needed once per mini batch, is the next to go.
        change = changes(m, actor_optimizer_offload=True, critic_optimizer_offload=True)
        action = "Optimizer state kept on the CPU between updates"
    reserved_text = ", ".join(f"{role} max reserved {gb:.1f} GiB" for role, gb in reserved.items())
    return finding(
        m, rule="oom-risk", title="GPU memory is nearly full: out-of-memory risk", severity="high",
        evidence={"peak_memory_share": peak, "max_memory_reserved_gb": reserved, "reserved_share": reserved_share,
                  "mem_total_gib": total_gib},
        text=f"{m.peak_memory_text}; {reserved_text or 'no reserved-memory metric'}",
        change=change,
        expected=(f"{action} should bring the peak towards {limit('memory_target_peak'):.0%} of GPU memory, so a "
                  "longer batch no longer risks an out-of-memory crash." if change else no_knob(
                      "budgets are at one sequence and optimizer state is already offloaded.")),
    )
