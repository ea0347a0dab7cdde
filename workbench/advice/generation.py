"""Rules about generation and the step pattern: rollout-bound steps, idle GPUs, verl's replay-buffer poll, weight
sync."""

from __future__ import annotations

import numpy as np

from ..control import REPLAY_POLL_S
from .core import Finding, Measurements, finding, limit, no_knob, prediction_text


def rollout_bound(m: Measurements) -> Finding | None:
    share = m.share("gen")
    if not share >= limit("rollout_share"):
        return None
    change, effects = {}, []
    if m.knobs["trainer_mode"] == "sync":
        change["trainer_mode"] = "colocate_async"
        effects.append("generation overlaps training on the same GPUs (H200: 8.1 s a step with colocate_async "
                       "against 11.6–15.5 s sync on the same workload)")
    memory = float(m.knobs["rollout_gpu_memory"])
    if m.peak_memory_share < limit("memory_target_peak"):
        room = limit("memory_target_peak") - m.peak_memory_share
        raised = min(limit("rollout_gpu_memory_max"), np.floor((memory + room) * 20) / 20)  # steps of 0.05
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
    return finding(
        m, rule="rollout-bound", title="Generation (rollout) dominates the step", severity="medium",
        evidence={"gen_share": share, "gen_s": m.seconds("gen").tolist(), "step_s": m.seconds("step").tolist(),
                  "peak_memory_share": m.peak_memory_share},
        text=f"Generation took {share:.0%} of step time ({m.seconds_text('gen')} of {m.seconds_text('step')} steps)",
        change=change,
        expected=("Shorter steps: " + "; ".join(effects) + "." + prediction_text(m.predicted(change)))
        if effects else no_knob(
            "the trainer already overlaps generation and the rollout engine has no memory left to grow into."),
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
        expected = ("Generation overlaps training and fills the gaps between phases (H200: 8.1 s a step with "
                    "colocate_async against 11.6–15.5 s sync).")
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
