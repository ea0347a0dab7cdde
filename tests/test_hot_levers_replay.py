"""The new hot levers through the step boundary on a replay of the real H200 recording h200-tuning.

The recording's operator applied the advisor's fused-kernel lever (fused kernels + dynamic batching + budgets) as a
restart on 2026-12-01; those knobs are hot now, so the same change is applied at the next step boundary of the same
run: the replay goes on in the recorded segment of that plan (as a live run goes on with it in force), without a
launch. A replay plays only plans it holds (the same rule as for hot budget changes): its preview refuses a hot change it
has no recorded segment for, naming that, and nothing is queued.
"""

from __future__ import annotations

import pytest

from workbench import verl_config
from workbench.plan import PlanError
from workbench.recordings import recorded_plans
from workbench.replay import NO_RECORDED_SEGMENT, Recording
from workbench.session import Session, resolve_recording

pytestmark = pytest.mark.slow

SPEED = 20  # recorded seconds per second: ~60 s quickstart steps in ~3 s
STARTUP_SPEED = 100  # verl's recorded start-up (~350 s) in ~4 s
TIMEOUT = 120.0
# What the recorded operator applied after step 3 (segment 1 -> 2 of the recording).
FUSED_LEVER = {"fused_kernels": True, "use_dynamic_bsz": True, "actor_token_budget": 16384,
               "logprob_token_budget": 32768, "ref_token_budget": 32768, "critic_token_budget": 32768}


def test_the_fused_lever_is_applied_hot_on_a_replay(tmp_path):
    # This process's first checks import verl and compose the recording's plans (seconds each on a loaded machine):
    # paid before the replay starts, whose quickstart segment ends ~6 s after its step 2. A change sent before its
    # last step ends is applied (the replay holds the step while the change is on its way: test_replay_end).
    verl_config.warm()
    recorded_plans(resolve_recording("h200-tuning")).knobs  # noqa: B018 (read for its cost)
    session = Session.replay("h200-tuning", speed=SPEED, startup_speed=STARTUP_SPEED, follow=False, root=tmp_path)
    try:
        assert session.preview(FUSED_LEVER).mode == "hot"
        assert session.preview({"gradient_checkpointing": False}).mode == "hot"
        session.wait_for_step(2, timeout=TIMEOUT)
        before = session.steps()
        handle = session.apply(FUSED_LEVER).wait(timeout=TIMEOUT)
        assert (handle.mode, handle.state) == ("hot", "applied"), handle
        session.wait_for_step(handle.step + 1, timeout=TIMEOUT)
        # At 20x the fused plan's last recorded steps end the run within seconds: held at a step boundary, the replay
        # still runs for the unplayable change below, however long this process's reads and preview take (CI, clean
        # clone at load 3: the replay had ended, and the change got "the replay has ended" instead).
        session.pause()
        session.wait_until(lambda s: s.state == "paused", timeout=TIMEOUT, poll=0.1)

        events = session.events()
        applied = events[events["kind"] == "applied"].iloc[-1]
        assert applied["data"]["mode"] == "hot" and applied["data"]["recorded_segment"] == 2
        assert (events["kind"] == "launched").sum() == 1  # one run: no checkpoint, no relaunch
        steps = session.steps()
        after = steps[steps["step"] >= handle.step]
        # From the applied step on the replay plays the recorded fused plan's steps, in order (the recorded one after
        # its restart first, 40 s with its warm-up, then ~20 s); before it, quickstart's (~60-70 s).
        recorded = Recording(resolve_recording("h200-tuning")).segments[1].steps
        assert list(after["timing_s/step"]) == [row["metrics"]["timing_s/step"] for row in recorded[:len(after)]]
        assert after["timing_s/step"].iloc[-1] < 0.5 * before["timing_s/step"].iloc[1:].min()
        assert after["segment_id"].min() > before["segment_id"].max()

        # A hot change no recorded segment ran: refused at once by the preview (its mode kept, the recorded plans
        # offered instead), and apply queues nothing.
        unplayable = {"gradient_checkpointing": False}
        preview = session.preview(unplayable)
        assert preview.mode == "hot" and not preview.ok and preview.offers
        assert NO_RECORDED_SEGMENT in preview.problems["plan"]
        queued = len(session.commands())
        with pytest.raises(PlanError, match=NO_RECORDED_SEGMENT.split(":")[0]):
            session.apply(unplayable)
        assert len(session.commands()) == queued
        assert session.plan.knob_values()["gradient_checkpointing"] is True
    finally:
        session.stop(now=True)
