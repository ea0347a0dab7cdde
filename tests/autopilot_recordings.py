"""SYNTHETIC recordings for the autopilot tests: session directories whose segments are the plans the advisor
proposes, one after the other, with made-up steps (no GPU ran them). A replay plays only plans its recording holds,
so each recording is built the way the autopilot will walk it: write a segment, ask the advisor (the same code the
autopilot calls) what it proposes on it, write the next segment with that plan — faster, slower or crashed, as the
test needs. The step times are shaped like the real H200 runs (quickstart ~60 s a step with the actor's update
loop-bound, the fused lever ~20 s with generation half of it); memory like a 0.5B model on a 140 GiB GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from tests.replay_fixture import QWEN_05B_SHAPE, plans
from workbench.plan import Plan
from workbench.session import Session
from workbench.store import SAMPLE_COLUMNS, Store

H200_MIB = 143_771.0
T0 = 1_800_000_000.0
STARTUP_S = 15.0  # recorded start-up before a segment's first step
STEPS = 24  # a segment outlasts a loaded machine's advice and apply (~7 s at 10 steps of 20 s at speed 30: too short)
PROMPTS, PROMPT_LEN, RESPONSE_LEN = 256, 46.0, 490.0
QUICKSTART = {"gen": 10.0, "old_log_prob": 10.0, "values": 1.5, "adv": 0.1, "update_critic": 3.0,
              "update_actor": 35.0, "update_weights": 0.4}  # 60 s, the actor's update loop-bound
FUSED = {"gen": 10.0, "old_log_prob": 1.8, "values": 1.0, "adv": 0.1, "update_critic": 2.2, "update_actor": 4.4,
         "update_weights": 0.5}  # 20 s, generation half the step
TRACEBACK = """  File "/root/site/verl/trainer/ppo/v1/trainer_base.py", line 902, in critic_train_mini_batch
    outputs = self.critic_wg.train_batch(batch)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.02 GiB. GPU 0 has a total capacity of 139.81 GiB \
of which 0.88 GiB is free. (SYNTHETIC)"""


class Recording:
    """A synthetic recording written segment by segment."""

    def __init__(self, directory: Path, model: Path):
        self.dir = directory
        self.quickstart = plans(model)["A"]
        directory.mkdir(parents=True, exist_ok=True)
        store = Store(directory)
        store.set_meta(created=T0, kind="live", state="stopped", initial_plan=self.quickstart.to_json(), gpu_count=1,
                       gpu_name="NVIDIA H200", model_shape={**QWEN_05B_SHAPE, "architectures": ["Qwen2ForCausalLM"]},
                       fixture="SYNTHETIC recording for the autopilot tests (tests/autopilot_recordings.py)")
        store.add_event("runtime", "flash-attn is not installed: actor/ref/critic use sdpa attention without "
                                   "remove-padding (SYNTHETIC)", {}, t=T0)
        store.close()
        self.t, self.step = T0, 0

    def segment(self, plan: Plan, phases: dict[str, float], *, mfu: float, reason: str,
                crash: bool = False) -> int:
        """One segment of `plan`: STEPS steps shaped by `phases` (none when it crashed, starting up)."""
        store = Store(self.dir)
        try:
            segment = store.begin_segment(plan.to_json(), reason=reason, resumed_from_step=self.step or None)
            start = self.t
            store.add_event("launched", f"segment {segment} launched ({reason}) (SYNTHETIC)", {"segment": segment},
                            t=start)
            self.t += STARTUP_S
            if crash:
                store.add_event("crash", "verl ran out of GPU memory (SYNTHETIC)",
                                {"segment": segment, "exit_code": 1, "oom": True, "traceback_tail": TRACEBACK},
                                t=self.t)
                store.end_segment(segment, "failed", "out of memory")
            else:
                step_s = sum(phases.values())
                tokens = PROMPTS * (PROMPT_LEN + RESPONSE_LEN)
                for _ in range(STEPS):
                    self.step += 1
                    self.t += step_s
                    store.add_step(segment, self.step, {
                        "timing_s/step": step_s, **{f"timing_s/{p}": s for p, s in phases.items()},
                        "perf/mfu/actor": mfu, "perf/total_num_tokens": tokens, "perf/throughput": tokens / step_s,
                        "prompt_length/mean": PROMPT_LEN, "response_length/mean": RESPONSE_LEN}, t=self.t)
                store.end_segment(segment, "done", "checkpointed for a restart-class change")
            times = np.arange(start, self.t, 1.0)
            samples = pd.DataFrame({c: np.nan for c in SAMPLE_COLUMNS}, index=range(len(times))).assign(
                t=times, node="synthetic", gpu=0, util=60.0, mem_total=H200_MIB, mem_used=0.55 * H200_MIB)
            store.add_samples(samples.to_dict("records"))
            store._db.execute("UPDATE segments SET started_at=?, ended_at=? WHERE id=?", (start, self.t, segment))
            self.t += 1.0
            return segment
        finally:
            store.close()

    def top_change(self, segment: int, rule: str | None = None) -> dict[str, Any]:
        """The change the advisor proposes on `segment` (its top finding with a change, or `rule`'s)."""
        findings = Session(self.dir, read_only=True).advice_findings(segment)
        found = [f for f in findings if f.change and (rule is None or f.rule == rule)]
        assert found, f"the advisor proposes nothing on segment {segment}: {[f.rule for f in findings]}"
        return found[0].change


def keep_rollback_stop(directory: Path, model: Path) -> dict[str, Any]:
    """Round 1's change (the fused lever) runs faster: kept. Round 2's (the rollout-bound one) runs slower than
    its predicted band: rolled back, and the autopilot stops."""
    rec = Recording(directory, model)
    first = rec.segment(rec.quickstart, QUICKSTART, mfu=0.013, reason="start")
    lever = rec.top_change(first)
    fused = rec.quickstart.with_changes(lever)
    second = rec.segment(fused, FUSED, mfu=0.14, reason="restart-class change")
    overlap = rec.top_change(second)
    rec.segment(fused.with_changes(overlap), {**FUSED, "gen": 16.0}, mfu=0.14, reason="restart-class change")
    return {"lever": lever, "overlap": overlap}


def crash_then_safer(directory: Path, model: Path) -> dict[str, Any]:
    """Round 1's change crashes out of memory in the critic's update (SYNTHETIC: as if the model had been wrong);
    after the rollback the advisor offers the safer variant, which runs faster: kept."""
    rec = Recording(directory, model)
    first = rec.segment(rec.quickstart, QUICKSTART, mfu=0.013, reason="start")
    lever = rec.top_change(first)
    rec.segment(rec.quickstart.with_changes(lever), FUSED, mfu=0.14, reason="restart-class change", crash=True)
    safer = rec.top_change(first, rule="crash")
    rec.segment(rec.quickstart.with_changes(safer), {**FUSED, "update_actor": 6.0}, mfu=0.12,
                reason="restart-class change")
    return {"lever": lever, "safer": safer}
