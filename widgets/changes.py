"""Knobs, pending changes and Apply: editors generated from the knob table, the pending changes as a diff
(`Session.preview`, nothing queued) with what Apply will do, then Apply and its progress, followed through the
ApplyResult handle and the session's events (hot: at the next step; restart: checkpoint → relaunch → verl start-up
→ first resumed step). A refused change marks the offending editors with their messages.

The placement group's editors are shown by the device planner (placement.py) but edited into the same pending set.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import pandas as pd

from workbench.knob import KEEP_WORDS, REBUILT, RELAUNCHED, ROLLOUT_REBUILT, restart_kind
from workbench.plan import PlanError

from .common import READ_ONLY_REASON, Context, assign, esc, fmt, heading, said_once, table
from .knob_editor import KnobEditor, as_text, plain
from .offers import RecordedChanges

FEATURED_GROUPS = ("token budgets", "LoRA critic", "async")
PLACEMENT_GROUP = "placement"
PLAN_KEY = "plan"  # problems not tied to one knob
HOT_WORDS = "hot: the runner applies it at the next step boundary, no restart"
# A restart's stages: the first three end with the event of that kind (newer than the Apply press), the last when the
# handle says resumed.
RESTART_STAGES = (
    ("checkpoint", "checkpoint at the step boundary"),
    ("launched", "relaunch verl with the new plan"),
    ("started", "verl start-up (Ray, models, rollout engine)"),
    ("resumed", "first resumed step"),
)


@dataclass(frozen=True)
class RestartStory:
    """What the panel says of a restart, by how it is carried out (knob.restart_kind): before Apply (`words`, "{}":
    what it keeps), its stages, and while verl starts or is rebuilt (`waiting`, "{:.0f}": seconds so far)."""

    words: str
    stages: tuple[tuple[str, str], ...]
    waiting: str


RESTART_STORIES = {
    RELAUNCHED: RestartStory(
        "restart: checkpoint at the next step boundary → relaunch verl with the new plan → verl start-up "
        "(~3–4 min on an H200) → resume from the checkpoint",
        RESTART_STAGES, "verl start-up: {:.0f} s so far (a start-up took ~190–230 s on an H200)"),
    # Its `launched` event opens the rebuilt segment, `started` says verl is ready again.
    REBUILT: RestartStory(
        "restart: checkpoint at the next step boundary → verl rebuilt in place with the new plan, keeping {} "
        "(~1–2 min on an H200) → resume from the checkpoint",
        (RESTART_STAGES[0], ("launched", "rebuild verl in place with the new plan"),
         ("started", "verl ready again (FSDP workers, checkpoint load, weights to the kept rollout)"),
         RESTART_STAGES[-1]),
        "rebuilding verl in place: {:.0f} s so far (34–37 s on an H200 with a 0.5B model)"),
    # A rollout setting: no checkpoint, the rollout rebuilt beside the kept trainer.
    ROLLOUT_REBUILT: RestartStory(
        "restart: at the next step boundary → the rollout rebuilt in place with the new plan, keeping {} (no "
        "checkpoint; ~2 min to the first step after it on an H200) → go on from that step",
        (("launched", "rebuild the rollout in place with the new plan"),
         ("started", "rollout ready again (vLLM start-up, the trainer's weights pushed to it)"), RESTART_STAGES[-1]),
        "rebuilding the rollout in place: {:.0f} s so far (65 s on an H200 with a 0.5B model)"),
}
HOT_STAGES = (("accepted", "accepted by the supervisor"), ("applied", "in force from the next step"))
FAILED_STATES = ("refused", "not_applied")
STARTUP_PHASES_EVERY_S = 2.0


@dataclass
class Tracked:
    """An Apply in flight (or the last one), followed until its handle says done."""

    handle: Any
    label: str
    pressed_at: float = field(default_factory=time.time)
    problems: dict[str, str] = field(default_factory=dict)
    done: bool = False


def _problems_of(error: Exception) -> dict[str, str]:
    problems = getattr(error, "problems", None)
    if isinstance(problems, dict):
        return {str(k): str(v) for k, v in problems.items()}
    if isinstance(problems, (list, tuple)):
        return {PLAN_KEY: "; ".join(map(str, problems))}
    return {PLAN_KEY: str(error)}


def _stage_list(stages, done_names: set[str], failed: bool = False) -> str:
    items, now_marked = [], False
    for name, words in stages:
        if name in done_names:
            css, mark = "wb-done", "✓"
        elif not now_marked and not failed:
            css, mark, now_marked = "wb-now", "…", True
        else:
            css, mark = "wb-todo", "·"
        items.append(f"<li class='{css}' data-stage='{name}'>{mark} {html.escape(words)}</li>")
    return f"<ol class='wb-progress'>{''.join(items)}</ol>"


class ChangesPanel:
    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.editors: dict[str, KnobEditor] = {}
        self.preview = None
        self.parse_errors: dict[str, str] = {}
        self.tracked: Tracked | None = None
        self._phases_read_at, self._phases_markup = -STARTUP_PHASES_EVERY_S, ""
        self._operator_shown: bool | None = None  # editors' enabled state follows this (a token may unlock them)
        self.edit_irrelevant = W.Checkbox(value=False, indent=False, _dom_classes=["wb-edit-irrelevant"],
                                          description="also edit knobs the plan in force doesn't use")
        self.edit_irrelevant.observe(lambda _: self._enable(force=True), "value")
        self.featured = W.VBox(_dom_classes=["wb-knob-groups"])
        self.more = W.Accordion(_dom_classes=["wb-more-knobs"])
        self.placement_editors = W.VBox(_dom_classes=["wb-placement-knobs"])  # shown by the device planner
        self.diff = W.HTML("<span class='wb-muted'>No pending changes.</span>", _dom_classes=["wb-diff"])
        self.apply_button = W.Button(description="Apply", disabled=True, _dom_classes=["wb-apply"])
        self.discard_button = W.Button(description="Discard", disabled=True, _dom_classes=["wb-discard"])
        self.apply_button.on_click(lambda _: self.apply())
        self.discard_button.on_click(lambda _: self.discard())
        self.progress = W.HTML(_dom_classes=["wb-apply-progress"])
        self.recorded = RecordedChanges(self.apply_recorded)  # the dashboard shows its widget at the page's top
        self.widget = W.VBox(
            [heading("Knobs"), self.edit_irrelevant, self.featured, self.more, heading("Pending changes"), self.diff,
             W.HBox([self.apply_button, self.discard_button]), self.progress],
            _dom_classes=["wb-changes"],
        )

    # ----------------------------------------------------------------- editors from the knob table
    def _build(self, knob_table: pd.DataFrame, gpu_count: int | None) -> None:
        rows = knob_table.to_dict("records")
        for row in rows:
            self.editors[row["name"]] = KnobEditor(row, self._edited, gpu_count=gpu_count)
        self._operator_shown = None
        groups: dict[str, list[W.Widget]] = {}
        for row in rows:
            groups.setdefault(row["group"], []).append(self.editors[row["name"]].widget)
        self.placement_editors.children = groups.pop(PLACEMENT_GROUP, [])
        featured = []
        for group in FEATURED_GROUPS:
            if group in groups:
                featured += [W.HTML(f"<b>{html.escape(group)}</b>"), *groups.pop(group)]
        self.featured.children = featured
        self.more.children = [W.VBox(children) for children in groups.values()]
        for i, group in enumerate(groups):
            self.more.set_title(i, group)

    def _sync(self, knob_table: pd.DataFrame) -> bool:
        """Follow the plan in force: editors whose knob's value or relevance changed show the new state."""
        moved = False
        for row in knob_table.to_dict("records"):
            editor = self.editors.get(row["name"])
            if editor is None:
                continue
            if plain(row["value"]) != editor.current or bool(row.get("relevant", True)) != editor.relevant:
                editor.set_current(row, keep_edit=editor.is_changed())  # an edit stays pending against the new plan
                moved = True
        return moved

    # ----------------------------------------------------------------- pending changes
    def pending(self) -> dict[str, Any]:
        """The edited knobs whose values differ from the plan in force (text that doesn't parse is left out)."""
        with self.ctx.lock:
            changes, self.parse_errors = {}, {}
            for name, editor in self.editors.items():
                value, error = editor.read()
                if error is not None:
                    self.parse_errors[name] = error
                elif value != editor.current:
                    changes[name] = value
            return changes

    def _edited(self, _name: str | None = None) -> None:
        with self.ctx.lock:
            changes = self.pending()
            self.preview = self.ctx.session.preview(changes) if changes else None
            self._mark()
            self._render_diff()

    def _mark(self, extra: dict[str, str] | None = None) -> None:
        problems = dict(getattr(self.preview, "problems", None) or {})
        warnings = dict(getattr(self.preview, "warnings", None) or {})
        problems.update(self.parse_errors)
        problems.update(extra or {})
        for name, editor in self.editors.items():
            editor.mark(problems.get(name, ""), warnings.get(name, ""))

    def _render_diff(self, note: str = "") -> None:
        p = self.preview
        parts = []
        if p is not None and p.diff:
            parts.append(table(["knob", "before", "after", "apply"],
                               [(d["knob"], as_text("", plain(d["before"])), as_text("", plain(d["after"])),
                                 d["apply"]) for d in p.diff], css="wb-table wb-diff-table"))
        if p is not None and p.ok:
            words = (HOT_WORDS if p.mode == "hot"
                     else RESTART_STORIES[restart_kind(p.keeps)].words.format(KEEP_WORDS.get(p.keeps, "")))
            parts.append(f"<div class='wb-will'>Apply will do — {html.escape(words)}</div>")
            for knob, text in (p.warnings or {}).items():
                parts.append(f"<div class='wb-warning'>{esc(said_once(knob, text))}</div>")
        problems = dict(getattr(p, "problems", None) or {})
        problems.update(self.parse_errors)
        if problems:
            parts.append("<div class='wb-problem'>Nothing can be applied until this is fixed:<ul>"
                         + "".join(f"<li>{esc(said_once(k, v))}</li>" for k, v in problems.items()) + "</ul></div>")
        if not parts:
            parts.append("<span class='wb-muted'>No pending changes.</span>")
        if note:
            parts.append(f"<div class='wb-problem'>{html.escape(note)}</div>")
        assign(self.diff, value="".join(parts))
        self._enable()

    def _enable(self, force: bool = False) -> None:
        operator = self.ctx.operator
        in_flight = self.tracked is not None and not self.tracked.done
        p = self.preview
        ready = p is not None and p.ok and not self.parse_errors
        why = (READ_ONLY_REASON if not operator else "a change is being applied" if in_flight
               else "" if ready else "no valid pending change")
        # Primary blue only while it can be pressed: a disabled Apply looks disabled.
        assign(self.apply_button, disabled=bool(why), tooltip=why, button_style="" if why else "primary")
        assign(self.discard_button, disabled=not operator or (p is None and not self.parse_errors))
        assign(self.edit_irrelevant, disabled=not operator)
        if force or operator != self._operator_shown:
            with self.ctx.lock:
                for editor in self.editors.values():
                    editor.set_enabled(operator, READ_ONLY_REASON, self.edit_irrelevant.value)
            self._operator_shown = operator

    # ----------------------------------------------------------------- apply
    def apply(self) -> Any:
        """Apply the pending changes (the Apply button). Returns the ApplyResult handle, or None if refused here."""
        with self.ctx.lock:
            changes = self.pending()
            if not changes or self.parse_errors:
                self._edited()
                return None
            try:
                handle = self.ctx.session.apply(changes, wait=False)
            except PlanError as error:
                self.preview = None
                self._mark(_problems_of(error))
                self._render_diff(note=said_once("refused", error))
                return None
            except Exception as error:  # read-only, supervisor gone, …: said in words at the button
                self._render_diff(note=said_once("not applied", error))
                return None
            self.track(handle, "your change")
            return handle

    def apply_recorded(self, changes: dict[str, Any]) -> Any:
        """Apply one of the changes a replay offers (its button): the pending edits give way to it."""
        with self.ctx.lock:
            for editor in self.editors.values():
                editor.reset()
            self.preview, self.parse_errors = None, {}
            try:
                handle = self.ctx.session.apply(changes, wait=False)
            except Exception as error:  # read-only, the session ended meanwhile, …: said at the button
                self._render_diff(note=said_once("not applied", error))
                return None
            self._render_diff()
            self.track(handle, "recorded change")
            return handle

    def track(self, handle: Any, label: str) -> None:
        with self.ctx.lock:
            self.tracked = Tracked(handle, label)
            self.progress.value = f"<b>{html.escape(label)}</b>: {html.escape(str(handle.message))}"
            self._enable()

    def switched(self) -> None:
        """The page follows a new session: the old one's Apply progress goes; pending edits stay."""
        with self.ctx.lock:
            self.tracked = None
            assign(self.progress, value="")
            self.recorded.switched()
            self._edited()

    def discard(self) -> None:
        with self.ctx.lock:
            for editor in self.editors.values():
                editor.reset()
            self.preview, self.parse_errors = None, {}
            self._render_diff()

    # ----------------------------------------------------------------- update loop
    def prepare(self, feed, news):
        with self.ctx.lock:
            tracked = self.tracked
        progress = None
        if tracked is not None and not tracked.done:
            handle = tracked.handle.refresh()
            progress = self._progress(tracked, handle, feed.events)
        knobs = feed.knob_table if "knobs" in news or not self.editors else None
        return knobs, progress, feed.meta.get("gpu_count"), self.recorded.prepare(feed, news), feed.state

    def _progress(self, tracked: Tracked, handle, events: pd.DataFrame) -> tuple[str, dict[str, str], bool]:
        state = handle.state
        failed = state in FAILED_STATES
        since = events[events["t"] >= tracked.pressed_at - 1.0] if len(events) else events
        kinds = set(since["kind"]) if len(since) else set()
        if handle.mode == "restart":
            done = {name for name, _ in RESTART_STAGES[:-1] if name in kinds}
            if state == "resumed":
                done |= {name for name, _ in RESTART_STAGES}
            kind = restart_kind(handle.keeps)
            stages = _stage_list(RESTART_STORIES[kind].stages, done, failed)
            if "launched" in done and "started" not in done and not failed:
                so_far = time.time() - float(since[since["kind"] == "launched"]["t"].iloc[-1])
                stages += (f"<div class='wb-muted'>{RESTART_STORIES[kind].waiting.format(so_far)}</div>"
                           + (self._startup_phases() if kind == RELAUNCHED else ""))
            lost = since[since["kind"] == "not_resumed"]["text"].tolist() if len(since) else []
            latest = since.iloc[-1]["text"] if len(since) and not handle.done else ""
        else:
            done = {"accepted"} if state in ("accepted", "applied") else set()
            done |= {"applied"} if state == "applied" else set()
            stages = _stage_list(HOT_STAGES, done, failed)
            lost, latest = [], ""
        markup = (f"<b>{html.escape(tracked.label)}</b>: {html.escape(str(handle.message))}{stages}"
                  + "".join(f"<div class='wb-warning'>{html.escape(t)}</div>" for t in lost)
                  + (f"<div class='wb-muted'>latest: {html.escape(str(latest))}</div>" if latest else ""))
        problems = {str(k): str(v) for k, v in (handle.problems or {}).items()}
        return markup, problems, bool(handle.done)

    def _startup_phases(self) -> str:
        """verl's start-up phases so far, from the relaunched run's log (rate-limited: it reads a log file)."""
        now = time.monotonic()
        if now - self._phases_read_at >= STARTUP_PHASES_EVERY_S:
            self._phases_read_at = now
            try:
                phases = self.ctx.session.startup_phases()
            except (OSError, ValueError):  # no log (a replay of a recording): the stage list says enough
                phases = None
            self._phases_markup = "" if phases is None or phases.empty else (
                "<ul class='wb-startup'>" + "".join(
                    f"<li>{html.escape(str(r.phase))}: {fmt(r.seconds)} s</li>" for r in phases.itertuples()
                ) + "</ul>")
        return self._phases_markup

    def show(self, payload) -> None:
        knobs, progress, gpu_count, offers, state = payload
        with self.ctx.lock:
            self.recorded.show(offers, self.ctx.operator, state)
            if knobs is not None and len(knobs):
                if not self.editors:
                    self._build(knobs, gpu_count)
                    self._render_diff()
                elif self._sync(knobs):
                    self._enable(force=True)
                    self._edited()
            if progress is not None and self.tracked is not None:
                markup, problems, done = progress
                assign(self.progress, value=markup)
                if problems:
                    self._mark(problems)
                if done and not self.tracked.done:
                    self.tracked.done = True
            self._enable()  # follows the operator (a token may have unlocked the page) and any apply in flight
