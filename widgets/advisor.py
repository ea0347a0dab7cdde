"""Advisor: the findings the measurements support (`Session.advice_findings`), each with its evidence, the knob
change it proposes, what that should do, and an Apply button (`Session.apply_finding`) whose progress the changes
panel follows like any other change."""

from __future__ import annotations

import html

import ipywidgets as W

from .common import READ_ONLY_REASON, assign, heading

SEVERITY_CSS = {"high": "wb-problem", "medium": "wb-warning"}


def _change_text(change: dict) -> str:
    return ", ".join(f"{k} = {v!r}" for k, v in change.items())


class AdvisorPanel:
    def __init__(self, ctx, changes):
        self.ctx = ctx
        self.changes = changes  # the changes panel: it shows the progress of an applied finding
        self.list = W.VBox(_dom_classes=["wb-findings"])
        self.note = W.HTML(_dom_classes=["wb-advice-note"])
        self.widget = W.VBox([heading("Advisor"), self.note, self.list], _dom_classes=["wb-advisor"])
        self._shown: tuple = ()
        self._buttons: list[tuple[W.Button, object]] = []

    def prepare(self, feed, news):
        if "findings" not in news:
            return None
        findings = list(feed.findings or [])
        key = tuple((f.rule, f.title, f.evidence_text, _change_text(f.change)) for f in findings)
        return (None if key == self._shown else (key, findings)), feed.findings_note

    def _card(self, finding) -> W.Widget:
        css = SEVERITY_CSS.get(str(finding.severity), "wb-muted")
        body = W.HTML(
            f"<div><span class='{css}'>[{html.escape(str(finding.severity))}]</span> "
            f"<b>{html.escape(finding.title)}</b></div>"
            f"<div class='wb-muted'>evidence: {html.escape(finding.evidence_text)}</div>"
            + (f"<div>proposal: <code>{html.escape(_change_text(finding.change))}</code> — "
               f"{html.escape(finding.expected)}</div>" if finding.change else
               f"<div class='wb-muted'>{html.escape(finding.expected)}</div>")
        )
        status = W.HTML()
        if not finding.change:
            return W.VBox([body], _dom_classes=["wb-finding"])
        button = W.Button(description="Apply", _dom_classes=["wb-finding-apply"], layout=W.Layout(width="auto"))
        button.on_click(lambda _, f=finding, st=status: self._apply(f, st))
        self._buttons.append((button, finding))
        return W.VBox([body, W.HBox([button, status])], _dom_classes=["wb-finding", f"wb-finding-{finding.rule}"])

    def _apply(self, finding, status: W.HTML) -> None:
        try:
            handle = self.ctx.session.apply_finding(finding, wait=False)
        except Exception as error:  # PlanError, read-only, …: said at the finding
            status.value = f"<span class='wb-problem'>{html.escape(str(error))}</span>"
            return
        status.value = f"<span class='wb-changed'>{html.escape(str(handle.message))}</span>"
        self.changes.track(handle, f"advice: {finding.title}")

    def show(self, payload) -> None:
        cards, note = payload
        assign(self.note, value=f"<span class='wb-muted'>{html.escape(note)}</span>")
        if cards is not None:
            key, findings = cards
            self._shown, self._buttons = key, []
            self.list.children = [self._card(f) for f in findings] or [
                W.HTML("<span class='wb-muted'>No findings: nothing in the measurements calls for a change "
                       "(or too few steps measured yet).</span>")]
        operator = self.ctx.operator
        for button, _ in self._buttons:
            assign(button, disabled=not operator, tooltip="" if operator else READ_ONLY_REASON)
