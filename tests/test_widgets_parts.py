"""Parts of the dashboard that need no session (fast): the chart widget's wire format and view heartbeat, the knob
editors' stepped scale and unclamped entry, messages said once, advice named by measurements, the events log."""

from __future__ import annotations

import time
from types import SimpleNamespace

import ipywidgets as W
import numpy as np
import pytest
from ipywidgets.widgets.widget import _remove_buffers

from widgets.advisor import AdvisorPanel, gain_line, measurement_names
from widgets.common import said_once
from widgets.events import event_rows
from widgets.knob_editor import KnobEditor, stepped_scale
from widgets.plot import RESYNC_AFTER_S, Chart, plotly_js, to_wire

BUDGET_ROW = {"name": "actor_token_budget", "kind": "int", "apply": "hot", "value": 4096, "default": 16384,
              "min": 1, "max": None, "relevant": True, "help": "tokens per GPU per micro batch"}


def test_a_charts_state_is_its_data_with_float_arrays_as_binary():
    chart = Chart({"title": {"text": "t"}})
    x = np.arange(5, dtype=np.float64)
    chart.draw([{"type": "scatter", "x": x, "y": np.array([1.0, np.nan, 3, 4, 5]), "name": "a", "text": ["p", "q"]}])
    state, paths, buffers = _remove_buffers(chart.get_state())
    assert ["figure", "data", 0, "x", "wb_f8"] in paths and ["figure", "data", 0, "y", "wb_f8"] in paths
    y = np.frombuffer(bytes(buffers[paths.index(["figure", "data", 0, "y", "wb_f8"])]), dtype="<f8")
    assert np.isnan(y[1]) and y[4] == 5.0  # NaN stays a gap, no JSON on the way
    assert state["figure"]["data"][0]["text"] == ["p", "q"] and state["revision"] == 1
    assert chart.trace("a")["x"] is x and to_wire({"k": np.int64(3)}) == {"k": 3}


def test_plotly_js_comes_from_the_installed_package_once_per_kernel():
    loader = plotly_js()
    assert loader is plotly_js() and len(loader.source) > 1_000_000  # gzipped plotly.min.js, no network
    assert loader.source[:2] == b"\x1f\x8b"


def test_a_view_that_missed_an_update_gets_the_state_again(monkeypatch):
    chart = Chart({})
    chart.draw([])
    sent = []
    monkeypatch.setattr(chart, "send_state", lambda keys=None: sent.append(keys))
    chart._from_view(chart, {"kind": "view", "revision": -1}, [])  # plotly.js still loading: nothing to resend
    assert chart.last_view_at is not None and not sent
    chart._sent_at = time.monotonic() - RESYNC_AFTER_S - 1
    chart._from_view(chart, {"kind": "view", "revision": 0}, [])  # drew revision 0, the newest is 1
    assert sent == [["figure", "revision"]]
    chart._from_view(chart, {"kind": "view", "revision": chart.revision}, [])
    assert len(sent) == 1


def test_budgets_get_a_stepped_scale_and_an_entry_that_never_clamps():
    stops = stepped_scale(1, 262144, 4096, 5000)
    assert len(stops) < 45 and {1, 8, 12, 4096, 5000, 6144, 262144} <= set(stops)
    edited = []
    editor = KnobEditor(BUDGET_ROW, edited.append)
    assert isinstance(editor.control, W.IntText) and editor.slider.value == 4096
    editor.slider.value = 16384  # a drag to a stop
    assert editor.control.value == 16384 and edited == ["actor_token_budget"]
    editor.control.value = 10 ** 7  # typed, above the scale: kept as typed, the slider at its end
    assert editor.read() == (10 ** 7, None) and editor.slider.value == editor.slider.options[-1]
    editor.mark("actor_token_budget: above the most a GPU can hold")
    assert "wb-knob-bad" in editor.widget._dom_classes
    editor.set_enabled(False, "read-only")
    assert editor.control.disabled and editor.slider.disabled


@pytest.mark.parametrize("prefix, text, said", [
    ("queued", "queued: waiting for the supervisor", "queued: waiting for the supervisor"),
    ("refused", "the budget is too small", "refused: the budget is too small"),
    ("actor_token_budget", "actor_token_budget: 100 tokens is below 1024", "actor_token_budget: 100 tokens is below 1024"),
])
def test_messages_are_said_once(prefix, text, said):
    assert said_once(prefix, text) == said


def test_rays_missing_dashboard_is_said_once_in_words_with_what_it_costs():
    """Every segment's run logs Ray's raw warning (synthetic rows in its words); the log says it once, explained."""
    import pandas as pd

    raw = ("ServerUnavailable: Failed to connect to the dashboard server ... pip install ray[default] to get the "
           "state API")
    events = pd.DataFrame({"t": [100.0, 200.0, 300.0, 400.0], "kind": ["warning", "launched", "warning", "warning"],
                           "text": [raw, "run 2 launched", raw, raw]})
    rows = event_rows(events)
    assert [kind for _, kind, _ in rows] == ["warning", "launched"]  # newest first, the repeat folded into one row
    said = rows[0][2]
    assert "ServerUnavailable" not in said and said.endswith("(×3)")
    assert "roles come from the processes' names" in said and "Nothing else is missing" in said


def test_segment_labels_that_would_overlap_go_on_rows_of_their_own():
    """Five segments begun within seconds of each other (synthetic starts): every start keeps its line, and no two
    labels share a row closer than LABEL_GAP of the chart's width."""
    import pandas as pd

    from widgets.charts import LABEL_GAP, TimeAxis, segment_marks

    segments = pd.DataFrame({"id": [1, 2, 3, 4, 5], "started_at": [0.0, 5.0, 10.0, 15.0, 300.0]})
    shapes, labels = segment_marks(segments, TimeAxis(0.0), 0.0, 600.0)
    assert len(shapes) == 5 and len(labels) >= 3
    span_min = 10.0
    for a in labels:
        for b in labels:
            if a is not b and a["y"] == b["y"]:
                assert abs(a["x"] - b["x"]) / span_min >= LABEL_GAP, (a["text"], b["text"])


def test_a_time_chart_says_its_x_range_or_autorange_every_time():
    """Plotly.react given an x range once and then none keeps autorange off and draws [-1, 6]: after Play again the
    charts stayed there while the new session's steps ran off to the right (seen in Chromium). So every figure says
    one or the other: an empty chart shows its time axis from the session's start (not plotly's guess from one event
    mark: ticks 0.111443, 0.111444, …), a window its last minutes, anything else autorange. Synthetic frames."""
    import pandas as pd

    from widgets.charts import TimeAxis
    from widgets.throughput import throughput_figure
    from widgets.utilization import utilization_figure

    axis = TimeAxis(1000.0)
    samples = pd.DataFrame({"t": [1000.0 + 60 * i for i in range(5)], "gpu": 0, "util": 50.0})
    steps = pd.DataFrame({"t": [1120.0, 1180.0], "perf/throughput": [1.0, 2.0]})
    cases = {
        "utilization, no sample": utilization_figure(pd.DataFrame(), None, None, "util", 0, axis)[1],
        "utilization, whole session": utilization_figure(samples, None, None, "util", 0, axis)[1],
        "utilization, last minute": utilization_figure(samples, None, None, "util", 1, axis)[1],
        "throughput, no step": throughput_figure(pd.DataFrame(), None, None, axis)[1],
        "throughput, steps": throughput_figure(steps, None, None, axis)[1],
    }
    for case, layout in cases.items():
        xaxis = layout["xaxis"]
        assert xaxis["autorange"] is ("range" not in xaxis), (case, xaxis)
    assert cases["utilization, no sample"]["xaxis"]["range"][0] == 0
    assert cases["utilization, last minute"]["xaxis"]["range"] == [3.0, 4.0]
    notes = [a["text"] for a in cases["utilization, no sample"]["annotations"]]
    assert "waiting for the first GPU sample" in notes


def test_advice_names_measurements_not_repository_paths():
    text = "fused kernels on the H200 (tests/data/h200_fused_logprob_2026-12-01, same workload) see shared/DESIGN.md"
    named = measurement_names(text)
    assert "the H200 measurements of 2026-12-01" in named and "tests/" not in named and "shared/" not in named
    assert gain_line("Shorter steps: update_actor 38 s → 4 s; log-prob 10 → 2 s. Predicted: 18 s.") == \
        "Shorter steps: update_actor 38 s → 4 s; log-prob 10 → 2 s"


def _finding(rule: str, change: dict):
    return SimpleNamespace(rule=rule, title=f"{rule} (synthetic)", severity="high", change=change,
                           evidence_text="step time 40 s", expected="Shorter steps: 40 s → 20 s. Predicted.")


def test_advice_is_judged_against_the_plan_in_force_and_applys_feedback_outlives_the_cards():
    """Stand-ins for the session and the feed: a finding whose change is in force is not shown; the feedback of an
    Apply stays at its finding when the findings are judged again (every 30 s) and follows the change's state."""
    import pandas as pd

    handle = SimpleNamespace(state="accepted", message="accepted by the supervisor")
    session = SimpleNamespace(apply_finding=lambda finding, wait: handle)
    tracked = []
    panel = AdvisorPanel(SimpleNamespace(session=session, operator=True),
                         SimpleNamespace(track=lambda h, what: tracked.append(what)))
    knobs = pd.DataFrame({"name": ["trainer_mode", "actor_token_budget"], "value": ["colocate_async", 4096]})
    feed = SimpleNamespace(findings=[_finding("async", {"trainer_mode": "colocate_async"}),
                                     _finding("budget", {"actor_token_budget": 16384})],
                           knob_table=knobs, findings_note="advice as of step 3")
    panel.show(panel.prepare(feed, {"findings"}))
    assert [f.rule for _, f in panel._buttons] == ["budget"]  # colocate_async runs already: not proposed again
    panel._buttons[0][0].click()
    assert tracked == ["advice: budget (synthetic)"]
    feed.findings = [_finding("budget", {"actor_token_budget": 16384}), _finding("other", {"actor_token_budget": 8192})]
    panel.show(panel.prepare(feed, {"findings"}))  # judged again: new cards
    handle.state, handle.message = "applied", "applied at step 5"
    panel.show(panel.prepare(feed, set()))  # a tick with no news: the feedback follows the change
    status = panel.list.children[0].children[1]
    assert "applied at step 5" in status.value and "wb-changed" in status.value


def test_new_findings_and_offers_create_no_widget_once_the_panels_are_built():
    """A widget created while a page's kernel connection is down never reaches the page whole: at the reconnect
    jupyter_server's nudge consumes iopub messages and replays the buffered ones after live ones, so a card's HTML
    arrived naming a style model the page never got ('widget model not found', then "Cannot read properties of
    undefined (reading 'create_view')"; reproduced in Chromium, 1 drop in 6-12 on an ended replay's page, as the
    advice cards were built). A state change is healed by the page's restore; a new widget is not. So advice cards
    and a replay's offers are slots built with the panel and filled in place. Synthetic findings and offers."""
    import pandas as pd
    from ipywidgets.widgets.widget import _instances

    from widgets.offers import RecordedChanges

    session = SimpleNamespace(apply_finding=lambda finding, wait: SimpleNamespace(state="accepted", message="ok"))
    advisor = AdvisorPanel(SimpleNamespace(session=session, operator=True), SimpleNamespace(track=lambda h, w: None))
    offers = RecordedChanges(lambda changes: None)
    built = len(_instances)
    feed = SimpleNamespace(findings=[_finding("budget", {"actor_token_budget": 16384})], findings_note="as of step 3",
                           knob_table=pd.DataFrame({"name": ["actor_token_budget"], "value": [4096]}))
    advisor.show(advisor.prepare(feed, {"findings"}))
    feed.findings = [_finding(f"rule{i}", {"actor_token_budget": 1024 * (i + 5)}) for i in range(5)]
    advisor.show(advisor.prepare(feed, {"findings"}))
    advisor._buttons[2][0].click()
    offers.show([{"critic_token_budget": 65536}], True, "running")
    offers.show([{"fused_kernels": True}, {"critic_token_budget": 65536}, {"trainer_mode": "colocate_async"}], True,
                "running")
    assert len(_instances) == built
    shown = [card for card in advisor.list.children if card.layout.display != "none"]
    assert len(shown) == 5 and "rule4 (synthetic)" in shown[4].children[0].children[1].value
    assert [b.description for b in offers.buttons.children if b.layout.display != "none"] == [
        "Apply: fused_kernels = True", "Apply: critic_token_budget = 65536", "Apply: trainer_mode = 'colocate_async'"]


def test_the_update_loop_changes_no_widget_before_a_page_has_rendered_the_charts(monkeypatch):
    """A page's widget manager builds its models from one snapshot of every widget's state, asked for as it
    connects; a widget created meanwhile whose state names one of the snapshot's not built yet failed in the page
    ("widget model not found", then "Cannot read properties of undefined (reading 'create_view')"; seen in the
    page_open bench and on a page opened as up started). So the loop reads and shows nothing until a chart's view
    says it is shown (the page renders views once its models are built), then updates at once."""
    import asyncio

    import widgets.dashboard as dashboard
    from workbench.session import Session, resolve_recording

    monkeypatch.setattr(dashboard, "PAUSED_POLL_S", 0.05)
    d = dashboard.Dashboard(Session.attach(resolve_recording("h200-tuning"), read_only=True))  # no loop yet: not started
    reads, shows = [], []
    monkeypatch.setattr(d, "_read", lambda everything: reads.append(time.monotonic()) or [None] * len(d.panels))
    monkeypatch.setattr(d, "_show", lambda payloads: shows.append(time.monotonic()))

    async def watch() -> tuple[int, int, int, bool]:
        assert d.start()
        await asyncio.sleep(1.0)
        before = (len(reads), len(shows))  # the page is still loading its models: nothing changes under it
        d.steps.chart._from_view(d.steps.chart, {"kind": "view", "revision": -1}, [])  # the page rendered a chart
        await asyncio.sleep(0.3)
        after = len(shows)
        d.close()
        return *before, after, d.paused_for_no_view

    read_before, shown_before, shown_after, paused = asyncio.run(watch())
    assert (read_before, shown_before) == (0, 0) and shown_after >= 1 and not paused


def test_the_update_loop_pauses_without_a_view_and_resumes_at_the_next(monkeypatch):
    """A page kernel whose page is gone must fall idle (Jupyter's culling ends idle kernels): no store reads, no
    messages. The dashboard of a recording opened read-only (no supervisor), its loop run on an event loop."""
    import asyncio

    import widgets.dashboard as dashboard
    from workbench.session import Session, resolve_recording

    monkeypatch.setattr(dashboard, "NO_VIEW_PAUSE_S", 1.0)
    monkeypatch.setattr(dashboard, "PAUSED_POLL_S", 0.05)
    d = dashboard.Dashboard(Session.attach(resolve_recording("h200-tuning"), read_only=True))  # no loop yet: not started
    reads = []
    monkeypatch.setattr(d, "_read", lambda everything: reads.append(time.monotonic()) or [None] * len(d.panels))
    seen = lambda: d.steps.chart._from_view(d.steps.chart, {"kind": "view", "revision": 0}, [])  # noqa: E731

    async def watch() -> tuple[int, int, bool]:
        assert d.start()
        seen()  # the page rendered
        await asyncio.sleep(0.4)
        shown_to = len(reads)  # updating while the page shows it
        await asyncio.sleep(1.6)
        paused, during = d.paused_for_no_view, len(reads)
        await asyncio.sleep(1.0)
        idle = len(reads) - during  # nothing read while paused
        seen()  # a page shows a chart again
        await asyncio.sleep(0.6)  # less than NO_VIEW_PAUSE_S: still seen
        d.close()
        return shown_to, idle, paused and not d.paused_for_no_view and len(reads) > during

    shown_to, idle, resumed = asyncio.run(watch())
    assert shown_to >= 1 and idle == 0 and resumed


def test_memory_unknown_reads_as_a_dash_never_nan():
    from widgets.placement import _gb

    assert _gb(float("nan")) == "–" and _gb(None) == "–" and _gb(2048) == "2.0"
