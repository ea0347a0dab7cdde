"""Export: the plan of any segment (or the one in force) as verl Hydra overrides, a command line or YAML
(`Session.export`), with copy and download buttons (plain browser features: clipboard and a data: link)."""

from __future__ import annotations

import html
import json
import urllib.parse

import ipywidgets as W

from .common import assign, heading

FORMATS = (("overrides", "overrides"), ("command", "command"), ("YAML", "yaml"))
EXTENSIONS = {"overrides": "txt", "command": "sh", "yaml": "yaml"}
IN_FORCE = 0  # the segment dropdown's value for "the plan in force"


def buttons_markup(text: str, filename: str) -> str:
    data = html.escape(json.dumps(text), quote=True)
    href = "data:text/plain;charset=utf-8," + urllib.parse.quote(text)
    return (f"<button class='wb-copy' data-text=\"{data}\" "
            "onclick=\"navigator.clipboard.writeText(JSON.parse(this.dataset.text));"
            "this.textContent='Copied'\">Copy</button> "
            f"<a class='wb-download' download='{html.escape(filename)}' href='{html.escape(href, quote=True)}'>"
            f"Download {html.escape(filename)}</a>")


class ExportPanel:
    def __init__(self, ctx):
        self.ctx = ctx
        self.segment = W.Dropdown(options=[("plan in force", IN_FORCE)], value=IN_FORCE,
                                  layout=W.Layout(width="260px"), _dom_classes=["wb-export-segment"])
        self.format = W.ToggleButtons(options=FORMATS, value="overrides", style={"button_width": "auto"},
                                      _dom_classes=["wb-export-format"])
        self.text = W.Textarea(layout=W.Layout(width="100%", height="220px"), _dom_classes=["wb-export-text"])
        self.buttons = W.HTML(_dom_classes=["wb-export-buttons"])
        self._dirty = True
        self._options: list = []
        self._options_of = None  # the segments frame the options were built from
        self.segment.observe(self._changed, "value")
        self.format.observe(self._changed, "value")
        self.widget = W.VBox([heading("Export"), W.HBox([self.segment, self.format]), self.text, self.buttons],
                             _dom_classes=["wb-export"])

    def _changed(self, _change) -> None:
        with self.ctx.lock:
            self._dirty = True

    def prepare(self, feed, news):
        if not len(feed.segments):  # exporting needs verl's config (seconds to import): after the derived reads
            return None
        with self.ctx.lock:
            dirty, self._dirty = self._dirty, False
            segment, fmt = self.segment.value, self.format.value
        if not dirty and feed.segments is self._options_of:  # the feed replaces its segments frame when it reads them
            return None
        self._options_of = feed.segments
        options = [("plan in force", IN_FORCE)] + [
            (f"segment {int(r['id'])} ({r.get('status', '')})", int(r["id"]))
            for r in feed.segments.to_dict("records")
        ]
        # The plan in force changes only with a new segment: export again only then or on a new choice.
        if not dirty and options == self._options:
            return None
        self._options = options
        try:
            exported = self.ctx.session.export(fmt, segment=segment or None)
            text = "\n".join(exported) if isinstance(exported, list) else str(exported)
        except Exception as error:  # an unreadable plan: said where the text would be
            text = f"# export failed: {error}"
        name = f"{self.ctx.session.id}-{'in-force' if not segment else f'segment{segment}'}.{EXTENSIONS[fmt]}"
        return options, text, buttons_markup(text, name)

    def show(self, payload) -> None:
        options, text, buttons = payload
        if tuple(self.segment.options) != tuple(options):
            self.segment.options = options
        assign(self.text, value=text)
        assign(self.buttons, value=buttons)
