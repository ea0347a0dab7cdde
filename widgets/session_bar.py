"""Session bar: state, controls (pause / resume / stop / rollback), segment, step, tokens/s/GPU, time per step."""

from __future__ import annotations

import html
import math
import time

import ipywidgets as W

from .common import READ_ONLY_REASON, Context, assign, fmt

ACTIVE = ("starting", "running", "paused", "restarting", "stopping")
# Which state each control makes sense in, and why it is off otherwise.
ENDED = ("stopped", "finished", "failed", "lost")
CONTROLS = {
    "start": (ENDED, "a session runs one verl run at a time: start works once this one has ended"),
    "pause": (("running",), "pause works while the run is running"),
    "resume": (("paused",), "resume works while the run is paused"),
    "stop": (("starting", "running", "paused", "restarting"), "nothing runs to stop"),
    "rollback": (("failed",), "rollback is for a session whose run crashed"),
}


def latest_and_median(steps, column: str) -> tuple[float, float]:
    """The newest step's value of a metric and its median over the newest segment's steps (NaN where unknown)."""
    if column not in steps or not len(steps):
        return math.nan, math.nan
    values = steps[[column, "segment_id"]].dropna()
    if not len(values):
        return math.nan, math.nan
    segment = values[values["segment_id"] == values["segment_id"].iloc[-1]][column]
    return float(values[column].iloc[-1]), float(segment.median())


def what_you_can_do(state: str, replay: bool, speed: Any) -> str:
    """The page's one line on what the user can do in this state."""
    if state == "starting":
        return ("verl is starting" + (f" (its recorded start-up, at ×{fmt(speed)})" if replay else "")
                + ": the charts fill from the first step. A change applied now takes effect there.")
    if state == "running":
        return ("Running. Edit a knob and press Apply (a hot change takes effect at the next step), or apply an "
                "advisor's proposal; Pause holds the run between steps; Stop ends it."
                + (" A replay takes the changes its recording holds: they are listed just below, one click each."
                   if replay else ""))
    if state == "paused":
        return "Paused between steps: Resume goes on. A change applied now takes effect when it resumes."
    if state == "restarting":
        return "A restart-class change is under way (checkpoint → verl rebuilt in place or relaunched): its progress is under Apply."
    if state == "stopping":
        return "Stopping at the next step boundary."
    if state == "failed":
        return "The run crashed: Rollback relaunches the last good plan from its checkpoint, or Start a new session."
    if state in ENDED:
        return ("The replay has ended: Play again replays the recording from its start on this page."
                if replay else "The session has ended: Start runs a new one with its plan in force, on this page.")
    return ""


class SessionBar:
    def __init__(self, ctx: Context, switch=None):
        self.ctx = ctx
        self.switch = switch  # the dashboard's: follow a newly started session
        self._figures_of, self._figures = None, None  # the steps frame the header's figures were computed from
        self.status = W.HTML(_dom_classes=["wb-status"])
        self.buttons = {
            name: W.Button(description=name.capitalize(), _dom_classes=[f"wb-{name}"],
                           layout=W.Layout(width="auto"))
            for name in CONTROLS
        }
        for name, button in self.buttons.items():
            button.on_click(lambda _, name=name: self._control(name))
        self.message = W.HTML(_dom_classes=["wb-notice"])
        self.hint = W.HTML(_dom_classes=["wb-hint"])
        self.widget = W.VBox(
            [self.status, self.hint, W.HBox(list(self.buttons.values()) + [self.message])],
            _dom_classes=["wb-session-bar"],
        )

    def _control(self, name: str) -> None:
        session = self.ctx.session
        if name == "start":
            def start() -> str:
                new = session.start_like()
                if self.switch is not None:
                    self.switch(new)
                return f"session {new.id}: this page follows it now, as its operator (viewers: ?session={new.id})"

            self.ctx.background("start", start)
            return
        if name == "stop":
            self.ctx.background(name, lambda: session.stop(wait=False))
            return
        self.ctx.background(name, getattr(session, name))

    def prepare(self, feed, news):
        steps = feed.steps
        segment = int(steps["segment_id"].iloc[-1]) if len(steps) else None
        kind = feed.kind
        replay = kind is not None and kind.is_replay
        if replay:
            recorded = time.strftime("%Y-%m-%d", time.localtime(kind.recorded_at)) if kind.recorded_at is not None \
                else kind.recorded_date
            origin = (f"replay of {html.escape(str(kind.recording or '?').rsplit('/', 1)[-1])} "
                      f"(recorded {html.escape(recorded)}"
                      f" on {html.escape(kind.gpu_name or 'a GPU')}; ×{fmt(kind.speed)} speed)")
        else:
            origin = "live"
        state = feed.state or "?"
        if self._figures_of is not steps:  # the feed replaces its steps frame when steps arrive: not every tick
            self._figures_of = steps
            self._figures = latest_and_median(steps, "perf/throughput"), latest_and_median(steps, "timing_s/step")
        throughput, step_time = self._figures
        stats = [
            ("segment", fmt(segment)), ("step", fmt(feed.last_step)),
            ("tokens/s/GPU", f"{fmt(throughput[0], 4)} last step · {fmt(throughput[1], 4)} segment median"),
            ("s/step", f"{fmt(step_time[0])} last step · {fmt(step_time[1])} segment median"),
        ]
        markup = (
            f"<span class='wb-state wb-state-{html.escape(state)}'>{html.escape(state)}</span> "
            f"<span class='wb-muted'>session {html.escape(self.ctx.session.id)} · {origin}</span><br>"
            + "".join(f"<span class='wb-stat'>{k} <b>{html.escape(v)}</b></span>" for k, v in stats)
        )
        with self.ctx.lock:
            notice = self.ctx.notice
        return state, replay, markup, what_you_can_do(state, replay, kind.speed if replay else None), notice

    def show(self, payload) -> None:
        state, replay, markup, hint, notice = payload
        assign(self.status, value=markup)
        operator = self.ctx.operator
        assign(self.hint, value=f"<span class='wb-hint-text'>{html.escape(hint if operator else READ_ONLY_REASON)}</span>")
        assign(self.buttons["start"], description="Play again" if replay else "Start")
        for name, button in self.buttons.items():
            states, why = CONTROLS[name]
            enabled = operator and state in states
            assign(button, disabled=not enabled,
                   tooltip="" if enabled else (READ_ONLY_REASON if not operator else why))
        assign(self.message, value=f"<span class='wb-muted'>{html.escape(notice if operator else '')}</span>")
