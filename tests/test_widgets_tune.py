"""The dashboard's Tune panel (widgets/tune.py) on CPU, on a replay of the bundled real H200 recording h200-proof
(the test double): disabled with the reason for a viewer; for the operator, no knob chosen is refused with a message
and starts nothing; with knobs chosen Tune runs `Session.tune` in its own thread, and stopping the session ends it
(done, or failed with its message in one line)."""

from __future__ import annotations

import html

import pytest

from tests.polling import wait_until
from widgets.common import READ_ONLY_REASON
from widgets.dashboard import Dashboard
from widgets.tune import AUTOPILOT_RUNNING, NO_KNOB, RUNNING_REASON
from workbench import Session

pytestmark = pytest.mark.slow  # one replay serves the module

TIMEOUT = 60.0
PROOF = "h200-proof"


def wait(predicate, timeout: float = TIMEOUT) -> None:
    wait_until(predicate, timeout)


@pytest.fixture
def replay(home):
    session = Session.replay(PROOF, speed=50, follow=False)
    yield session
    if session.state not in ("stopped", "finished", "failed", "lost"):
        session.stop(now=True, timeout=60)


def test_viewer_sees_tune_disabled_with_the_reason(replay):
    d = Dashboard(Session.attach(replay.dir, read_only=True), live=False)
    panel = d.tune
    assert "wb-tune" in panel.widget._dom_classes and "wb-tune-run" in panel.button._dom_classes
    names = [name for _, name in panel.knobs.options]
    assert names and "actor_token_budget (hot)" in [label for label, _ in panel.knobs.options]
    hot = [label.endswith("(hot)") for label, _ in panel.knobs.options]
    assert hot == sorted(hot, reverse=True)  # hot knobs first
    assert all(c.disabled for c in (panel.knobs, panel.steps, panel.trials, panel.button))
    assert panel.button.tooltip == READ_ONLY_REASON
    panel.run()  # a click that got through anyway: refused, nothing started
    assert panel.thread is None and html.escape(READ_ONLY_REASON) in panel.status.value


def test_operator_tunes_and_stop_ends_the_tune(replay):
    d = Dashboard(replay, live=False)
    panel = d.tune
    assert not panel.button.disabled and panel.button.tooltip == ""
    panel.button.click()  # no knob chosen
    assert panel.thread is None and html.escape(NO_KNOB) in panel.status.value and "wb-tune-refused" in panel.status.value

    panel.knobs.value = ("actor_token_budget",)
    panel.steps.value, panel.trials.value = 1, 2
    panel.button.click()
    assert panel.thread is not None and panel.thread.is_alive()
    assert "wb-tune-running" in panel.status.value and "actor_token_budget" in panel.status.value
    assert panel.button.disabled and panel.button.tooltip == RUNNING_REASON
    panel.button.click()  # a second click while it runs starts no second tune
    thread = panel.thread

    replay.stop(now=True, timeout=60)
    thread.join(TIMEOUT)
    assert not thread.is_alive()
    d.refresh()
    status = panel.status.value
    assert "wb-tune-done" in status or "wb-tune-failed" in status, status
    assert "\n" not in status and len(status.split(": ", 1)[-1]) > 10  # the outcome, in one line
    if "wb-tune-done" in status:
        assert "ended because" in status and "<table" in panel.result.value


@pytest.mark.slow
def test_viewer_cannot_start_the_autopilot(replay):
    d = Dashboard(Session.attach(replay.dir, read_only=True), live=False)
    control = d.tune.autopilot
    assert "wb-autopilot-run" in control.button._dom_classes
    assert control.button.disabled and control.button.tooltip == READ_ONLY_REASON and control.stop_button.disabled
    control.run()  # a click that got through anyway: refused, nothing started
    assert control.thread is None and "wb-autopilot-refused" in control.status.value
    assert html.escape(READ_ONLY_REASON) in control.status.value


@pytest.mark.slow
def test_operator_starts_the_autopilot_and_stop_ends_it(replay):
    d = Dashboard(replay, live=False)
    control, tune = d.tune.autopilot, d.tune
    assert not control.button.disabled and control.stop_button.disabled
    control.rounds.value, control.minutes.value = 2, 5
    control.button.click()
    assert control.thread is not None and control.thread.is_alive()
    assert "wb-autopilot-running" in control.status.value and "up to 2 round(s) in 5 min" in control.status.value
    assert control.button.disabled and not control.stop_button.disabled
    assert tune.button.disabled and tune.button.tooltip == AUTOPILOT_RUNNING  # one of the two at a time
    control.stop_button.click()
    control.thread.join(TIMEOUT)
    assert not control.thread.is_alive()
    d.refresh()
    assert "wb-autopilot-done" in control.status.value, control.status.value
    assert "ended because stopped by the operator" in control.status.value and "\n" not in control.status.value
    assert not control.button.disabled and control.stop_button.disabled and not tune.button.disabled
