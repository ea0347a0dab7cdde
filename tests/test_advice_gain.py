"""Rules for what remains once training is fast (issue 16), on the real 1.5B recording h200-autopilot-1.5b (H200,
2026-12-01: quickstart 57.0 s a step; fused kernels with checkpointing kept 22.9 s, of which generation 6.0 s, 26 %;
checkpointing off with budgets 8 192 measured 24.7 s and was rolled back): a change is offered on the what-if
model's predicted gain where no share threshold speaks, each with its band and sources; a plan the session measured
not faster is never offered again; advice after a roll-back reads the plan in force."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from workbench import advisor
from workbench.advice.core import Finding, limit
from workbench.session import Session, resolve_recording

RECORDING = "h200-autopilot-1.5b"


@functools.cache
def session() -> Session:
    return Session(resolve_recording(RECORDING), read_only=True)


def findings(segment_id: int | None = None) -> dict[str, Finding]:
    return {f.rule: f for f in session().advice_findings(segment_id)}


def test_generation_below_its_share_is_offered_on_its_predicted_gain_once_training_is_fast():
    fast = findings(3)["rollout-bound"]
    assert fast.evidence["gen_share"] < limit("rollout_share")
    assert fast.change["trainer_mode"] == "colocate_async"
    step = float(session().steps().query("segment_id == 3 and step > 10")["timing_s/step"].median())
    low, high = fast.evidence["predicted_band_s"]
    assert low < fast.evidence["predicted_step_s"] < high
    assert fast.evidence["predicted_gain_s"] >= limit("min_predicted_gain") * step
    assert "colocate_async" in fast.evidence["predicted_sources"]
    assert "Training is fast" in fast.title and "predicts its change saves" in fast.evidence_text
    # Safe: the memory model's upper band stays under the out-of-memory line for the change as offered.
    prediction = session().predict(fast.change)
    assert prediction.fits


def test_generation_below_its_share_is_not_offered_while_training_is_loop_bound():
    assert "rollout-bound" not in findings(1)  # quickstart: 15 % generation, actor MFU 4 %


def test_a_small_predicted_gain_is_not_offered():
    # Synthetic: the recording's fast segment with generation cut to 1 s a step (the rest as measured), so
    # overlapping it is predicted to save far less than a tenth of the step.
    s = session()
    steps = s.steps().copy()
    steps.loc[steps["segment_id"] == 3, "timing_s/gen"] = 1.0
    rules = [f.rule for f in advisor.advise(steps, s.samples(), s.knob_values(3), segment_id=3)]
    assert "rollout-bound" not in rules


def test_a_plan_measured_not_faster_is_not_offered_again(monkeypatch):
    # Synthetic rule: it proposes exactly segment 4's plan (checkpointing off, budgets 8 192), which the session
    # measured at 24.7 s a step against segment 3's 22.9 s; then segment 3's plan from the quickstart (measured
    # faster, and in force again since the roll-back).
    to_segment_4 = {k: v for k, v in session().knob_values(4).items() if v != session().knob_values(3)[k]}
    to_segment_3 = {k: v for k, v in session().knob_values(3).items() if v != session().knob_values(1)[k]}

    def proposes(change):
        def rule(m):
            return Finding("synthetic", "a synthetic rule", {}, "synthetic.", dict(change), "Synthetic.", "low")
        return rule

    monkeypatch.setattr(advisor, "RULES", (proposes(to_segment_4),))
    again = session().advice_findings(3)[0]
    assert again.change == {} and again.evidence["proposed"] == to_segment_4
    assert again.evidence["measured_plan"]["segment_id"] == 4 and "Not offered again: segment 4" in again.expected
    monkeypatch.setattr(advisor, "RULES", (proposes(to_segment_3),))
    faster = session().advice_findings(1)[0]  # measured faster than segment 1: not ruled out by its measurement
    assert "measured_plan" not in faster.evidence and faster.expected.startswith("Already in force (segment 5")


def test_advice_after_a_roll_back_reads_the_plan_in_force():
    # Segment 4 was rolled back; segment 5 (the plan of segment 3) has one step: advice reads segment 3.
    default = session().advice_findings()
    assert default and {f.evidence["segment_id"] for f in default} == {3}
    assert [dataclasses.asdict(f) for f in default] == [dataclasses.asdict(f) for f in session().advice_findings(3)]


def test_after_a_crash_that_was_not_out_of_memory_only_a_lever_is_left_out():
    # h200-hot-lever (H200, 2026-12-01): the rollout-bound change of then (colocate_async, rollout memory 0.6,
    # batched tokens 16 384) crashed twice before verl started (the Ray cluster, not memory). Saving memory (offload,
    # smaller budgets) avoids no such crash: offered that change again, the screen leaves a lever of it out, and
    # says which. (The rule no longer proposes that rollout memory: its KV cache held 36× what the steps needed.)
    from workbench.advice.core import measurements
    from workbench.advice.safety import screen

    s = Session(resolve_recording("h200-hot-lever"), read_only=True)
    before, crashed = s.knob_values(2), s.knob_values(3)
    crashed_change = {k: v for k, v in crashed.items() if before[k] != v}
    assert set(crashed_change) == {"trainer_mode", "rollout_gpu_memory", "rollout_max_batched_tokens"}
    m = measurements(s.steps(), s.samples(), before, segment_id=2, record=advisor.record_of(s))
    screened = screen(m, crashed_change)
    assert screened.change and not any(k.endswith("offload") for k in screened.change)
    assert "left out" in screened.why and screened.left_out
    assert {**before, **screened.change} != crashed
    # The advisor's own offer is not the crashed plan either, and saves no memory for it.
    rollout = {f.rule: f for f in s.advice_findings()}["rollout-bound"]
    assert rollout.change and not any(k.endswith("offload") for k in rollout.change)
    assert {**before, **rollout.change} != crashed


@pytest.mark.parametrize("recording,segment", [("h200-autopilot-1.5b", 1), ("h200-autopilot-1.5b", 3),
                                               ("h200-tuning", 1), ("h200-tuning", 2), ("h200-proof", 1)])
def test_every_offered_change_carries_its_predicted_step_band_and_sources(recording, segment):
    s = Session(resolve_recording(recording), read_only=True)
    offered = [f for f in s.advice_findings(segment) if f.change]
    assert offered
    for f in offered:
        low, high = f.evidence["predicted_band_s"]
        assert low < f.evidence["predicted_step_s"] < high, f.rule
        assert isinstance(f.evidence["predicted_sources"], dict) and "Predicted" in f.expected, f.rule


def test_after_the_fused_round_on_the_05b_workload_the_next_offers_are_colocate_async_then_budgets():
    """h200-hot-lever segment 2 (H200, 2026-12-01): issue 16's 0.5B workload (128 prompts × ≤ 256 + 768 tokens)
    with the autopilot's round 1 in force (fused kernels, dynamic batching 16 384 / 32 768, no gradient
    checkpointing): 14.7 s a step, generation 45 % of it, NVML peak 51 % (generation's), the trainer's 56.4 GiB
    (40 %). The autopilot's next offers, in order: colocate_async (restart-class; not the rollout memory, whose KV
    cache holds 36× what a step needs), then the budgets grown into the trainer's headroom (hot)."""
    from workbench.knobs import ALGORITHM_KNOBS, KNOBS

    s = Session(resolve_recording("h200-hot-lever"), read_only=True)
    offered = [f for f in s.advice_findings(2) if f.change]
    rules = [f.rule for f in offered]
    assert rules.index("rollout-bound") < rules.index("memory-headroom"), rules
    rollout = offered[rules.index("rollout-bound")]
    assert rollout.change["trainer_mode"] == "colocate_async" and "rollout_gpu_memory" not in rollout.change
    budgets = offered[rules.index("memory-headroom")]
    assert set(budgets.change) == {"actor_token_budget", "logprob_token_budget", "critic_token_budget"}
    assert all(KNOBS[k].apply == "hot" for k in budgets.change)
    for f in offered:
        assert not set(f.change) & set(ALGORITHM_KNOBS), f.rule
        s.plan.with_changes(f.change)  # a valid plan (raises PlanError otherwise)
        low, high = f.evidence["predicted_band_s"]
        assert f.evidence["predicted_step_s"] < 14.7 and high < 17, f.rule
