"""Advisor: the findings the measurements support (`Session.advice_findings`), one line each: what is wrong, the
knob change it proposes and the gain expected, with an Apply button (`Session.apply_finding`, followed by the
changes panel like any other change). The evidence and where its numbers come from sit behind a disclosure, the
sources named as measurements (machine, date), not as files of this repository.

A finding whose change is already in force is not shown: advice is judged against the plan that runs now, even while
its numbers still come from the segment before.

The cards are slots built with the panel and filled in place (hidden while unused): a widget created while a page's
connection is down never reaches the page whole (tests/test_widgets_parts.py says how it failed)."""

from __future__ import annotations

import html
import re

import ipywidgets as W

from .common import READ_ONLY_REASON, assign, heading
from .knob_editor import plain

SEVERITY_CSS = {"high": "wb-problem", "medium": "wb-warning"}
CARD_SLOTS = 8  # findings shown at once (more than the advisor's rules give); the rest are counted in the note
GAIN_CHARS = 140  # the expected gain on the card's line; the whole text is behind the disclosure
# A repository path to a measurement (tests/data/h200_fused_logprob_2026-12-01/C_fused, bench/results/h200_2026-12-01/…)
# is named by its machine and date; other repository paths are left out.
MEASUREMENT_PATH = re.compile(r"\b(?:tests/data|bench/results|shared)/[\w.-]*?(h\d{3})[\w.-]*?_(\d{4}-\d{2}-\d{2})[\w./-]*")
OTHER_PATH = re.compile(r"\s*\(?\b(?:tests|bench|shared|workbench)/[\w./-]+\)?")


def change_text(change: dict) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in change.items())


def measurement_names(text: str) -> str:
    """Repository paths in a finding's words as the measurements they hold ("the H200 measurements of 2026-12-01")."""
    text = MEASUREMENT_PATH.sub(lambda m: f"the {m.group(1).upper()} measurements of {m.group(2)}", str(text))
    return OTHER_PATH.sub("", text)


def gain_line(expected: str) -> str:
    """The expected gain's first sentence, short enough for one line."""
    first = re.split(r"(?<=\.)\s", measurement_names(expected).strip(), maxsplit=1)[0].rstrip(".")
    return first if len(first) <= GAIN_CHARS else first[: GAIN_CHARS - 1].rstrip() + "…"


def in_force(change: dict, knob_table) -> bool:
    """Whether every value the change proposes is already in the plan in force."""
    if knob_table is None or not len(knob_table) or not change:
        return False
    values = {row.name: plain(row.value) for row in knob_table.itertuples()}
    return all(name in values and values[name] == plain(value) for name, value in change.items())


class CardSlot:
    """One finding's card: its line with the evidence behind a disclosure, Apply (when it proposes a change) and the
    feedback of an Apply. `fill` shows a finding in it, `fill(None)` hides it."""

    def __init__(self, apply):
        self.finding = None
        self.body = W.HTML()
        self.button = W.Button(description="Apply", _dom_classes=["wb-finding-apply"], layout=W.Layout(width="auto"))
        self.button.on_click(lambda _: self.finding is not None and self.finding.change and apply(self.finding,
                                                                                                  self.status))
        self.status = W.HTML(_dom_classes=["wb-finding-status"])
        self.widget = W.VBox([W.HBox([self.button, self.body]), self.status], _dom_classes=["wb-finding"],
                             layout=W.Layout(display="none"))

    def fill(self, finding, status: str = "") -> None:
        self.finding = finding
        if finding is None:
            assign(self.widget.layout, display="none")
            return
        assign(self.body, value=card_markup(finding))
        assign(self.button.layout, display="" if finding.change else "none")
        assign(self.status, value=status)
        assign(self.widget, _dom_classes=("wb-finding", f"wb-finding-{finding.rule}"))
        assign(self.widget.layout, display="")


def card_markup(finding) -> str:
    css = SEVERITY_CSS.get(str(finding.severity), "wb-muted")
    change = (f" — <code>{html.escape(change_text(finding.change))}</code>" if finding.change else "")
    line = (f"<div class='wb-finding-line'><span class='{css}'>[{html.escape(str(finding.severity))}]</span> "
            f"<b>{html.escape(finding.title)}</b>{change} — {html.escape(gain_line(finding.expected))}</div>")
    details = (f"<details class='wb-finding-why'><summary>evidence and sources</summary>"
               f"<div>{html.escape(measurement_names(finding.evidence_text))}</div>"
               f"<div>{html.escape(measurement_names(finding.expected))}</div></details>")
    return line + details


def status_markup(handle) -> str:
    css = "wb-problem" if handle.state in ("refused", "not_applied") else "wb-changed"
    return f"<span class='{css}'>{html.escape(str(handle.message))}</span>"


NO_FINDINGS = ("<span class='wb-muted'>No findings: nothing in the measurements calls for a change (or too few steps "
               "measured yet).</span>")


class AdvisorPanel:
    def __init__(self, ctx, changes):
        self.ctx = ctx
        self.changes = changes  # the changes panel: it shows the progress of an applied finding
        self.slots = [CardSlot(self._apply) for _ in range(CARD_SLOTS)]
        self.empty = W.HTML(NO_FINDINGS, layout=W.Layout(display="none"))
        self.list = W.VBox([slot.widget for slot in self.slots] + [self.empty], _dom_classes=["wb-findings"])
        self.note = W.HTML(_dom_classes=["wb-advice-note"])
        self.widget = W.VBox([heading("Advisor"), self.note, self.list], _dom_classes=["wb-advisor"])
        self._shown: tuple = ()
        self._not_shown = 0  # findings beyond the slots
        self._buttons: list[tuple[W.Button, object]] = []  # the Apply of each finding shown that proposes a change
        # rule -> ApplyResult: an Apply's feedback outlives the cards (re-judged every 30 s).
        self._applied: dict[str, object] = {}

    def prepare(self, feed, news):
        if not news & {"findings", "knobs"}:
            return (None, feed.findings_note) if self._applied else None  # an Apply's feedback follows its change
        findings = [f for f in (feed.findings or []) if not in_force(f.change, feed.knob_table)]
        key = tuple((f.rule, f.title, f.evidence_text, change_text(f.change)) for f in findings)
        return (None if key == self._shown else (key, findings)), feed.findings_note

    def _apply(self, finding, status: W.HTML) -> None:
        try:
            handle = self.ctx.session.apply_finding(finding, wait=False)
        except Exception as error:  # PlanError, read-only, …: said at the finding
            status.value = f"<span class='wb-problem'>{html.escape(str(error))}</span>"
            return
        self._applied[finding.rule] = handle
        status.value = status_markup(handle)
        self.changes.track(handle, f"advice: {finding.title}")

    def switched(self) -> None:
        """The page follows a new session: the old one's Apply feedback goes."""
        self._applied.clear()
        for slot in self.slots:
            assign(slot.status, value="")

    def show(self, payload) -> None:
        cards, note = payload
        if cards is not None:
            key, findings = cards
            self._shown = key
            for slot, finding in zip(self.slots, [*findings, *[None] * CARD_SLOTS]):
                handle = self._applied.get(finding.rule) if finding is not None else None
                slot.fill(finding, status_markup(handle) if handle is not None else "")
            self._buttons = [(slot.button, slot.finding) for slot in self.slots
                             if slot.finding is not None and slot.finding.change]
            assign(self.empty.layout, display="none" if findings else "")
            self._not_shown = max(0, len(findings) - CARD_SLOTS)
        if self._not_shown:
            note += f"; {self._not_shown} more findings not shown"
        assign(self.note, value=f"<span class='wb-muted'>{html.escape(note)}</span>")
        for slot in self.slots:  # the changes panel refreshes the handles each tick
            handle = self._applied.get(slot.finding.rule) if slot.finding is not None else None
            if handle is not None:
                assign(slot.status, value=status_markup(handle))
        operator = self.ctx.operator
        for button, _ in self._buttons:
            assign(button, disabled=not operator, tooltip="" if operator else READ_ONLY_REASON)
