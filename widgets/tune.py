"""Tune: live auto-tune from the page (`Session.tune`, workbench/tune.py). Pick the knobs to search (their other
choices, or half and twice an integer), the steps per trial and the most trials; Tune runs the search in its own
thread (it blocks while it tries plans, and honours pause and stop), and the panel shows it running, then the trials
table and the plan it kept in force, or why it failed. The update loop shows the thread's outcome: the thread only
records it under `Context.lock`.

Autopilot (`Session.autopilot`, workbench/autopilot.py) follows the advisor round by round, within a round and a
time budget; its story fills in after each round and Stop ends it at the next check. Only the operator can start
either: the page disables them for a viewer and the engine refuses a read-only handle whatever the page does."""

from __future__ import annotations

import html
import threading
import time

import ipywidgets as W

from workbench.knobs import KNOBS

from .common import READ_ONLY_REASON, assign, heading

RUNNING_REASON = "a tune is running: wait for it to end (or pause / stop the session)"
AUTOPILOT_RUNNING = "the autopilot is running: Stop it first"
STATE_CSS = {"running": "wb-changed", "done": "wb-changed", "failed": "wb-problem", "refused": "wb-problem"}
NO_KNOB = "choose at least one knob to search (ctrl/shift-click in the list)"


def tunable(knob_table) -> list[tuple[str, str]]:
    """(label, name) of the knobs Tune can vary by name alone (bool, choice, an int with a value) that matter in the
    plan and leave the algorithm alone: hot ones first, each labelled hot or restart."""
    rows = [r for r in knob_table.itertuples() if r.relevant and not KNOBS[r.name].changes_algorithm
            and (r.kind in ("bool", "choice") or (r.kind == "int" and isinstance(r.value, int)))]
    rows.sort(key=lambda r: (r.apply != "hot", r.name))
    return [(f"{r.name} ({r.apply})", r.name) for r in rows]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class TunePanel:
    def __init__(self, ctx):
        self.ctx = ctx
        self.knobs = W.SelectMultiple(options=[], rows=8, description="knobs", layout=W.Layout(width="100%"),
                                      _dom_classes=["wb-tune-knobs"])
        self.steps = W.BoundedIntText(value=3, min=1, max=1000, description="steps/trial",
                                      layout=W.Layout(width="170px"), _dom_classes=["wb-tune-steps"])
        self.trials = W.BoundedIntText(value=8, min=1, max=1000, description="max trials",
                                       layout=W.Layout(width="170px"), _dom_classes=["wb-tune-trials"])
        self.button = W.Button(description="Tune", _dom_classes=["wb-tune-run"], layout=W.Layout(width="auto"))
        self.button.on_click(lambda _: self.run())
        self.status = W.HTML(_dom_classes=["wb-tune-status"])
        self.result = W.HTML(_dom_classes=["wb-tune-result"])
        self.autopilot = AutopilotControl(ctx, busy=lambda: self.state == "running", shown=lambda: self._shown())
        self.widget = W.VBox([heading("Tune"), self.knobs, W.HBox([self.steps, self.trials, self.button]),
                              self.status, self.result, self.autopilot.widget], _dom_classes=["wb-tune"])
        # What the tune thread records and the loop shows: "idle" | "running" | "done" | "failed" | "refused".
        self.state, self.message, self.trials_html = "idle", "", ""
        self.thread: threading.Thread | None = None

    # ----------------------------------------------------------------- the update loop
    def prepare(self, feed, news):
        options = tunable(feed.knob_table) if "knobs" in news and len(feed.knob_table) else None
        with self.ctx.lock:
            return options, self.state, self.message, self.trials_html, self.autopilot.snapshot()

    def show(self, payload) -> None:
        options, state, message, trials_html, autopilot = payload
        self.autopilot.show(autopilot, tuning=state == "running")
        if options is not None and list(self.knobs.options) != options:
            chosen = set(self.knobs.value)
            self.knobs.options = options
            self.knobs.value = tuple(name for _, name in options if name in chosen)
        assign(self.status, value=_status("wb-tune", state, message))
        assign(self.result, value=trials_html)
        reason = (READ_ONLY_REASON if not self.ctx.operator else RUNNING_REASON if state == "running" else
                  AUTOPILOT_RUNNING if autopilot[0] == "running" else "")
        for control in (self.knobs, self.steps, self.trials, self.button):
            assign(control, disabled=bool(reason))
        assign(self.button, tooltip=reason)

    def _shown(self) -> None:
        with self.ctx.lock:
            self.show((None, self.state, self.message, self.trials_html, self.autopilot.snapshot()))

    # ----------------------------------------------------------------- the Tune button
    def run(self) -> None:
        """Start `session.tune` with the chosen knobs in a thread; a refusal (no knob, a viewer, one already
        running) is said in the status and starts nothing."""
        session, knobs = self.ctx.session, list(self.knobs.value)
        steps, trials = int(self.steps.value), int(self.trials.value)
        with self.ctx.lock:
            if self.state == "running":
                return
            refusal = (READ_ONLY_REASON if not session.is_operator else NO_KNOB if not knobs else
                       AUTOPILOT_RUNNING if self.autopilot.state == "running" else None)
            if refusal:
                self.state, self.message = "refused", refusal
            else:
                self.state, self.trials_html = "running", ""
                self.message = (f"{', '.join(knobs)}: up to {trials} trial(s) of {steps} step(s), "
                                f"started {time.strftime('%H:%M:%S')}")
                self.thread = threading.Thread(target=self._tune, args=(session, knobs, steps, trials),
                                               name="wb-tune", daemon=True)
                self.thread.start()
        self._shown()

    def _tune(self, session, knobs: list[str], steps: int, trials: int) -> None:
        try:
            result = session.tune(knobs=knobs, steps_per_trial=steps, max_trials=trials)
        except Exception as error:  # said at the panel, in one line
            with self.ctx.lock:
                self.state, self.message = "failed", _one_line(f"{type(error).__name__}: {error}")
            return
        kept = (f"kept {', '.join(f'{k} = {v!r}' for k, v in result.best.items())} "
                f"({result.best_step_time_s:.3g} s/step)" if result.best else "no trial completed: plan unchanged")
        with self.ctx.lock:
            self.state, self.message = "done", _one_line(f"{kept}; ended because {result.ended_because}")
            self.trials_html = result.trials.to_html(classes="wb-table wb-tune-trials-table", index=False,
                                                     na_rep="–")


def _status(prefix: str, state: str, message: str) -> str:
    if state == "idle":
        return ""
    return (f"<span class='{prefix}-{state} {STATE_CSS.get(state, 'wb-muted')}'>{html.escape(state)}"
            f"{': ' if message else ''}{html.escape(message)}</span>")


class AutopilotControl:
    """Start the autopilot with a round and a time budget, see its story round by round, Stop it."""

    def __init__(self, ctx, busy, shown):
        # busy(): whether a tune is running (one or the other at a time); shown(): the panel redrawn from its state
        self.ctx, self.busy, self._shown = ctx, busy, shown
        self.rounds = W.BoundedIntText(value=6, min=1, max=100, description="rounds",
                                       layout=W.Layout(width="150px"), _dom_classes=["wb-autopilot-rounds"])
        self.minutes = W.BoundedIntText(value=60, min=1, max=24 * 60, description="minutes",
                                        layout=W.Layout(width="160px"), _dom_classes=["wb-autopilot-minutes"])
        self.button = W.Button(description="Autopilot", _dom_classes=["wb-autopilot-run"],
                               layout=W.Layout(width="auto"))
        self.stop_button = W.Button(description="Stop autopilot", _dom_classes=["wb-autopilot-stop"],
                                    layout=W.Layout(width="auto"), disabled=True)
        self.button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        self.status = W.HTML(_dom_classes=["wb-autopilot-status"])
        self.story = W.HTML(_dom_classes=["wb-autopilot-story"])
        self.widget = W.VBox([W.HTML("<b>Autopilot</b>: applies the advisor's top safe finding each round, keeps "
                                     "it if faster, rolls it back if slower or crashed"),
                              W.HBox([self.rounds, self.minutes, self.button, self.stop_button]), self.status,
                              self.story], _dom_classes=["wb-autopilot"])
        # Written by the autopilot's thread under ctx.lock, shown by the update loop.
        self.state, self.message, self.story_html = "idle", "", ""
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()

    def snapshot(self) -> tuple[str, str, str]:
        return self.state, self.message, self.story_html

    def show(self, payload, tuning: bool) -> None:
        state, message, story_html = payload
        assign(self.status, value=_status("wb-autopilot", state, message))
        assign(self.story, value=story_html)
        reason = (READ_ONLY_REASON if not self.ctx.operator else AUTOPILOT_RUNNING if state == "running" else
                  RUNNING_REASON if tuning else "")
        for control in (self.rounds, self.minutes, self.button):
            assign(control, disabled=bool(reason))
        assign(self.button, tooltip=reason)
        assign(self.stop_button, disabled=not (self.ctx.operator and state == "running"))

    def run(self) -> None:
        """Start `session.autopilot` in a thread; a refusal (a viewer, a tune or autopilot running) is said in the
        status and starts nothing."""
        session, rounds, minutes = self.ctx.session, int(self.rounds.value), int(self.minutes.value)
        with self.ctx.lock:
            if self.state == "running":
                return
            refusal = READ_ONLY_REASON if not session.is_operator else RUNNING_REASON if self.busy() else None
            if refusal:
                self.state, self.message = "refused", refusal
            else:
                self.state, self.story_html = "running", ""
                self.message = f"up to {rounds} round(s) in {minutes} min, started {time.strftime('%H:%M:%S')}"
                self.stop_event = threading.Event()
                self.thread = threading.Thread(target=self._autopilot, args=(session, rounds, minutes),
                                               name="wb-autopilot", daemon=True)
                self.thread.start()
        self._shown()

    def stop(self) -> None:
        self.stop_event.set()

    def _story(self, story) -> None:
        table = story.to_html(classes="wb-table wb-autopilot-story-table", index=False, na_rep="–",
                              float_format=lambda x: f"{x:.1f}")
        with self.ctx.lock:
            self.story_html = table

    def _autopilot(self, session, rounds: int, minutes: int) -> None:
        try:
            result = session.autopilot(max_rounds=rounds, budget_s=60.0 * minutes, stop=self.stop_event,
                                       on_round=self._story)
        except Exception as error:  # said at the panel, in one line
            with self.ctx.lock:
                self.state, self.message = "failed", _one_line(f"{type(error).__name__}: {error}")
            return
        self._story(result.story)
        gain = f"{result.speedup:.2f}× tokens/s/GPU" if result.speedup == result.speedup else "no measurement"
        with self.ctx.lock:
            self.state, self.message = "done", _one_line(
                f"{result.rounds} round(s), {result.crashes} crash(es), {gain}; ended because {result.ended_because}")
