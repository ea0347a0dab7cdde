"""Small helpers every panel shares: formatting, HTML tables, and change-only widget assignment."""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Sequence

import ipywidgets as W
import numpy as np

# Shown where the session can't be controlled from this page (a viewer, or a session that has ended).
READ_ONLY_REASON = "read-only view: control needs the session's operator token (page URL ?token=… or the token field)"


def fmt(value: Any, digits: int = 3) -> str:
    """A number in few characters ("–" when unknown); anything else as text."""
    if value is None:
        return "–"
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "–"
        if value != 0 and (abs(value) >= 10 ** digits or abs(value) < 10 ** -2):
            return f"{value:,.0f}" if abs(value) >= 10 ** digits else f"{value:.2g}"
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value))
    return str(value)


def said_once(prefix: str, text: Any) -> str:
    """"prefix: text", unless the text already begins with the prefix (messages that name their own state or knob:
    never "queued: queued: …")."""
    text = str(text).strip()
    return text if text.lower().startswith(str(prefix).lower()) else f"{prefix}: {text}"


def esc(value: Any) -> str:
    return html.escape(fmt(value) if not isinstance(value, str) else value)


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], css: str = "wb-table",
          row_classes: Sequence[str] | None = None) -> str:
    """An HTML table; cells given as str are escaped, cells given as `Raw` are inserted as they are."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        cells = "".join(f"<td>{c.html if isinstance(c, Raw) else esc(c)}</td>" for c in row)
        body.append(f"<tr{cls}>{cells}</tr>")
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


class Raw:
    """Trusted HTML for a table cell (built here from escaped parts)."""

    def __init__(self, markup: str):
        self.html = markup


def assign(widget: W.Widget, **values: Any) -> None:
    """Set widget traits, sending a message only for those that changed (many viewers, ≤ 2 Hz)."""
    for name, value in values.items():
        if getattr(widget, name) != value:
            setattr(widget, name, value)


def heading(text: str) -> W.HTML:
    return W.HTML(f"<h3 class='wb-heading'>{html.escape(text)}</h3>")


# One stylesheet for the page; panels use these class names.
CSS = """
<style>
.wb-table {border-collapse: collapse; font-size: 12px;}
.wb-table th, .wb-table td {border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; vertical-align: top;}
.wb-table th {background: #f4f4f4;}
.wb-table tr.wb-warn td {background: #fff4e0;}
.wb-table tr.wb-bad td {background: #fde8e8;}
.wb-heading {margin: 8px 0 4px 0; font-size: 15px;}
.wb-badge {border-radius: 3px; padding: 0 4px; font-size: 11px; color: white;}
.wb-badge-hot {background: #2e7d32;} .wb-badge-restart {background: #b26a00;}
.wb-problem {color: #c62828; font-size: 12px;} .wb-warning {color: #b26a00; font-size: 12px;}
.wb-why {color: #777; font-size: 12px;} .wb-changed {color: #1565c0; font-size: 12px;}
.wb-knob-bad .widget-slider, .wb-knob-bad input {outline: 2px solid #c62828;}
.wb-muted {color: #777;}
.wb-dashboard [disabled], .wb-dashboard button:disabled {opacity: 0.5; cursor: not-allowed;}
.wb-hint {margin: 2px 0 4px 0;} .wb-hint-text {color: #1565c0; font-size: 13px;}
.wb-finding-line {font-size: 13px; margin-left: 6px;} .wb-finding-why {font-size: 12px; color: #555; margin-left: 6px;}
.wb-stat {display: inline-block; margin-right: 18px;} .wb-stat b {font-size: 15px;}
.wb-state {font-weight: bold; padding: 1px 6px; border-radius: 3px; background: #eee;}
.wb-state-running {background: #c8e6c9;} .wb-state-restarting, .wb-state-starting {background: #ffe0b2;}
.wb-state-failed, .wb-state-lost {background: #ffcdd2;} .wb-state-paused {background: #e1f5fe;}
.wb-progress li.wb-done {color: #2e7d32;} .wb-progress li.wb-now {font-weight: bold;} .wb-progress li.wb-todo {color: #999;}
</style>
"""


class Context:
    """What every panel shares: the session (swapped when a token unlocks control), the feed, one lock for state
    that widget callbacks (possibly on another thread) and the update loop both touch, and background commands."""

    def __init__(self, session, feed):
        import threading

        self.session = session
        self.feed = feed
        self.lock = threading.RLock()
        self.notice = ""  # the last control command's outcome, in words; shown by the session bar

    @property
    def operator(self) -> bool:
        return bool(self.session.is_operator)

    def background(self, what: str, action) -> None:
        """Run a blocking control call (pause, stop, …) off the widget thread; its outcome lands in `notice`."""
        import threading

        def run() -> None:
            try:
                result = action()
                text = f"{what}: done" + (f" ({result})" if result not in (None, "") else "")
            except Exception as error:  # shown to the operator, in words
                text = said_once(f"{what} failed", error)
            with self.lock:
                self.notice = text

        with self.lock:
            self.notice = f"{what}: sent…"
        threading.Thread(target=run, name=f"wb-{what}", daemon=True).start()
