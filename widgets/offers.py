"""The changes a replay can play, one click each: a replay plays only what its recording holds, so the page lists
the changes from the plan in force that lead to another recorded plan (`Session.recorded_changes`, read by the
feed beside the knob table), each with a button that applies it. A live session can take any valid change: nothing
is listed. The dashboard shows them at the top of the page, under the session's state: a first visit's first
move (issue 15), and a click there is answered there (where its effect will show)."""

from __future__ import annotations

import html
from typing import Any, Callable

import ipywidgets as W

from .common import READ_ONLY_REASON, assign
from .knob_editor import plain

TAKES_CHANGES = ("starting", "running", "paused")
OFFER_SLOTS = 6  # a recording holds a few plans: one offer per other plan
EFFECT = ("It takes effect at the end of the step under way (a restart-class change rebuilds or relaunches verl "
          "first): the Throughput chart below marks its segment (seg N) and draws its steps; Pending changes follows "
          "its progress.")


def offer_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k} = {plain(v)!r}" for k, v in changes.items())


class RecordedChanges:
    def __init__(self, apply: Callable[[dict[str, Any]], Any]):
        self._apply = apply  # the changes panel's: applies a change and follows it
        self.note = W.HTML(_dom_classes=["wb-offers-note"])
        self.buttons = W.VBox([self._slot(index) for index in range(OFFER_SLOTS)], _dom_classes=["wb-offers"])
        self.sent = W.HTML(_dom_classes=["wb-offers-sent"])
        self.widget = W.VBox([self.note, self.buttons, self.sent], _dom_classes=["wb-recorded-changes"])
        self.offers: list[dict[str, Any]] | None = []  # None: none read yet for the session followed

    def prepare(self, feed, news) -> list[dict[str, Any]] | None:
        """The offers anew when the feed read them again (the plan in force may have changed); else None."""
        return feed.offers if "offers" in news else None

    def show(self, offers: list[dict[str, Any]] | None, operator: bool, state: str | None) -> None:
        if offers is not None and offers != self.offers:
            self.offers = offers
            for index, button in enumerate(self.buttons.children):
                shown = index < len(offers)
                if shown:
                    assign(button, description=f"Apply: {offer_text(offers[index])}")
                assign(button.layout, display="" if shown else "none")
            more = f" (the first {OFFER_SLOTS} of {len(offers)})" if len(offers) > OFFER_SLOTS else ""
            assign(self.note, value="" if not offers else
                   "<span class='wb-muted'>This replay plays what its recording holds. Changes it can play from "
                   f"the plan in force{more} (one click applies one):</span>")
        if offers is not None and not offers:
            assign(self.sent, value="")
        why = READ_ONLY_REASON if not operator else "" if state in TAKES_CHANGES else f"the session is {state}"
        for button in self.buttons.children:
            assign(button, disabled=bool(why), tooltip=why)

    def _slot(self, index: int) -> W.Button:
        """A button for the offer at `index` (hidden while there is none): built with the panel, filled in place (a
        widget created while a page's connection is down never reaches the page whole: widgets/advisor.py)."""
        button = W.Button(layout=W.Layout(width="auto", display="none"), _dom_classes=["wb-offer"])
        button.on_click(lambda _: index < len(self.offers or []) and self._clicked(self.offers[index]))
        return button

    def _clicked(self, changes: dict[str, Any]) -> None:
        handle = self._apply(changes)
        if handle is None:  # refused before it was sent: the changes panel says why
            assign(self.sent, value="<span class='wb-problem'>Not applied: the reason is under Pending changes."
                                    "</span>")
            return
        assign(self.sent, value=f"<span class='wb-muted'>Sent: {html.escape(offer_text(changes))}. {EFFECT}</span>")

    def switched(self) -> None:
        """The page follows a new session: what was sent to the old one goes, and so do the old plan's offers until
        the new session's are read (one clicked meanwhile would be refused)."""
        self.offers = None
        for button in self.buttons.children:
            assign(button.layout, display="none")
        assign(self.note, value="")
        assign(self.sent, value="")
