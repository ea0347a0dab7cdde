"""The dashboard (widgets/) on CPU, without a browser: built on a replayed session, refreshed synchronously, its
panels read, and its controls driven the way a user's clicks drive them (widget values and button clicks in Python).

One replay of the bundled real H200 recording h200-proof (without its recorded operator: every command is the
tests') serves the module, in file order: it waits paused at step 4 for the read-only tests, then takes the
recording's hot change and its restart-class change, then plays to its end; Start begins a new replay of it, on
which the live-update test watches the charts grow.
(A replay's supervisor takes ~10–30 s to start on a loaded 2-core machine: one for the module, not one per test.)
"""

from __future__ import annotations

import asyncio
import html
import threading
import time
from types import SimpleNamespace

import ipywidgets as W
import numpy as np
import pytest

from tests.polling import wait_until
from widgets.common import READ_ONLY_REASON, fmt
from widgets.dashboard import Dashboard, page_query
from widgets.knob_editor import as_text
from workbench import Session

pytestmark = pytest.mark.slow  # one replay serves the module

TIMEOUT = 120.0
SLOW = 50  # recorded seconds per second: ~0.3 s between steps, ~3 s for verl's recorded start-up
PROOF = "h200-proof"
# The recording's hot change (segment 1 → 2) and restart-class change (segment 2 → 3).
PROOF_HOT = {"actor_token_budget": 32768, "logprob_token_budget": 32768, "ref_token_budget": 32768,
             "critic_token_budget": 32768}
PROOF_RESTART = {"critic_lora_rank": 8, "trainer_mode": "colocate_async"}
ENDED = ("stopped", "finished", "failed", "lost")


def wait(predicate, timeout: float = TIMEOUT, every: float = 0.2):
    wait_until(predicate, timeout, every)


def refreshed_until(d: Dashboard, predicate, timeout: float = TIMEOUT) -> None:
    wait(lambda: (d.refresh(), predicate())[1], timeout)


def edit(d: Dashboard, name: str, value) -> None:
    """What a user does with a knob's control: drag the slider, tick the box, pick the choice, type the text."""
    editor = d.changes.editors[name]
    if isinstance(editor.control, W.Text):
        editor.control.value = value if isinstance(value, str) else as_text(editor.kind, value)
    else:
        editor.control.value = value


def controls(d: Dashboard) -> list[W.Widget]:
    editors = [e.control for e in d.changes.editors.values() if e.kind != "gpus"]
    editors += [b for e in d.changes.editors.values() if e.kind == "gpus" for b in e._gpu_buttons]
    return [*d.bar.buttons.values(), d.changes.apply_button, d.changes.discard_button, d.changes.edit_irrelevant,
            *editors, *(b for b, _ in d.advisor._buttons), *d.changes.recorded.buttons.children]


@pytest.fixture(scope="module")
def sessions() -> dict:
    """Sessions one test starts for a later one (the Start button's new session, for the live-update test)."""
    return {}


@pytest.fixture
def started(proof, sessions) -> Session:
    """The session the Start test began; run alone, a new replay like it (the module's fixture ends both)."""
    if "started" not in sessions:
        sessions["started"] = Session.replay(PROOF, speed=SLOW, follow=False)
    return sessions["started"]


def end(session: Session) -> None:
    """Stop a session now; where its supervisor does not answer (still starting on a loaded machine), end it."""
    try:
        session.stop(now=True, timeout=60)
    except (TimeoutError, RuntimeError):
        from workbench.procs import kill_tree

        pid = session.meta.get("supervisor_pid")
        if pid is not None:
            kill_tree(int(pid), grace_s=5)


@pytest.fixture(scope="module")
def proof(tmp_path_factory):
    """h200-proof replayed without its recorded operator, paused at step 4, under a private workbench home."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VERL_WORKBENCH_HOME", str(tmp_path_factory.mktemp("home")))
        session = Session.replay(PROOF, speed=SLOW, follow=False)
        try:
            session.wait_for_step(4, timeout=TIMEOUT)
            session.pause()
            wait(lambda: session.state == "paused")
            yield session
        finally:
            for row in Session.list().itertuples():
                if row.state not in ENDED:
                    end(Session.attach(row.path))


def test_every_panel_shows_the_session(proof):
    d = Dashboard(proof, live=False, window_min=15)  # 15 recorded minutes: 18 s of a 50× replay
    timings = d.refresh()
    assert d.errors.value == ""
    assert set(timings) >= {"read", "SessionBar", "UtilizationPanel", "ExportPanel"}
    # session bar: state, segment, step and the newest step's throughput
    status = d.bar.status.value
    assert "paused" in status and "replay of h200-proof" in status and "step <b>" in status
    assert f"<b>{fmt(d.ctx.feed.steps.iloc[-1]['perf/throughput'], 4)} last step · " in status
    assert "segment median</b>" in status and "Resume goes on" in d.bar.hint.value  # what the user can do now
    assert not d.bar.buttons["resume"].disabled and d.bar.buttons["pause"].disabled
    # utilization: one line per GPU with samples, over the last 15 minutes of the session's (recorded) time
    chart = d.utilization.chart
    gpu_lines = [t for t in chart.traces if t["name"].startswith("GPU")]
    assert gpu_lines and len(gpu_lines[0]["x"]) > 10 and np.nanmax(gpu_lines[0]["y"]) > 0
    x0, x1 = chart.figure_layout["xaxis"]["range"]
    assert x1 - x0 == pytest.approx(15.0) and x1 == pytest.approx(gpu_lines[0]["x"][-1], abs=0.05)
    assert chart.figure_layout["xaxis"]["title"]["text"] == "recorded minutes since the start (replayed at ×50)"
    d.utilization.metric.value = "mem_used"
    d.refresh()
    gpu_lines = [t for t in d.utilization.chart.traces if t["name"].startswith("GPU")]
    assert "memory used" in d.utilization.chart.figure_layout["title"]["text"] and np.nanmax(gpu_lines[0]["y"]) < 200
    # step breakdown: every step, phases stacking up to the step time, GPU-busy share
    bars = {t["name"]: t for t in d.steps.chart.traces}
    steps = d.ctx.feed.steps
    assert len(bars["gen"]["x"]) == len(steps) and bars["gen"]["y"][0] > 0
    total = np.nansum([bars[p]["y"][0] for p in bars if p != "GPU busy %"])
    assert total == pytest.approx(steps["timing_s/step"].iloc[0], rel=1e-6)
    assert np.nanmax(bars["GPU busy %"]["y"]) > 0
    # throughput chart, segments table, placement grid, events, balance, export, knobs
    assert len(d.throughput.chart.trace("tokens/s/GPU")["x"]) == len(steps)
    assert "<td>1</td>" in d.throughput.segments.value
    assert "<td>✓ ●</td>" in d.placement.grid.value and "actor_rollout_ref" in d.placement.grid.value
    assert "launched" in d.events.log.value and "util %" in d.events.balance.value
    assert "actor_rollout_ref.model.path=" in d.export.text.value and "wb-download" in d.export.buttons.value
    d.export.format.value = "yaml"
    d.refresh()
    assert "actor_rollout_ref:" in d.export.text.value
    budget = d.changes.editors["actor_token_budget"]
    assert isinstance(budget.control, W.IntText) and budget.control.value == 4096 and budget.apply == "hot"
    assert budget.slider.value == 4096 and 32768 in budget.slider.options  # a stepped scale beside the entry
    assert "restart" in d.changes.editors["trainer_mode"].label.value
    assert d.changes.editors["ref_token_budget"].control.disabled  # no reference policy in this plan
    assert "no reference policy" in d.changes.editors["ref_token_budget"].message.value


def test_the_advisor_shows_findings_and_applies_a_proposal(proof):
    d = Dashboard(proof, live=False)
    d.ctx.feed.wait_for_advice()  # advice runs in its own thread; the next refresh shows it
    d.refresh()
    card = d.advisor.list.children[0]
    assert d.ctx.feed.findings and "<details" in card.children[0].children[1].value  # one line, evidence behind
    assert "tests/data" not in card.children[0].children[1].value
    assert "advice as of" in d.advisor.note.value
    button, finding = d.advisor._buttons[0]
    before = len(proof.commands())
    button.click()
    # The recording never ran that plan: the replay refuses it at once (never "accepted" first), queues nothing,
    # and says at the finding which changes it can play.
    assert len(proof.commands()) == before
    status = next(card.children[1] for card in d.advisor.list.children if button in card.children[0].children)
    assert "needs a GPU" in status.value and "It can take" in status.value


def test_an_invalid_value_marks_its_widget_and_queues_nothing(proof):
    d = Dashboard(proof, live=False)
    before = len(proof.commands())
    edit(d, "actor_token_budget", 100)  # below prompt + response length
    editor = d.changes.editors["actor_token_budget"]
    assert "wb-knob-bad" in editor.widget._dom_classes and "actor_token_budget" in editor.message.value
    assert d.changes.apply_button.disabled and "Nothing can be applied" in d.changes.diff.value
    edit(d, "nccl_env", "not a pair")  # text the knob's parser can't read
    assert "wb-knob-bad" in d.changes.editors["nccl_env"].widget._dom_classes
    assert d.changes.apply() is None
    assert len(proof.commands()) == before
    d.changes.discard_button.click()
    assert "wb-knob-bad" not in editor.widget._dom_classes and "No pending changes" in d.changes.diff.value
    edit(d, "rollout_gpu_memory", 0.55)  # valid, but no recorded segment ran it: refused at once, with what can be
    assert "no recorded segment" in d.changes.diff.value and "It can take" in d.changes.diff.value
    assert d.changes.apply_button.disabled and d.changes.apply() is None and len(proof.commands()) == before
    offers = [b.description for b in d.changes.recorded.buttons.children]
    assert any("actor_token_budget = 32768" in o for o in offers) and not any(b.disabled for b in d.changes.recorded.buttons.children)
    d.changes.discard_button.click()


def test_a_pages_build_leaves_the_replays_offers_to_the_derived_reads(proof, monkeypatch):
    """A replay's offers (the changes its recording can play) compose the recording's plans with Hydra (~1 s a plan
    on a quiet 2-core machine, 10-16 s at load 18): done in the page's first read they held up the page's first
    render by seconds (issue 15: page open -> every chart drawn). They come with the knob table instead."""
    threads = []
    recorded_changes = Session.recorded_changes
    monkeypatch.setattr(Session, "recorded_changes",
                        lambda self: threads.append(threading.current_thread().name) or recorded_changes(self))
    d = Dashboard(Session.attach(proof.dir, read_only=True))  # no event loop: the page's build, no update task
    on_build = list(threads)
    d.refresh()
    assert threading.main_thread().name not in on_build
    assert any("actor_token_budget = 32768" in b.description for b in d.changes.recorded.buttons.children)


def test_a_viewer_sees_everything_and_controls_nothing_until_the_token(proof):
    d = Dashboard(Session.attach(proof.dir, read_only=True), live=False)
    assert all(c.disabled for c in controls(d))
    assert d.changes.apply_button.tooltip == READ_ONLY_REASON and html.escape(READ_ONLY_REASON) in d.bar.hint.value
    assert d.changes.apply_button.button_style != "primary"  # a disabled Apply is not drawn as the action to take
    assert d.token_row.layout.display != "none"
    assert len(d.utilization.chart.traces) > 1 and len(d.steps.chart.traces[0]["x"]) >= 1  # the charts all the same
    d.token.value = "not-the-token"
    d.unlock.click()
    assert not d.session.is_operator and "not this session" in html.unescape(d.unlock_message.value)
    d.token.value = (proof.dir / "operator.token").read_text().strip()
    d.unlock.click()
    assert d.session.is_operator and not d.changes.editors["rollout_gpu_memory"].control.disabled
    assert not d.changes.apply_button.disabled or d.changes.apply_button.tooltip != READ_ONLY_REASON
    assert d.token_row.layout.display == "none"


def send(widget: W.Widget, data: dict) -> None:
    """A widget message as a page's frontend sends it over the kernel's comm (a hostile page can send any)."""
    widget._handle_msg({"content": {"data": data}, "buffers": []})


def click(button: W.Button) -> None:
    send(button, {"method": "custom", "content": {"event": "click"}})  # whatever the button's `disabled` says


def test_a_hostile_viewer_page_starts_changes_and_unlocks_nothing(proof):
    """Issue 19: every control of a viewer's page is refused in the kernel by the engine, not by `disabled`. The
    page's messages are sent as a hostile page would: values set, every button clicked, a wrong token."""
    d = Dashboard(Session.attach(proof.dir, read_only=True), live=False)
    d.ctx.feed.wait_for_advice()
    d.refresh()
    sessions, commands, state = len(Session.list()), len(proof.commands()), proof.state
    send(d.changes.editors["actor_token_budget"].control, {"method": "update", "state": {"value": 32768},
                                                           "buffer_paths": []})
    click(d.changes.apply_button)
    for button in [*d.bar.buttons.values(), *(b for b, _ in d.advisor._buttons), *d.changes.recorded.buttons.children]:
        click(button)
    send(d.tune.knobs, {"method": "update", "state": {"index": [0]}, "buffer_paths": []})
    click(d.tune.button)
    click(d.tune.autopilot.button)
    send(d.token, {"method": "update", "state": {"value": "not-the-token"}, "buffer_paths": []})
    click(d.unlock)
    for thread in [t for t in threading.enumerate() if t.name.startswith("wb-")]:
        thread.join(60)  # the session bar's controls and the tune run in threads of their own
    assert len(Session.list()) == sessions and len(proof.commands()) == commands and proof.state == state
    assert not d.session.is_operator and d.tune.state == "refused" and d.tune.autopilot.state == "refused"
    assert "read-only" in d.ctx.notice and "not this session's operator token" in html.unescape(d.unlock_message.value)


def test_the_page_passes_session_and_token_in_its_query(proof):
    assert page_query("session=abc&token=t0k") == {"session": "abc", "token": "t0k"}
    token = (proof.dir / "operator.token").read_text().strip()
    viewer = Dashboard.from_page(f"session={proof.id}", live=False)
    assert viewer.session.id == proof.id and not viewer.session.is_operator
    operator = Dashboard.from_page(f"session={proof.id}&token={token}", live=False)
    assert operator.session.is_operator and operator.session.id == proof.id
    wrong = Dashboard.from_page(f"session={proof.id}&token=not-the-token", live=False)
    assert not wrong.session.is_operator and wrong.changes.apply_button.disabled
    assert "not this session's operator token" in html.unescape(wrong.unlock_message.value)


def test_a_slider_change_previews_applies_and_shows_the_hot_apply(proof):
    d = Dashboard(proof, live=False)
    d.changes.edit_irrelevant.value = True  # ref_token_budget: no reference policy runs, but the recording set it
    for name, value in PROOF_HOT.items():
        edit(d, name, value)
    diff = d.changes.diff.value
    assert all(name in diff for name in PROOF_HOT) and "32768" in diff and "next step boundary" in diff
    assert not d.changes.apply_button.disabled
    before = len(proof.commands())
    d.changes.apply_button.click()
    commands = proof.commands()
    assert len(commands) == before + 1
    assert commands.iloc[-1]["kind"] == "apply" and commands.iloc[-1]["payload"]["changes"] == PROOF_HOT
    assert d.changes.apply_button.disabled  # one change at a time
    proof.resume()
    proof.pause()  # taken at the same step boundary: the next tests find the session paused again
    refreshed_until(d, lambda: "applied hot" in d.changes.progress.value)
    assert "applied" in d.events.log.value and " from step " in d.changes.progress.value
    refreshed_until(d, lambda: d.changes.editors["actor_token_budget"].current == 32768)  # the plan in force now
    assert "No pending changes" in d.changes.diff.value and not d.changes.apply_button.tooltip == READ_ONLY_REASON


def test_a_restart_class_change_shows_its_progress_to_the_first_resumed_step(proof):
    d = Dashboard(proof, live=False)
    for name, value in PROOF_RESTART.items():
        edit(d, name, value)
    assert "checkpoint at the next step boundary → relaunch" in d.changes.diff.value
    d.changes.discard_button.click()
    offer = next(b for b in d.changes.recorded.buttons.children if "colocate_async" in b.description)
    offer.click()  # the recorded restart-class change, one click
    assert proof.commands().iloc[-1]["payload"]["changes"]["trainer_mode"] == "colocate_async"
    sent = html.unescape(d.changes.recorded.sent.value)  # answered where it was clicked: what went, where it shows
    assert "Sent: " in sent and "trainer_mode = 'colocate_async'" in sent and "Throughput chart" in sent
    proof.resume()  # the relaunched run plays the recording's segment 3, then the replay ends
    refreshed_until(d, lambda: "✓ first resumed step" in d.changes.progress.value)
    progress = d.changes.progress.value
    for stage in ("checkpoint at the step boundary", "relaunch verl", "verl start-up"):
        assert f"✓ {stage}" in progress
    assert "critic weights and optimizer state start afresh" in progress  # what the restart could not keep


def test_start_follows_a_new_session_like_the_ended_one(proof, sessions):
    wait(lambda: proof.state in ENDED)
    d = Dashboard(proof, live=False)
    d.refresh()
    assert "The replay has ended: Play again replays the recording" in d.bar.hint.value  # what the user can do now
    start = d.bar.buttons["start"]
    assert not start.disabled and d.bar.buttons["pause"].disabled and start.description == "Play again"
    d.changes.track(SimpleNamespace(state="applied", message="applied at step 9"), "the ended session's change")
    start.click()
    d.changes.editors["actor_token_budget"].control.value = 8192  # typed while the new session starts
    wait(lambda: "start: done" in d.ctx.notice)
    started = d.session
    assert started.id != proof.id and started.meta["recording"] == proof.meta["recording"]
    d.refresh()
    assert "applied at step 9" not in d.changes.progress.value  # the progress line is the new session's
    assert d.changes.editors["actor_token_budget"].control.value == 8192  # the edit is still there, pending
    assert "actor_token_budget" in d.changes.diff.value
    assert started.id in d.bar.status.value and f"?session={started.id}" in d.ctx.notice
    assert "this page follows it now, as its operator" in d.ctx.notice and d.session.is_operator
    assert d.bar.buttons["start"].description == "Play again" and d.bar.buttons["start"].disabled  # one at a time
    sessions["started"] = started


def test_the_live_task_updates_the_charts_without_a_cell_run(started):
    async def watch() -> tuple[int, int]:
        d = Dashboard(started)  # a running loop: the update task starts by itself, once a page shows a chart
        chart = d.steps.chart
        first = len(chart.traces[0]["x"]) if chart.traces else 0
        deadline = time.time() + TIMEOUT
        while (len(chart.traces[0]["x"]) if chart.traces else 0) <= first and time.time() < deadline:
            chart._from_view(chart, {"kind": "view", "revision": chart.revision}, [])  # what a page's view says
            await asyncio.sleep(0.5)
        d.close()
        return first, len(d.steps.chart.traces[0]["x"])

    first, later = asyncio.run(watch())
    assert later > first
