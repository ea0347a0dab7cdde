"""The dashboard's Tune panel (widgets/tune.py) on CPU, on a replay of the bundled real H200 recording h200-proof
(the test double): disabled with the reason for a viewer; for the operator, no knob chosen is refused with a message
and starts nothing; with knobs chosen Tune runs `Session.tune` in its own thread, and stopping the session ends it
(done, or failed with its message in one line)."""

from __future__ import annotations

import html
import time

import pytest

from widgets.common import READ_ONLY_REASON
from widgets.dashboard import Dashboard
from widgets.tune import NO_KNOB, RUNNING_REASON
from workbench import Session

TIMEOUT = 60.0
PROOF = "h200-proof"


def wait(predicate, timeout: float = TIMEOUT) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(0.2)


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
