"""Utilization chart: one line per GPU of the selected metric (util, SM active, tensor active, DRAM active,
memory, power) over the last N minutes (a fixed window), with segment boundaries and applied changes marked.

Samples come aggregated per bucket in SQL (`Session.samples(window_s, every_s)`, via the feed); each GPU's line is
then cut to what the chart can show with min/max-preserving downsampling.
"""

from __future__ import annotations

import time

import ipywidgets as W
import numpy as np

from .charts import (
    downsample, event_marks, minutes_before, segment_lines, sync_page_state, time_axis_title, time_figure,
)
from .common import heading

# metric column -> (label, unit, scale from the stored unit)
METRICS = {
    "util": ("GPU utilization", "%", 1.0),
    "sm_active": ("SM active", "%", 1.0),
    "tensor_active": ("tensor active", "%", 1.0),
    "dram_active": ("DRAM active", "%", 1.0),
    "mem_used": ("memory used", "GB", 1 / 1024.0),  # stored in MiB
    "power_w": ("power", "W", 1.0),
}
WINDOWS_MIN = (1, 5, 15, 60)


class UtilizationPanel:
    def __init__(self, ctx, window_min: int = 10):
        self.ctx = ctx
        window_min = window_min if window_min in WINDOWS_MIN else 15
        self.metric = W.ToggleButtons(options=[(v[0], k) for k, v in METRICS.items()], value="util",
                                      style={"button_width": "auto"}, _dom_classes=["wb-util-metric"])
        self.window = W.Dropdown(options=[(f"last {m} min", m) for m in WINDOWS_MIN], value=window_min,
                                 layout=W.Layout(width="140px"), _dom_classes=["wb-util-window"])
        self.fig = time_figure("GPU utilization", "%")
        self.gpu_traces: dict[str, int] = {}  # "node:gpu" -> index in fig.data
        self._dirty = True
        self._shapes: tuple = ()
        self.metric.observe(self._changed, "value")
        self.window.observe(self._changed, "value")
        ctx.feed.window_s = window_min * 60.0
        self.widget = W.VBox([heading("GPU utilization"), W.HBox([self.metric, self.window]), self.fig],
                             _dom_classes=["wb-utilization"])

    def _changed(self, _change) -> None:
        with self.ctx.lock:
            self.ctx.feed.window_s = self.window.value * 60.0
            self._dirty = True

    def prepare(self, feed, news):
        with self.ctx.lock:
            dirty, self._dirty = self._dirty, False
            metric = self.metric.value
        if not dirty and not news & {"samples", "events", "segments"}:
            return None
        samples = feed.samples
        window_s = feed.window_s
        label, unit, scale = METRICS[metric]
        lines = {}
        if len(samples):
            t1 = float(samples["t"].max())
            multi = "node" in samples and samples["node"].nunique() > 1
            for key, group in samples.groupby(["node", "gpu"] if multi else ["gpu"], sort=True):
                name = f"{key[0]}:GPU {key[1]}" if multi else f"GPU {key[0]}"
                x = minutes_before(group["t"].to_numpy(dtype=np.float64), t1)
                y = group[metric].to_numpy(dtype=np.float64) * scale if metric in group else np.full(len(x), np.nan)
                lines[name] = downsample(x, y)
        else:
            t1 = time.time()
        t0 = t1 - window_s
        marks = event_marks(feed.events, t0, t1)
        shapes = segment_lines(feed.segments, t0, t1)
        return label, unit, lines, marks, shapes, (-window_s / 60.0, 0.0), time_axis_title(t1)

    def show(self, payload) -> None:
        label, unit, lines, (mx, my, mtext), shapes, x_range, x_title = payload
        fig = self.fig
        new = [name for name in lines if name not in self.gpu_traces]
        for name in new:  # a GPU seen for the first time gets its line (rare: at start-up)
            fig.add_scatter(x=np.empty(0), y=np.empty(0), mode="lines", name=name, line=dict(width=1.5))
            self.gpu_traces[name] = len(fig.data) - 1
        with fig.batch_update():
            for name, index in self.gpu_traces.items():
                x, y = lines.get(name, (np.empty(0), np.empty(0)))
                fig.data[index].x = x
                fig.data[index].y = y
            events = fig.data[0]
            events.x, events.y, events.text = mx, my, mtext
            fig.layout.xaxis.range = x_range
            fig.layout.xaxis.title.text = x_title
            fig.layout.title.text = f"{label} per GPU ({unit})"
            fig.layout.yaxis.title.text = unit
            if shapes != self._shapes:
                fig.layout.shapes = shapes
                self._shapes = shapes
        if new:
            sync_page_state(fig)
