"""The dashboard: every panel of `widgets/` on one page, driving one session and updating itself live.

    from widgets.dashboard import Dashboard
    Dashboard(session)                  # in a notebook cell: shows the page; it updates itself (no cell to run)
    Dashboard(session, token="…")       # the operator token: controls enabled (a session handle without it is a viewer)
    Dashboard.from_page()               # notebooks/dashboard.ipynb under Voila: session and token from the page URL
    d.refresh()                         # one full, synchronous refresh of every panel (tests, benchmarks)

**How a page names its session and proves its operator (Voila).** The page URL carries
`?session=ID` (a session id or directory; without it the newest session) and, for the operator only,
`&token=TOKEN` (the content of the session's `operator.token`). A Voila kernel sees the URL's query in
`os.environ["QUERY_STRING"]`; `from_page()` parses it. A Voila kernel runs as the session's own OS user, so being
able to read the token file proves nothing: without a token in the URL the page attaches read-only
(`Session.attach(id, read_only=True)`): every chart, every control disabled with the reason, and a token field
that unlocks control for this page when the right token is typed in. `verl-workbench up` prints both URLs.

**Panels** (one module each): session bar (session_bar.py), device planner (placement.py), knobs with pending
changes, Apply and its progress (changes.py, editors from knob_editor.py), GPU utilization (utilization.py),
step breakdown (step_breakdown.py), throughput and segments (throughput.py), advisor (advisor.py), auto-tune
(tune.py), export (export.py), events and balance (events.py). Every number comes through `workbench.Session`.

**Live updates.** One asyncio task on the kernel's event loop: every `interval_s` (≥ 0.5 s: at most 2 Hz) it runs
`Feed.read()` and the panels' `prepare` (store reads, pandas, downsampling) in a worker thread
(`asyncio.to_thread`), then the panels' `show` (widget assignments, one `Chart.draw` per chart with news: the
charts' synced state is their data, so a page that renders later draws it; widgets/plot.py) on the loop thread.
The loop starts once a page has rendered the charts and pauses while no page shows them (their views say so every
few seconds), so that a page kernel whose page is gone falls idle and Jupyter's culling can end it; the next view
resumes it. Why it waits for the first view: a page's widget manager, as it connects, asks the kernel for every
widget's state at once and builds its models from that snapshot. A widget created meanwhile (a knob editor once the
knob table is read, an advice card) whose state names a widget of the snapshot not built yet failed in the page
("widget model not found", then "Cannot read properties of undefined (reading 'create_view')"), and an update sent
meanwhile to a model not built yet was lost. A page renders views only once its models are built.
Widget callbacks (which JupyterLab 4 may run on another thread) and the loop share state under `Context.lock`.
Nothing writes into an Output widget from background code. The task starts when an event loop runs (a kernel);
without one (a plain script, pytest) call `refresh()`.

**For browser tests**, stable CSS classes: `wb-session-bar`, `wb-status`, `wb-start|pause|resume|stop|rollback`, `wb-notice`,
`wb-knob-<name>` (each knob editor; `wb-knob-bad` while a problem marks it, message in `wb-knob-message`),
`wb-offer` (a change a replay offers; `wb-offers-sent` answers its click), `wb-diff`, `wb-apply`, `wb-discard`,
`wb-apply-progress`, `wb-utilization`, `wb-steps`, `wb-throughput`, `wb-segments-table`, `wb-placement-grid`, `wb-findings`, `wb-finding-apply`, `wb-export-text`, `wb-copy`,
`wb-download`, `wb-events-log`, `wb-balance`, `wb-tune`, `wb-tune-run`, `wb-tune-status`, `wb-token`, `wb-unlock`,
`wb-errors`.
"""

from __future__ import annotations

import asyncio
import html
import math
import os
import threading
import time
from urllib.parse import parse_qs

import ipywidgets as W

from workbench.handles import ReadOnlySession
from workbench.paths import page_session_dir
from workbench.session import Session

from .advisor import AdvisorPanel
from .changes import ChangesPanel
from .common import CSS, READ_ONLY_REASON, Context, assign
from .events import EventsPanel
from .export import ExportPanel
from .feed import Feed
from .placement import PlacementPanel
from .plot import plotly_js
from .session_bar import SessionBar
from .step_breakdown import StepBreakdownPanel
from .throughput import ThroughputPanel
from .tune import TunePanel
from .utilization import WHOLE_SESSION, UtilizationPanel

SESSION_PARAM, TOKEN_PARAM = "session", "token"
MIN_INTERVAL_S = 0.5  # at most 2 Hz: each tick re-sends whole chart arrays to every viewer
# A page kernel whose page is gone must fall idle, so that Jupyter's culling can end it: the loop pauses once no
# view of a chart has said it is shown (every 5 s, widgets/static/chart.js) for this long, and resumes at the next.
NO_VIEW_PAUSE_S = 30.0
PAUSED_POLL_S = 0.2  # while paused the loop only looks for a view again: no store reads, no messages
# What a full refresh tells every panel is new (each then recomputes and re-sends what it shows).
ALL_NEWS = frozenset({"state", "meta", "steps", "events", "samples", "step_samples", "knobs", "segments",
                      "placement", "offers", "findings"})


def page_query(query_string: str | None = None) -> dict[str, str]:
    """The page URL's query (Voila puts it in QUERY_STRING) as {name: last value}."""
    text = os.environ.get("QUERY_STRING", "") if query_string is None else query_string
    return {key: values[-1] for key, values in parse_qs(text).items()}


class Dashboard:
    def __init__(self, session: Session, token: str | None = None, *, live: bool = True,
                 window_min: int = WHOLE_SESSION, interval_s: float = MIN_INTERVAL_S):
        if token:
            session = session.as_operator(token)
        self.interval_s = max(float(interval_s), MIN_INTERVAL_S)
        self.ctx = Context(session, Feed(session, window_min=window_min))
        self.bar = SessionBar(self.ctx, switch=self._switch)
        self.changes = ChangesPanel(self.ctx)
        self.placement = PlacementPanel(self.ctx, self.changes.placement_editors)
        self.utilization = UtilizationPanel(self.ctx, window_min=window_min)
        self.steps = StepBreakdownPanel(self.ctx)
        self.throughput = ThroughputPanel(self.ctx)
        self.advisor = AdvisorPanel(self.ctx, self.changes)
        self.tune = TunePanel(self.ctx)
        self.export = ExportPanel(self.ctx)
        self.events = EventsPanel(self.ctx)
        self.panels = (self.bar, self.changes, self.placement, self.utilization, self.steps, self.throughput,
                       self.advisor, self.tune, self.export, self.events)
        self.errors = W.HTML(_dom_classes=["wb-errors"])
        self.token = W.Password(placeholder="operator token", layout=W.Layout(width="260px"),
                                _dom_classes=["wb-token"])
        self.unlock = W.Button(description="Take control", _dom_classes=["wb-unlock"], layout=W.Layout(width="auto"))
        self.unlock_message = W.HTML()
        self.unlock.on_click(lambda _: self._unlock())
        self.token_row = W.HBox([W.HTML(f"<span class='wb-muted'>{html.escape(READ_ONLY_REASON)}</span>"),
                                 self.token, self.unlock, self.unlock_message])
        column = dict(layout=W.Layout(width="50%", min_width="420px"))
        self.widget = W.VBox([
            W.HTML(CSS), plotly_js(), self.bar.widget, self.token_row, self.errors, self.changes.recorded.widget,
            W.HBox([W.VBox([self.utilization.widget], **column), W.VBox([self.steps.widget], **column)],
                   layout=W.Layout(flex_flow="row wrap")),
            self.throughput.widget,  # beside the first charts: "did my change help?" without scrolling past knobs
            W.HBox([W.VBox([self.changes.widget], **column),
                    W.VBox([self.placement.widget, self.advisor.widget, self.tune.widget], **column)],
                   layout=W.Layout(flex_flow="row wrap")),
            W.HBox([W.VBox([self.export.widget], **column), W.VBox([self.events.widget], **column)],
                   layout=W.Layout(flex_flow="row wrap")),
        ], _dom_classes=["wb-dashboard"])
        self._tick = threading.Lock()  # one read+prepare at a time (the loop, or a refresh() call)
        self.timings_ms: dict[str, float] = {}
        self.charts = (self.utilization.chart, self.steps.chart, self.throughput.chart)
        self.paused_for_no_view = True  # until a page has rendered the charts (see "Live updates" above)
        self._task: asyncio.Task | None = None
        self._closed = False
        if live:  # what is at hand now (the charts); the knob editors follow when their derived read is in
            self._show(self._read(everything=True))
        else:
            self.refresh()
        if live:
            self.start()

    @classmethod
    def from_page(cls, query_string: str | None = None, **options) -> "Dashboard":
        """The Voila page's dashboard: `?session=ID&token=TOKEN` from the page URL (see the module docstring)."""
        query = page_query(query_string)
        token = query.get(TOKEN_PARAM) or None
        # A URL names a session id of this server's home only, never a path (paths.page_session_dir).
        named = page_session_dir(query[SESSION_PARAM]) if query.get(SESSION_PARAM) else None
        session = Session.attach(named or os.environ.get("VERL_WORKBENCH_SESSION"), read_only=True)
        try:
            return cls(session, token=token, **options)
        except ReadOnlySession as error:  # a wrong token in the URL: a viewer's page, saying why
            dashboard = cls(session, **options)
            dashboard.unlock_message.value = f"<span class='wb-problem'>{html.escape(str(error))}</span>"
            return dashboard

    @property
    def session(self) -> Session:
        return self.ctx.session

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # ----------------------------------------------------------------- one tick
    def _read(self, everything: bool) -> list:
        with self._tick:
            started = time.perf_counter()
            news = self.ctx.feed.read() | (ALL_NEWS if everything else set())
            timings = {"read": (time.perf_counter() - started) * 1000.0}
            payloads = []
            for panel in self.panels:
                started = time.perf_counter()
                try:
                    payloads.append(panel.prepare(self.ctx.feed, news))
                except Exception as error:  # one broken panel must not stop the others
                    payloads.append(error)
                timings[type(panel).__name__] = (time.perf_counter() - started) * 1000.0
            self.timings_ms = timings
            return payloads

    def _show(self, payloads: list) -> None:
        problems = []
        for panel, payload in zip(self.panels, payloads):
            started = time.perf_counter()
            if isinstance(payload, Exception):
                problems.append(f"{type(panel).__name__}: {payload!r}")
            elif payload is not None:
                try:
                    panel.show(payload)
                except Exception as error:
                    problems.append(f"{type(panel).__name__}: {error!r}")
            name = type(panel).__name__
            self.timings_ms[name] = self.timings_ms.get(name, 0.0) + (time.perf_counter() - started) * 1000.0
        assign(self.errors, value="".join(f"<div class='wb-problem'>{html.escape(p)}</div>" for p in problems))
        assign(self.token_row.layout, display="none" if self.ctx.operator else "flex")

    def refresh(self) -> dict[str, float]:
        """One full refresh of every panel, synchronously: the store's news read (only rows newer than those held;
        the derived reads as in a tick, waited for; advice arrives from its own thread on a later refresh) and every
        panel recomputed and re-sent. Returns milliseconds per stage (read, then each panel's prepare + show)."""
        self._show(self._read(everything=True))
        if self.ctx.feed.deriving():  # their results, then every panel again (else a second pass redid the first)
            self.ctx.feed.wait_for_derived()
            self._show(self._read(everything=True))
        return dict(self.timings_ms)

    # ----------------------------------------------------------------- live updates
    def start(self) -> bool:
        """Start the update task on the running event loop (a kernel's); False where no loop runs."""
        if self._task is not None and not self._task.done():
            return True
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            try:
                loop = asyncio.get_event_loop_policy().get_event_loop()
            except RuntimeError:
                return False
            if not loop.is_running():
                return False
        self._closed = False
        self._task = loop.create_task(self._run())
        return True

    def unseen_for_s(self) -> float:
        """Seconds since a view of a chart last said it is shown (infinite before the first)."""
        seen = [chart.last_view_at for chart in self.charts if chart.last_view_at is not None]
        return time.monotonic() - max(seen) if seen else math.inf

    async def _run(self) -> None:
        while not self._closed:
            if self.unseen_for_s() > NO_VIEW_PAUSE_S:  # no page shows it: no reads, no messages (the kernel idles)
                self.paused_for_no_view = True
                await asyncio.sleep(PAUSED_POLL_S)
                continue
            self.paused_for_no_view = False
            started = time.monotonic()
            try:
                payloads = await asyncio.to_thread(self._read, False)
                self._show(payloads)
            except Exception as error:  # e.g. the store went away: say so, keep trying
                assign(self.errors, value=f"<div class='wb-problem'>update failed: {html.escape(repr(error))}</div>")
            await asyncio.sleep(max(0.05, self.interval_s - (time.monotonic() - started)))

    def close(self) -> None:
        """Stop updating and close the widgets."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        self.widget.close()

    def _switch(self, session: Session) -> None:
        """Follow another session (one the Start button began): a new feed (every panel redraws from it, charts
        too), the old session's progress and advice dropped, pending edits kept (previewed against the new plan)."""
        with self._tick, self.ctx.lock:
            window_min = self.ctx.feed.window_min
            self.ctx.session = session
            self.ctx.feed = Feed(session, window_min=window_min)
            for panel in self.panels:  # what a panel held about the old session (an Apply's progress, …) goes
                getattr(panel, "switched", lambda: None)()

    # ----------------------------------------------------------------- operator token typed into the page
    def _unlock(self) -> None:
        token = self.token.value.strip()
        try:
            session = self.ctx.session.as_operator(token)
        except Exception as error:
            self.unlock_message.value = f"<span class='wb-problem'>{html.escape(str(error))}</span>"
            return
        with self.ctx.lock:
            self.ctx.session = session
            self.ctx.feed.session = session
        self.token.value = ""
        self.unlock_message.value = ""
        self.refresh()
