"""Steering a replay (issue 15): a replay refuses at once what it can't play and names what it can; a pause of
yours leaves the recorded story going; the recording's next change given early carries the story on; a change of
your own takes control from the recorded operator.

On the bundled h200-tuning recording (quickstart → the advisor's change, a restart → a hot critic budget → stop),
at 50× real time under a private VERL_WORKBENCH_HOME."""

from __future__ import annotations

import pytest

from workbench.recordings import NO_RECORDED_SEGMENT, bundled, describe, no_segment_words, recorded_plans
from workbench.recorded_operator import FOLLOWED_YOU, TOOK_CONTROL
from workbench.replay import Recording
from workbench.plan import PlanError
from workbench.session import Session, resolve_recording

pytestmark = pytest.mark.slow

TUNING = "h200-tuning"
SPEED = 50
STARTUP_SPEED = 500  # verl's recorded start-up (233 s) in ~0.5 s: each test acts from step 1 on
TIMEOUT = 120.0
# The recorded operator's changes: the advisor's proposal after step 4 (a restart), the critic budget after step 10.
ADVICE = {"fused_kernels": True, "use_dynamic_bsz": True, "actor_token_budget": 16384, "logprob_token_budget": 32768,
          "ref_token_budget": 32768, "critic_token_budget": 32768}
CRITIC = {"critic_token_budget": 65536}


def wait(session: Session, predicate, timeout: float = TIMEOUT) -> Session:
    return session.wait_until(predicate, timeout=timeout, poll=0.1)


def texts(session: Session) -> list[str]:
    return session.events()["text"].tolist()


def user_and_operator(session: Session) -> tuple[list[str], list[str]]:
    """The kinds of the commands the user gave and those the recorded operator gave (the supervisor's own left out)."""
    commands = session.commands()
    commands = commands[~commands["kind"].str.startswith("runner.")]
    by_operator = ["recorded_command" in payload for payload in commands["payload"]]
    kinds = commands["kind"].tolist()
    return ([k for k, o in zip(kinds, by_operator) if not o], [k for k, o in zip(kinds, by_operator) if o])


def test_the_recordings_are_listed_with_what_they_hold():
    assert {"h200-proof", "h200-tuning", "h200-lora-critic-sync"} <= set(bundled())
    assert describe(TUNING) == "1 × NVIDIA H200, 2026-12-01: 12 steps in 3 segments"


def test_a_recording_offers_the_changes_to_its_other_plans():
    plans = recorded_plans(resolve_recording(TUNING))
    recording = Recording(resolve_recording(TUNING))
    quickstart = recording.segments[0]
    from workbench.plan import Plan

    current = Plan.from_json(quickstart.plan_json)
    offers = plans.offers(current)
    advice = {k: v for k, v in ADVICE.items() if current.knob_values()[k] != v}  # what the recorded change changed
    assert advice == {"fused_kernels": True, "use_dynamic_bsz": True, "logprob_token_budget": 32768,
                      "ref_token_budget": 32768}
    assert offers == [advice, {**advice, **CRITIC}]
    assert offers == recording.alternatives(current)
    assert plans.takes(current.with_changes(ADVICE)) and not plans.takes(current.with_changes(CRITIC))
    words = no_segment_words(offers)
    assert words.startswith(NO_RECORDED_SEGMENT) and "fused_kernels=True" in words and "; or " in words


def test_your_pause_keeps_the_story_going_and_its_next_change_given_early_carries_it_on(home):
    session = Session.replay(TUNING, speed=SPEED, startup_speed=STARTUP_SPEED)
    session.wait_for_step(1, timeout=TIMEOUT)
    session.pause()
    wait(session, lambda s: s.state == "paused")
    paused_at = session.last_step()
    assert paused_at < 4  # before the recorded operator's change (after step 4)
    session.apply(ADVICE)  # the recording's next change, earlier than recorded
    session.resume()
    wait(session, lambda s: s.state == "stopped", timeout=3 * TIMEOUT)  # the recorded stop: the whole story

    assert TOOK_CONTROL not in texts(session) and FOLLOWED_YOU in texts(session)
    per_segment = session.steps().groupby("segment_id")["step"].count().tolist()
    assert per_segment == [paused_at, 6, 2]  # every recorded step of the advised plans, shifted earlier
    user, operator = user_and_operator(session)
    assert user == ["pause", "resume", "apply"] or user == ["pause", "apply", "resume"]
    assert operator == ["apply", "stop"]  # the critic budget and the stop, where the shifted story gives them
    assert session.knob_values()["critic_token_budget"] == 65536


def test_a_change_of_your_own_takes_control_from_the_recorded_operator(home):
    session = Session.replay(TUNING, speed=SPEED, startup_speed=STARTUP_SPEED)
    session.wait_for_step(1, timeout=TIMEOUT)
    session.apply({**ADVICE, **CRITIC})  # the recording's last plan at once: not its next change
    wait(session, lambda s: s.state == "finished", timeout=3 * TIMEOUT)  # its 2 recorded steps, then the run ends
    assert TOOK_CONTROL in texts(session) and FOLLOWED_YOU not in texts(session)
    user, operator = user_and_operator(session)
    assert user == ["apply"] and operator == []
    assert session.steps().groupby("segment_id")["step"].count().tolist()[-1] == 2


def test_a_replay_refuses_at_once_what_it_cannot_play_and_one_change_it_offers_applies(home):
    session = Session.replay(TUNING, speed=SPEED, startup_speed=STARTUP_SPEED, follow=False)
    session.wait_for_step(1, timeout=TIMEOUT)
    session.pause()  # at 50× the quickstart's 4 recorded steps end the run within seconds
    wait(session, lambda s: s.state == "paused")
    before = len(session.commands())
    preview = session.preview({"actor_token_budget": 8192})  # valid, but no recorded segment ran it
    assert not preview.ok and preview.mode == "hot"  # what it would be, where it could be played
    assert preview.problems["plan"].startswith(NO_RECORDED_SEGMENT) and "fused_kernels=True" in preview.problems["plan"]
    assert preview.offers == session.recorded_changes() and len(preview.offers) == 2
    with pytest.raises(PlanError):
        session.apply({"actor_token_budget": 8192})
    assert len(session.commands()) == before  # nothing queued: never "accepted", then refused
    handle = session.apply(preview.offers[0])  # the advisor's change, one the recording holds
    session.resume()
    assert handle.wait(timeout=TIMEOUT).state in ("applied", "resumed")  # hot or restart: the knob table says
    assert session.knob_values()["fused_kernels"] is True
    assert CRITIC in session.recorded_changes()  # from the plan in force now: the recording's next plan, among others
