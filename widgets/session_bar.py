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


def _latest(steps, column: str) -> float:
    if column not in steps or not len(steps):
        return math.nan
    values = steps[column].dropna()
    return float(values.iloc[-1]) if len(values) else math.nan


def start_like(session):
    """A new session with the plan in force of an ended one: a live run, or the same recording replayed."""
    from workbench import Session

    meta = session.meta
    if meta.get("kind") == "replay":
        return Session.replay(meta["recording"], speed=meta.get("speed", 1.0), follow=meta.get("follow", True))
    return Session.start(session.plan)


class SessionBar:
    def __init__(self, ctx: Context, switch=None):
        self.ctx = ctx
        self.switch = switch  # the dashboard's: follow a newly started session
        self.status = W.HTML(_dom_classes=["wb-status"])
        self.buttons = {
            name: W.Button(description=name.capitalize(), _dom_classes=[f"wb-{name}"],
                           layout=W.Layout(width="auto"))
            for name in CONTROLS
        }
        for name, button in self.buttons.items():
            button.on_click(lambda _, name=name: self._control(name))
        self.message = W.HTML(_dom_classes=["wb-notice"])
        self.widget = W.VBox(
            [self.status, W.HBox(list(self.buttons.values()) + [self.message])],
            _dom_classes=["wb-session-bar"],
        )

    def _control(self, name: str) -> None:
        session = self.ctx.session
        if name == "start":
            def start() -> str:
                new = start_like(session)
                if self.switch is not None:
                    self.switch(new)
                return f"session {new.id} (its page: ?session={new.id})"

            self.ctx.background("start", start)
            return
        if name == "stop":
            self.ctx.background(name, lambda: session.stop(wait=False))
            return
        self.ctx.background(name, getattr(session, name))

    def prepare(self, feed, news):
        steps = feed.steps
        segment = int(steps["segment_id"].iloc[-1]) if len(steps) else None
        meta = feed.meta
        kind = meta.get("kind", "live")
        if kind == "replay":
            recorded = meta.get("recorded_at")
            recorded = time.strftime("%Y-%m-%d", time.localtime(recorded)) if isinstance(recorded, (int, float)) \
                else meta.get("date", "")
            origin = (f"replay of {html.escape(str(meta.get('recording', '?')).rsplit('/', 1)[-1])} "
                      f"(recorded {html.escape(str(recorded))}"
                      f" on {html.escape(str(meta.get('gpu_name', 'a GPU')))}; ×{fmt(meta.get('speed'))} speed)")
        else:
            origin = "live"
        state = feed.state or "?"
        stats = [
            ("segment", fmt(segment)), ("step", fmt(feed.last_step)),
            ("tokens/s/GPU", fmt(_latest(steps, "perf/throughput"), 4)),
            ("time per step", fmt(_latest(steps, "timing_s/step")) + " s"),
        ]
        markup = (
            f"<span class='wb-state wb-state-{html.escape(state)}'>{html.escape(state)}</span> "
            f"<span class='wb-muted'>session {html.escape(self.ctx.session.id)} · {origin}</span><br>"
            + "".join(f"<span class='wb-stat'>{k} <b>{html.escape(v)}</b></span>" for k, v in stats)
        )
        with self.ctx.lock:
            notice = self.ctx.notice
        return state, markup, notice

    def show(self, payload) -> None:
        state, markup, notice = payload
        assign(self.status, value=markup)
        operator = self.ctx.operator
        for name, button in self.buttons.items():
            states, why = CONTROLS[name]
            enabled = operator and state in states
            assign(button, disabled=not enabled,
                   tooltip="" if enabled else (READ_ONLY_REASON if not operator else why))
        text = notice if operator else READ_ONLY_REASON
        assign(self.message, value=f"<span class='wb-muted'>{html.escape(text)}</span>")
