"""Every real GPU measurement of peak memory the repository holds, as memory-model inputs: the plain-verl reference
runs (tests/data, through tests/h200_traces.py) and the workbench's recorded sessions (workbench/assets/recordings).
All ran on one NVIDIA H200 with a Qwen2 model of Qwen2.5-0.5B's shape; none had flash-attn, so sequences were held
padded. The ≈1.5B figures come from issue 16 (the 2026-12-01 campaign), quoted where they are used.

bench/memory_error.py and tests/test_memory.py read them.
"""

from __future__ import annotations

import functools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tests.h200_traces import H200_MEM_TOTAL_MIB, PLANS, frames
from tests.plan_fixtures import runnable_overrides, write_tiny_model
from workbench import memory, memory_fit
from workbench.advice.record import gpu_peak_gib
from workbench.plan import Plan
from workbench.store import Store

RECORDINGS = Path(__file__).resolve().parents[1] / "workbench" / "assets" / "recordings"
H200_GIB = H200_MEM_TOTAL_MIB / 1024
SHAPE_05B = memory.KNOWN_SHAPES["qwen2.5-0.5b"]
SHAPE_15B = memory.KNOWN_SHAPES["qwen2.5-1.5b"]
REFERENCE_RUNS = {"run": "2026-11-30", "A": "2026-11-30", "B": "2026-11-30", "fused_A": "2026-12-01",
                  "fused_C": "2026-12-01", "fused_D": "2026-12-01"}
RECORDED = {"h200-proof": "2026-11-30", "h200-lora-critic-sync": "2026-11-30", "h200-tuning": "2026-12-01"}

# Issue 16 (1 × H200, 2026-12-01, Qwen2.5-1.5B dims, 128 prompts × 512 + 1024 tokens, one GPU): verl's
# quickstart-style settings reserved 51.7 GiB at most in the trainer process; the fused-kernel lever with dynamic
# batching 16 384 actor / 32 768 log-prob and critic tokens and no gradient checkpointing ran out of memory in
# critic_train_mini_batch with 130.9 GiB held by the trainer process and 7.4 GiB by another.
ISSUE16_QUICKSTART = dict(
    gpus=[0], train_batch_size=128, ppo_mini_batch_size=32, max_prompt_length=512, max_response_length=1024,
    actor_micro_batch=4, logprob_micro_batch=8, ref_micro_batch=4, critic_micro_batch=4, use_dynamic_bsz=False,
    rollout_gpu_memory=0.4, gradient_checkpointing=True, fused_kernels=False, remove_padding=False,
)
ISSUE16_LEVER = dict(
    fused_kernels=True, fused_kernel_backend="torch", use_dynamic_bsz=True, actor_token_budget=16384,
    logprob_token_budget=32768, ref_token_budget=32768, critic_token_budget=32768, gradient_checkpointing=False,
)
ISSUE16_QUICKSTART_RESERVED_GIB = 51.7
ISSUE16_CRASH_HELD_GIB = 130.9
ISSUE16_OTHER_PROCESS_GIB = 7.4


@dataclass(frozen=True)
class Segment:
    name: str  # "<run>" or "<recording>#<segment>"
    date: str
    knobs: dict[str, Any]
    steps: pd.DataFrame
    observation: memory_fit.Observation | None
    reserved_gib: float  # the trainer process's max reserved (verl's max_memory_reserved_gb)
    gpu_peak_gib: float  # NVML: the GPU's peak memory used inside the measured steps


@functools.cache
def _base() -> Plan:
    return Plan.from_verl(runnable_overrides(write_tiny_model(Path(tempfile.mkdtemp(prefix="memory-sources-")))))


def reference_run(name: str) -> Segment:
    steps, samples = frames(name)
    knobs = _base().with_changes(PLANS[name]).knob_values()
    peak = gpu_peak_gib(steps, samples)
    obs = memory_fit.observation(name, steps, knobs, padded=True, gpu_peak_gib=peak)
    return Segment(name, REFERENCE_RUNS[name], knobs, steps, obs, memory_fit.measured_reserved(steps), peak)


def recorded_segments(recording: str) -> list[Segment]:
    """The recording's segments that ran steps; a hot-applied segment's readings count only above its
    predecessor's (verl reports the process's max so far)."""
    store = Store(RECORDINGS / recording, readonly=True)
    try:
        rows, steps, samples = store.rows("segments"), store.frame("steps"), store.frame("samples")
    finally:
        store.close()
    out, previous = [], {}
    for row in rows:
        seg = steps[steps["segment_id"] == row["id"]].sort_values("step")
        if seg.empty:
            continue
        knobs = Plan.from_json(row["plan_json"]).knob_values()
        hot = "hot apply" in (rows[rows.index(row) - 1]["reason"] or "") if rows.index(row) else False
        peak = gpu_peak_gib(seg, samples)
        obs = memory_fit.observation(f"{recording}#{row['id']}", seg, knobs, padded=True,
                                     inherited=previous if hot else None, gpu_peak_gib=peak)
        out.append(Segment(f"{recording}#{row['id']}", RECORDED[recording], knobs, seg, obs,
                           memory_fit.measured_reserved(seg), peak))
        previous = memory_fit.measured_allocated(seg, knobs)
    return out


@functools.cache
def all_segments() -> tuple[Segment, ...]:
    return tuple([reference_run(name) for name in REFERENCE_RUNS]
                 + [s for recording in RECORDED for s in recorded_segments(recording)])


def issue16_knobs(**changes: Any) -> dict[str, Any]:
    return _base().with_changes({**ISSUE16_QUICKSTART, **changes}).knob_values()
