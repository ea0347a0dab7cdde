"""The dashboard's charts: a small anywidget whose synced state IS the figure, drawn by the plotly.js that the
plotly Python package ships, loaded once per page.

Why not plotly's FigureWidget (measured in headless Chromium under Voila 0.5.13, issue 15): its updates are
messages, not state, so a view that renders after them (Voila renders once the kernel has run the page; a reload;
a viewer) draws the figure as it was built; and each FigureWidget carries plotly.js (4.9 MB) as its own anywidget
module, which anywidget must load and initialize within 2 s or it fails the model ("[anywidget] Failed to
initialize model"). Throughput and step breakdown came up empty on most loads.

Here a `Chart`'s `figure` trait holds its traces and layout, numpy arrays sent as binary float64 (no JSON for the
numbers, NaN kept as a gap); a page gets the newest figure with the widget state whenever it renders. One hidden
`PlotlyJS` model per kernel carries plotly.min.js gzipped (~1.5 MB, once per page) and starts loading it in the
browser without holding up anywidget's initialization; every chart waits for it.

While a view shows a chart, it says so every few seconds (`last_view_at`, with the revision it drew): the
dashboard's update loop pauses when no page shows it, and a view that missed an update (a dropped connection) is
sent the state again.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import time
from pathlib import Path
from typing import Any

import anywidget
import numpy as np
import traitlets

ESM = (Path(__file__).with_name("static") / "chart.js").read_text()
# A view that reports an older revision than this long after the newest was sent missed it: send the state again.
RESYNC_AFTER_S = 2.0


@functools.lru_cache(maxsize=1)
def plotly_js_gzip() -> bytes:
    """plotly.min.js from the installed plotly package (no network), gzipped once per process: at level 1 (0.13 s,
    1.71 MB; level 6 took 0.27-0.53 s of every page's build for 1.47 MB, on a local socket)."""
    spec = importlib.util.find_spec("plotly")  # its location only: importing plotly costs seconds
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the charts need the plotly package (pip install plotly)")
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"
    return gzip.compress(path.read_bytes(), compresslevel=1, mtime=0)


def to_wire(value: Any) -> Any:
    """A figure as widget state: float arrays as {"wb_f8": bytes} (binary buffers), other arrays as lists."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "fiub":
            return {"wb_f8": np.ascontiguousarray(value, dtype="<f8").tobytes()}
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): to_wire(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_wire(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


class PlotlyJS(anywidget.AnyWidget):
    """Loads plotly.js into the page (once); shows nothing. Put it anywhere in the page's widget tree."""

    _esm = ESM
    source = traitlets.Bytes().tag(sync=True)


@functools.lru_cache(maxsize=1)
def plotly_js() -> PlotlyJS:
    """This kernel's one plotly.js model (every chart of every dashboard in it waits for it)."""
    return PlotlyJS(source=plotly_js_gzip(), layout={"display": "none"})


class Chart(anywidget.AnyWidget):
    """A plotly.js chart drawn from its `figure` ({"data": [traces], "layout": {...}}, plotly.js's own schema)."""

    _esm = ESM
    figure = traitlets.Dict().tag(sync=True, to_json=lambda value, _widget: to_wire(value))
    revision = traitlets.Int(0).tag(sync=True)

    def __init__(self, layout: dict[str, Any], data: list[dict[str, Any]] | None = None, **kwargs: Any):
        super().__init__(figure={"data": data or [], "layout": layout}, **kwargs)
        self.last_view_at: float | None = None  # time.monotonic() of the last heartbeat from a view
        self._sent_at = time.monotonic()
        self.on_msg(self._from_view)

    def draw(self, data: list[dict[str, Any]], layout: dict[str, Any] | None = None) -> None:
        """Replace the traces (and the layout, when given): one message to every view, and the state a later
        view renders from."""
        figure = {"data": data, "layout": self.figure.get("layout", {}) if layout is None else layout}
        with self.hold_sync():
            self.figure = figure
            self.revision += 1
        self._sent_at = time.monotonic()

    @property
    def traces(self) -> list[dict[str, Any]]:
        return self.figure.get("data", [])

    @property
    def figure_layout(self) -> dict[str, Any]:
        return self.figure.get("layout", {})

    def trace(self, name: str) -> dict[str, Any]:
        """The trace called `name` (KeyError if none)."""
        for trace in self.traces:
            if trace.get("name") == name:
                return trace
        raise KeyError(f"no trace {name!r} in this chart")

    def _from_view(self, _widget, content: dict[str, Any], _buffers) -> None:
        if not isinstance(content, dict) or content.get("kind") != "view":
            return
        now = time.monotonic()
        self.last_view_at = now
        drawn = content.get("revision", -1)  # -1: plotly.js still loading; it draws the newest state once there
        if isinstance(drawn, int) and 0 <= drawn != self.revision and now - self._sent_at > RESYNC_AFTER_S:
            self.send_state(["figure", "revision"])
            self._sent_at = now
