"""The dashboard (widgets/) on CPU, without a browser: built on a replayed session (the assembled recording of
tests/replay_fixture.py, or the bundled real H200 recording h200-proof), refreshed synchronously, its panels read,
and its controls driven the way a user's clicks drive them (widget values and button clicks in Python)."""

from __future__ import annotations

import asyncio
import html
import time

import ipywidgets as W
import numpy as np
import pytest

from tests.replay_fixture import TUNED_CHANGES
from widgets.common import READ_ONLY_REASON, fmt
from widgets.dashboard import Dashboard, page_query
from widgets.knob_editor import as_text
from workbench.session import Session

TIMEOUT = 90.0
SLOW = 50  # recorded seconds per second: ~1 s between steps
PROOF = "h200-proof"
PROOF_HOT = {"actor_token_budget": 32768, "logprob_token_budget": 32768, "ref_token_budget": 32768,
             "critic_token_budget": 32768}  # the recorded hot change of h200-proof (segment 1 → 2)


def wait(predicate, timeout: float = TIMEOUT, every: float = 0.2):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not met in time"
        time.sleep(every)


def edit(dashboard: Dashboard, name: str, value) -> None:
    """What a user does with a knob's control: drag the slider, tick the box, pick the choice, type the text."""
    editor = dashboard.changes.editors[name]
    if isinstance(editor.control, W.Text):
        editor.control.value = as_text(editor.kind, value) if not isinstance(value, str) else value
    else:
        editor.control.value = value


def controls(dashboard: Dashboard) -> list[W.Widget]:
    editors = [e.control for e in dashboard.changes.editors.values() if e.kind != "gpus"]
    editors += [b for e in dashboard.changes.editors.values() if e.kind == "gpus" for b in e._gpu_buttons]
    return [*dashboard.bar.buttons.values(), dashboard.changes.apply_button, dashboard.changes.discard_button,
            dashboard.changes.edit_irrelevant, *editors, *(b for b, _ in dashboard.advisor._buttons)]


def stop(session: Session) -> None:
    if session.state not in ("stopped", "finished", "failed", "lost"):
        session.stop(now=True)


def test_every_panel_shows_the_replayed_session(home):
    session = Session.replay(PROOF, speed=SLOW)
    try:
        session.wait_for_step(4, timeout=TIMEOUT)
        d = Dashboard(session, live=False, window_min=1)  # a 50× replay packs minutes of samples into seconds
        timings = d.refresh()
        assert d.errors.value == ""
        assert set(timings) >= {"read", "SessionBar", "UtilizationPanel", "ExportPanel"}
        # session bar: state, segment, step and the newest step's throughput
        status = d.bar.status.value
        assert "replay of h200-proof" in status and "step <b>" in status and "tokens/s/GPU" in status
        shown_step = d.ctx.feed.steps.iloc[-1]
        assert f"<b>{fmt(shown_step['perf/throughput'], 4)}</b>" in status
        # utilization: one line per GPU with samples, inside a fixed window on a date axis
        gpu_lines = [t for t in d.utilization.fig.data if t.name.startswith("GPU")]
        assert gpu_lines and len(gpu_lines[0].x) > 10 and max(gpu_lines[0].y) > 0
        x0, x1 = d.utilization.fig.layout.xaxis.range
        assert x1 - x0 == pytest.approx(d.utilization.window.value * 60_000)
        # step breakdown: every recorded step, phases stacking up to the step time
        bars = {t.name: t for t in d.steps.fig.data}
        steps = d.ctx.feed.steps  # the rows this refresh read (the replay runs on meanwhile)
        assert len(bars["gen"].x) == min(len(steps), 60) and bars["gen"].y[0] > 0
        total = np.nansum([bars[p].y[0] for p in bars if p != "GPU busy %"])
        assert total == pytest.approx(steps["timing_s/step"].iloc[0], rel=1e-6)
        # throughput chart, segments table, placement grid, events, balance, export, knobs
        assert len(d.throughput.fig.data[1].x) == len(steps)
        assert "<td>1</td>" in d.throughput.segments.value
        assert "✓ planned" in d.placement.grid.value
        assert "launched" in d.events.log.value and "util %" in d.events.balance.value
        assert "actor_rollout_ref.model.path=" in d.export.text.value and "wb-download" in d.export.buttons.value
        budget = d.changes.editors["actor_token_budget"]
        in_force = d.ctx.feed.knob_table.set_index("name")["value"]
        assert isinstance(budget.control, W.IntSlider) and budget.apply == "hot"
        assert budget.control.value == in_force["actor_token_budget"] in (4096, 32768)  # before / after the hot change
        assert "restart" in d.changes.editors["trainer_mode"].label.value
        assert d.changes.editors["ref_token_budget"].control.disabled  # no reference policy in this plan
        assert "no reference policy" in d.changes.editors["ref_token_budget"].message.value
    finally:
        stop(session)


def test_a_slider_change_previews_applies_and_shows_the_hot_apply(home):
    session = Session.replay(PROOF, speed=SLOW, follow=False)
    try:
        session.wait_for_step(2, timeout=TIMEOUT)
        session.pause()
        wait(lambda: session.state == "paused")
        d = Dashboard(session, live=False)
        d.refresh()
        d.changes.edit_irrelevant.value = True  # ref_token_budget: no reference policy runs, but the recording set it
        for name, value in PROOF_HOT.items():
            edit(d, name, value)
        diff = d.changes.diff.value
        assert all(name in diff for name in PROOF_HOT) and "32768" in diff and "next step boundary" in diff
        assert not d.changes.apply_button.disabled
        commands_before = len(session.commands())
        d.changes.apply_button.click()
        commands = session.commands()
        assert len(commands) == commands_before + 1
        assert commands.iloc[-1]["kind"] == "apply" and commands.iloc[-1]["payload"]["changes"] == PROOF_HOT
        assert d.changes.apply_button.disabled  # one change at a time
        session.resume()
        wait(lambda: "applied" in set(session.events()["kind"]))
        wait(lambda: (d.refresh(), "applied hot" in d.changes.progress.value)[1])
        assert "applied" in d.events.log.value and "from step" in d.changes.progress.value
        assert d.changes.editors["actor_token_budget"].current == 32768  # the plan in force now
        assert "No pending changes" in d.changes.diff.value
    finally:
        stop(session)


def test_the_advisor_shows_findings_and_applies_a_proposal(home):
    session = Session.replay(PROOF, speed=SLOW, follow=False)
    try:
        session.wait_for_step(4, timeout=TIMEOUT)
        session.pause()
        wait(lambda: session.state == "paused")
        d = Dashboard(session, live=False)
        d.ctx.feed.wait_for_advice()  # advice runs in its own thread; the next refresh shows it
        d.refresh()
        assert d.ctx.feed.findings and "evidence:" in d.advisor.list.children[0].children[0].value
        assert "advice as of" in d.advisor.note.value
        button, finding = d.advisor._buttons[0]
        before = len(session.commands())
        button.click()
        commands = session.commands()
        assert len(commands) == before + 1 and commands.iloc[-1]["payload"]["changes"] == finding.change
        assert f"advice: {finding.title}" in html.unescape(d.changes.progress.value)
    finally:
        stop(session)


def test_an_invalid_value_marks_its_widget_and_queues_nothing(recording, home):
    session = Session.replay(recording, speed=SLOW)
    try:
        session.pause()
        wait(lambda: session.state == "paused")
        d = Dashboard(session, live=False)
        d.refresh()
        before = len(session.commands())
        d.changes.edit_irrelevant.value = True
        edit(d, "use_dynamic_bsz", True)
        edit(d, "actor_token_budget", 100)  # below prompt + response length
        editor = d.changes.editors["actor_token_budget"]
        assert "wb-knob-bad" in editor.widget._dom_classes and "actor_token_budget" in editor.message.value
        assert d.changes.apply_button.disabled and "Nothing can be applied" in d.changes.diff.value
        edit(d, "nccl_env", "not a pair")  # text the knob's parser can't read
        assert "wb-knob-bad" in d.changes.editors["nccl_env"].widget._dom_classes
        assert d.changes.apply() is None
        assert len(session.commands()) == before
        d.changes.discard_button.click()
        assert "wb-knob-bad" not in editor.widget._dom_classes and "No pending changes" in d.changes.diff.value
    finally:
        stop(session)


def test_a_restart_class_change_shows_its_progress_to_the_first_resumed_step(recording, home):
    session = Session.replay(recording, speed=SLOW)
    try:
        session.pause()
        wait(lambda: session.state == "paused")
        d = Dashboard(session, live=False)
        d.refresh()
        d.changes.edit_irrelevant.value = True  # the tuned plan also sets micro batches that dynamic batching ignores
        for name, value in TUNED_CHANGES.items():
            edit(d, name, value)
        assert "checkpoint at the next step boundary → relaunch" in d.changes.diff.value
        d.changes.apply_button.click()
        session.resume()
        wait(lambda: (d.refresh(), "✓ first resumed step" in d.changes.progress.value)[1])
        progress = d.changes.progress.value
        for stage in ("checkpoint at the step boundary", "relaunch verl", "verl start-up"):
            assert f"✓ {stage}" in progress
    finally:
        stop(session)


def test_a_viewer_sees_everything_and_controls_nothing_until_the_token(recording, home):
    session = Session.replay(recording, speed=SLOW)
    try:
        session.wait_for_step(1, timeout=TIMEOUT)
        viewer = Session.attach(session.dir, read_only=True)
        d = Dashboard(viewer, live=False)
        d.refresh()
        assert all(c.disabled for c in controls(d))
        assert d.changes.apply_button.tooltip == READ_ONLY_REASON and html.escape(READ_ONLY_REASON) in d.bar.message.value
        assert d.token_row.layout.display != "none"
        assert len(d.utilization.fig.data) > 1 and len(d.steps.fig.data[0].x) >= 1  # charts all the same
        token = (session.dir / "operator.token").read_text().strip()
        d.token.value = token
        d.unlock.click()
        d.refresh()
        assert d.session.is_operator and not d.changes.editors["rollout_gpu_memory"].control.disabled
        assert d.token_row.layout.display == "none"
    finally:
        stop(session)


def test_the_page_passes_session_and_token_in_its_query(recording, home):
    assert page_query("session=abc&token=t0k") == {"session": "abc", "token": "t0k"}
    session = Session.replay(recording, speed=SLOW)
    try:
        token = (session.dir / "operator.token").read_text().strip()
        viewer = Dashboard.from_page(f"session={session.id}", live=False)
        assert not viewer.session.is_operator
        operator = Dashboard.from_page(f"session={session.id}&token={token}", live=False)
        assert operator.session.is_operator and operator.session.id == session.id
        wrong = Dashboard.from_page(f"session={session.id}&token=not-the-token", live=False)
        assert not wrong.session.is_operator and wrong.changes.apply_button.disabled
        assert "not this session's operator token" in html.unescape(wrong.unlock_message.value)
    finally:
        stop(session)


def test_the_live_task_updates_the_charts_without_a_cell_run(recording, home):
    session = Session.replay(recording, speed=SLOW)
    try:
        session.wait_for_step(1, timeout=TIMEOUT)

        async def watch() -> tuple[int, int]:
            d = Dashboard(session)  # a running loop: the update task starts by itself
            first = len(d.steps.fig.data[0].x)
            deadline = time.time() + TIMEOUT
            while len(d.steps.fig.data[0].x) <= first and time.time() < deadline:
                await asyncio.sleep(0.5)
            d.close()
            return first, len(d.steps.fig.data[0].x)

        first, later = asyncio.run(watch())
        assert later > first
    finally:
        stop(session)


def test_start_follows_a_new_session_like_the_ended_one(recording, home):
    session = Session.replay(recording, speed=200, follow=False)
    started = None
    try:
        wait(lambda: session.state == "finished")
        d = Dashboard(session, live=False)
        d.refresh()
        start = d.bar.buttons["start"]
        assert not start.disabled and d.bar.buttons["pause"].disabled
        start.click()
        wait(lambda: "start: done" in d.ctx.notice)
        started = d.session
        assert started.id != session.id and started.meta["recording"] == session.meta["recording"]
        d.refresh()
        assert started.id in d.bar.status.value and f"?session={started.id}" in d.ctx.notice
    finally:
        stop(session)
        if started is not None:
            stop(started)
