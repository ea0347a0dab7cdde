"""Tune: live auto-tune from the page (`Session.tune`, workbench/tune.py). Pick the knobs to search (their other
choices, or half and twice an integer), the steps per trial and the most trials; Tune runs the search in its own
thread (it blocks while it tries plans, and honours pause and stop), and the panel shows it running, then the trials
table and the plan it kept in force, or why it failed. The update loop shows the thread's outcome: the thread only
records it under `Context.lock`."""

from __future__ import annotations

import html
import threading
import time

import ipywidgets as W

from workbench.knobs import KNOBS

from .common import READ_ONLY_REASON, assign, heading

RUNNING_REASON = "a tune is running: wait for it to end (or pause / stop the session)"
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
        self.widget = W.VBox([heading("Tune"), self.knobs, W.HBox([self.steps, self.trials, self.button]),
                              self.status, self.result], _dom_classes=["wb-tune"])
        # What the tune thread records and the loop shows: "idle" | "running" | "done" | "failed" | "refused".
        self.state, self.message, self.trials_html = "idle", "", ""
        self.thread: threading.Thread | None = None

    # ----------------------------------------------------------------- the update loop
    def prepare(self, feed, news):
        options = tunable(self.ctx.session.knob_table()) if news & {"knobs", "meta", "state"} else None
        with self.ctx.lock:
            return options, self.state, self.message, self.trials_html

    def show(self, payload) -> None:
        options, state, message, trials_html = payload
        if options is not None and list(self.knobs.options) != options:
            chosen = set(self.knobs.value)
            self.knobs.options = options
            self.knobs.value = tuple(name for _, name in options if name in chosen)
        css = {"running": "wb-changed", "done": "wb-changed", "failed": "wb-problem", "refused": "wb-problem"}
        assign(self.status, value=(f"<span class='wb-tune-{state} {css.get(state, 'wb-muted')}'>"
                                   f"{html.escape(state)}{': ' if message else ''}{html.escape(message)}</span>"
                                   if state != "idle" else ""))
        assign(self.result, value=trials_html)
        reason = READ_ONLY_REASON if not self.ctx.operator else RUNNING_REASON if state == "running" else ""
        for control in (self.knobs, self.steps, self.trials, self.button):
            assign(control, disabled=bool(reason))
        assign(self.button, tooltip=reason)

    def _shown(self) -> None:
        with self.ctx.lock:
            self.show((None, self.state, self.message, self.trials_html))

    # ----------------------------------------------------------------- the Tune button
    def run(self) -> None:
        """Start `session.tune` with the chosen knobs in a thread; a refusal (no knob, a viewer, one already
        running) is said in the status and starts nothing."""
        session, knobs = self.ctx.session, list(self.knobs.value)
        steps, trials = int(self.steps.value), int(self.trials.value)
        with self.ctx.lock:
            if self.state == "running":
                return
            refusal = (READ_ONLY_REASON if not session.is_operator else NO_KNOB if not knobs else None)
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
