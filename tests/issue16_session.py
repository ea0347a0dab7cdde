"""SYNTHETIC: the ≈1.5B session of issue 16 as store frames, built from the figures the issue quotes (1 × H200,
2026-12-01, Qwen2.5-1.5B dims, 128 prompts × 512 + 1024 tokens, verl's quickstart-style settings):
- segment 1, quickstart: 51.6 s a step, ≈ 2 436 tokens/s/GPU, the trainer's peak 51.7 GiB (read as its max
  reserved), actor MFU as the 0.5B quickstart's (1.3 %); the phases are split like the 0.5B quickstart's (made up
  here: the issue gives the step only); NVML peak 109 GiB (the old predictor's figure for this plan with the
  rollout share unchanged: its measured generation-time peak);
- segment 2, the fused-kernel lever with dynamic batching 16 384 / 32 768 and no gradient checkpointing: crashed
  out of memory in critic_train_mini_batch, the trainer process holding 130.9 GiB and another process 7.4 GiB.
No GPU recorded these rows; they stand in for a recording the repository doesn't hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from tests.memory_sources import ISSUE16_LEVER, ISSUE16_QUICKSTART, issue16_knobs
from workbench.advice.record import SessionRecord, build_record
from workbench.memory import KNOWN_SHAPES
from workbench.store import SAMPLE_COLUMNS

H200_MIB = 143_771.0
T0 = 2_000_000.0
STEP_S = 51.6
PHASES = {"gen": 10.0, "old_log_prob": 9.0, "values": 2.5, "adv": 0.1, "update_critic": 4.0, "update_actor": 25.0,
          "update_weights": 1.0}
TRACEBACK = """  File "/root/site/verl/workers/engine_workers.py", line 366, in train_batch
    output = self.engine.train_batch(data, loss_function=self.loss_fn)
  File "/root/site/verl/trainer/ppo/v1/trainer_base.py", line 902, in critic_train_mini_batch
    outputs = self.critic_wg.train_batch(batch)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.64 GiB. GPU 0 has a total capacity of 139.81 GiB \
of which 1.12 GiB is free. Process 4242 has 130.90 GiB memory in use. Process 4100 has 7.40 GiB memory in use."""
META = {"gpu_name": "NVIDIA H200", "gpu_count": 1,
        "model_shape": {**KNOWN_SHAPES["qwen2.5-1.5b"].as_dict(), "architectures": ["Qwen2ForCausalLM"]}}


@dataclass
class Frames:
    knobs: dict[int, dict[str, Any]]
    segments: pd.DataFrame
    steps: pd.DataFrame
    samples: pd.DataFrame
    events: pd.DataFrame

    def record(self, meta: dict[str, Any] = META) -> SessionRecord:
        return build_record(meta=meta, segments=self.segments, knobs_of=self.knobs.__getitem__, steps=self.steps,
                            samples=self.samples, events=self.events, initial_knobs=self.knobs[1])


def frames(crashed: bool = True) -> Frames:
    """The quickstart segment, and (crashed=True) the lever's segment that ran out of memory."""
    quickstart, lever = issue16_knobs(), issue16_knobs(**ISSUE16_LEVER)
    tokens = 2436.0 * STEP_S
    steps = pd.DataFrame([
        {"segment_id": 1, "step": k, "t": T0 + STEP_S * k, "timing_s/step": STEP_S,
         **{f"timing_s/{p}": s for p, s in PHASES.items()}, "perf/mfu/actor": 0.013, "perf/total_num_tokens": tokens,
         "perf/throughput": 2436.0, "prompt_length/mean": 46.0, "response_length/mean": tokens / 128 - 46.0,
         "actor/perf/max_memory_reserved_gb": 51.7, "critic/perf/max_memory_reserved_gb": 51.7}
        for k in range(1, 5)])
    times = np.arange(T0, T0 + STEP_S * 4, 0.5)
    samples = pd.DataFrame({c: np.nan for c in SAMPLE_COLUMNS}, index=range(len(times))).assign(
        t=times, node="h200", gpu=0, util=60.0, mem_total=H200_MIB,
        mem_used=np.where(np.arange(len(times)) % 100 < 20, 109.0 * 1024, 60.0 * 1024))
    segments = [{"id": 1, "status": "done", "reason": "checkpointed for a restart-class change"}]
    events = [{"kind": "runtime", "text": "flash-attn is not installed: actor/ref/critic use sdpa attention without "
                                          "remove-padding", "data": {}}]
    knobs = {1: quickstart}
    if crashed:
        segments.append({"id": 2, "status": "failed", "reason": "out of memory"})
        events.append({"kind": "crash", "text": "verl ran out of GPU memory",
                       "data": {"segment": 2, "exit_code": 1, "oom": True, "traceback_tail": TRACEBACK}})
        knobs[2] = lever
    return Frames(knobs, pd.DataFrame(segments), steps, samples, pd.DataFrame(events))


QUICKSTART = ISSUE16_QUICKSTART
