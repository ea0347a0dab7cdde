"""Safe proposals and failures as measurements (issue 16), on the ≈1.5B session the issue describes: a plan whose
peak, band included, crosses the out-of-memory line is never proposed — the part that fits is, saying what was left
out — and after the crash the advisor names it, offers the safer variant, and never offers the crashed plan (or
one needing more memory where it crashed) again.

The session's frames are SYNTHETIC (tests/issue16_session.py), built from the real figures the issue quotes."""

from __future__ import annotations

import pytest

from tests import issue16_session as issue16
from tests.memory_sources import ISSUE16_CRASH_HELD_GIB, ISSUE16_LEVER, issue16_knobs
from workbench import memory, memory_fit
from workbench.advice.record import crash_phase
from workbench.advice.safety import blocking_failure, same_plan, screen
from workbench.advisor import advise, measurements


def findings(crashed: bool):
    f = issue16.frames(crashed)
    record = f.record()
    return advise(f.steps, f.samples, f.knobs[1], segment_id=1, record=record), record, f


def offered(record, f):
    return record.predict_memory({**issue16.frames().knobs[1], **f.change})


def test_crash_phase_is_read_off_the_traceback():
    assert crash_phase(issue16.TRACEBACK) == "update_critic"
    assert crash_phase('  File "vllm_async_server.py", line 1400, in launch_servers') == "gen"
    assert crash_phase("RuntimeError: something else") == ""


def test_before_the_crash_the_lever_is_offered_only_in_the_part_that_fits():
    found, record, frames = findings(crashed=False)
    lever = next(f for f in found if f.rule == "logprob-loop")
    whole = record.predict_memory({**frames.knobs[1], **ISSUE16_LEVER})
    assert not whole.fits  # the issue's plan: the 1.5B critic without checkpointing at 32 768 tokens
    assert lever.change and lever.change["fused_kernels"] is True
    assert not same_plan({**frames.knobs[1], **lever.change}, {**frames.knobs[1], **ISSUE16_LEVER})
    part = offered(record, lever)
    assert part.fits and part.upper_gib < part.oom_line_gib
    assert "Gradient checkpointing stays on: without it the peak would be" in lever.expected
    assert lever.change.get("gradient_checkpointing", True) is True


def test_the_whole_lever_is_screened_down_to_the_fastest_part_that_fits():
    _, record, frames = findings(crashed=False)
    m = measurements(frames.steps, frames.samples, frames.knobs[1], segment_id=1, record=record)
    lever = {k: v for k, v in ISSUE16_LEVER.items() if frames.knobs[1][k] != v}
    screened = screen(m, lever)
    assert screened.change and not screened.whole and screened.left_out
    assert screened.prediction.fits and screened.prediction.step_s < m.cost.step_s
    assert screened.why.startswith("Offered in part (") and "over the out-of-memory line" in screened.why
    # Of the parts that fit, the fastest: checkpointing off with a smaller critic budget beats checkpointing on.
    kept = m.predicted({**lever, "gradient_checkpointing": True})
    assert screened.prediction.step_s <= kept.step_s


def test_no_finding_proposes_a_plan_whose_band_crosses_the_oom_line():
    for crashed in (False, True):
        found, record, _ = findings(crashed)
        for f in found:
            if f.change:
                assert offered(record, f).fits, (f.rule, f.change)


def test_after_the_crash_the_failure_is_named_with_the_safer_variant():
    found, record, frames = findings(crashed=True)
    crash = found[0]
    assert crash.rule == "crash" and crash.severity == "high"
    assert "ran out of memory" in crash.title and "critic's update" in crash.title
    assert crash.evidence["failed_segment"] == 2 and crash.evidence["phase"] == "update_critic"
    assert "130.90 GiB" in crash.evidence["traceback_last_line"]
    assert crash.change and "safer variant" in crash.expected
    target = {**frames.knobs[1], **crash.change}
    assert not same_plan(target, frames.knobs[2]) and blocking_failure(record, target) is None
    assert offered(record, crash).fits


def test_a_crashed_plan_is_never_offered_again():
    found, record, frames = findings(crashed=True)
    for f in found:
        assert not same_plan({**frames.knobs[1], **f.change}, frames.knobs[2]), f.rule
    assert blocking_failure(record, frames.knobs[2]).segment_id == 2


def test_a_plan_needing_more_memory_where_it_crashed_is_never_offered():
    _, record, frames = findings(crashed=True)
    bigger = {**frames.knobs[2], "critic_token_budget": 65536}
    assert blocking_failure(record, bigger).segment_id == 2
    safer = {**frames.knobs[2], "gradient_checkpointing": True}
    assert blocking_failure(record, safer) is None


def test_the_crash_is_a_lower_bound_for_the_memory_model():
    # A plan the prior model thinks fits is made to need at least the GPU's memory once it has crashed.
    shape = memory.KNOWN_SHAPES["qwen2.5-1.5b"]
    plan = issue16_knobs(**{**ISSUE16_LEVER, "critic_token_budget": 16384})
    prior = memory.predict_memory(plan, shape, 140.4)
    assert prior.phase_gib("update_critic") < 130.0
    crash = memory_fit.Crash(7, plan, "update_critic")
    fitted = memory_fit.calibrate([], shape, 140.4, [crash])
    after = memory.predict_memory(plan, shape, 140.4, coefficients=fitted.coefficients)
    assert after.train_peak_gib >= 140.4 and not after.fits
    assert "segment 7 ran out of memory in update_critic" in " ".join(fitted.why)


def test_the_issue_16_crash_was_predicted_by_the_model_that_scales():
    # Issue 16: the old model said 109 of 140 GiB ("no OOM"); the crash held 130.9 GiB in the trainer process.
    lever = issue16_knobs(**ISSUE16_LEVER)
    p = memory.predict_memory(lever, memory.KNOWN_SHAPES["qwen2.5-1.5b"], 140.4,
                              sequences=memory.Sequences(46, 936, 128, True))
    assert p.phase_gib("update_critic") >= ISSUE16_CRASH_HELD_GIB - 8.0  # allocated, the process held reserved
    assert p.train_peak_gib > p.oom_line_gib and not p.fits


@pytest.mark.parametrize("rule", ["crash"])
def test_the_crash_rule_is_silent_without_a_crash(rule):
    found, _, _ = findings(crashed=False)
    assert rule not in [f.rule for f in found]


def test_a_critic_of_another_model_is_sized_by_its_own_dimensions():
    # A 1.5B critic beside a 0.5B actor (dims as their configs say): the critic's passes and states grow, the
    # actor's old log-prob pass doesn't.
    small, large = memory.KNOWN_SHAPES["qwen2.5-0.5b"], memory.KNOWN_SHAPES["qwen2.5-1.5b"]
    plan = issue16_knobs()
    same = memory.predict_memory(plan, small, 140.4)
    mixed = memory.predict_memory(plan, small, 140.4, critic_shape=large)
    assert mixed.phase_gib("update_critic") - same.phase_gib("update_critic") > \
        12 * (large.value_params - small.value_params) / 2**30
    states = 12 * (large.value_params - small.value_params) / 2**30  # the critic's idle fp32 weights and Adam
    assert mixed.phase_gib("old_log_prob") - same.phase_gib("old_log_prob") == pytest.approx(states, rel=1e-6)
    model = memory_fit.MemoryModel.fit(small, [], 140.4, critic_shape=large)
    assert model.predict(plan, 140.4).phase_gib("update_critic") == pytest.approx(mixed.phase_gib("update_critic"))
    assert memory_fit.MemoryModel.fit(small, [], 140.4, critic_shape=small).critic_shape is None


def test_checkpointing_off_comes_with_the_budgets_that_make_room_for_it():
    # SYNTHETIC: issue 16's steps labelled with the fused lever's plan, checkpointing kept (what round 1 applies at
    # ≈1.5B): without checkpointing the 32 768-token critic pass doesn't fit, with a smaller budget it does.
    from workbench.advice.training import checkpointing_headroom

    frames = issue16.frames(crashed=False)
    fused = issue16_knobs(**{**ISSUE16_LEVER, "gradient_checkpointing": True})
    m = measurements(frames.steps, frames.samples, fused, segment_id=1, record=frames.record())
    f = checkpointing_headroom(m)
    assert f.change["gradient_checkpointing"] is False
    assert f.change["critic_token_budget"] < fused["critic_token_budget"]
    assert "smaller micro batches make room" in f.title
    assert m.predicted(f.change).fits and not m.predicted({"gradient_checkpointing": False}).fits
