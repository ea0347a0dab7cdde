"""Utilization chart: one line per GPU of the selected metric (util, SM active, tensor active, DRAM active,
memory, power) over the whole session (the default) or its last N minutes, with segment boundaries and applied
changes marked.

Samples come aggregated per bucket in SQL (`Session.samples(window_s, every_s)`, via the feed); each GPU's line is
then cut to what the chart can show with min/max-preserving downsampling.
"""

from __future__ import annotations

import time

import ipywidgets as W
import numpy as np

from .charts import TimeAxis, downsample, event_trace, fixed_range, segment_marks, time_layout, waiting
from .common import heading
from .feed import gpu_rows
from .plot import Chart

# metric column -> (label, unit, scale from the stored unit)
METRICS = {
    "util": ("GPU utilization", "%", 1.0),
    "sm_active": ("SM active", "%", 1.0),
    "tensor_active": ("tensor active", "%", 1.0),
    "dram_active": ("DRAM active", "%", 1.0),
    "mem_used": ("memory used", "GB", 1 / 1024.0),  # stored in MiB
    "power_w": ("power", "W", 1.0),
}
WHOLE_SESSION = 0  # the window choice that fits the session
WAITING = "waiting for the first GPU sample"
WINDOWS_MIN = (WHOLE_SESSION, 1, 5, 15, 60)


def window_label(minutes: int) -> str:
    return "whole session" if minutes == WHOLE_SESSION else f"last {minutes} min"


def utilization_figure(samples, events, segments, metric: str, window_min: int, axis: TimeAxis) -> tuple[list, dict]:
    """One line per GPU (per node:GPU on several nodes), marked events and segment starts; the x range is the
    last `window_min` minutes of the session's axis, or all of it."""
    label, unit, scale = METRICS[metric]
    data = []
    if len(samples):
        t1 = float(samples["t"].max())
        multi = "node" in samples and samples["node"].nunique() > 1
        t = samples["t"].to_numpy(dtype=np.float64)
        values = samples[metric].to_numpy(dtype=np.float64) * scale if metric in samples else np.full(len(t), np.nan)
        for key, rows in gpu_rows(samples, by_node=multi):
            name = f"{key[0]}:GPU {key[1]}" if multi else f"GPU {key[0]}"
            x, y = downsample(axis.minutes(t[rows]), values[rows])
            data.append(dict(type="scatter", x=x, y=y, mode="lines", name=name, line=dict(width=1.5)))
        t0 = float(samples["t"].min())
    else:
        t0 = t1 = time.time()
    t0 = min(t0, axis.start)
    data.append(event_trace(events, axis, t0, t1))
    layout = time_layout(f"{label} per GPU ({unit})", unit, axis)
    layout["shapes"], layout["annotations"] = segment_marks(segments, axis, t0, t1)
    if window_min != WHOLE_SESSION:
        now = float(axis.minutes(t1))
        fixed_range(layout, now - window_min, now)
    if not len(samples):
        waiting(layout, axis, WAITING, now=t1)
    return data, layout


class UtilizationPanel:
    def __init__(self, ctx, window_min: int = WHOLE_SESSION):
        self.ctx = ctx
        window_min = window_min if window_min in WINDOWS_MIN else WHOLE_SESSION
        self.metric = W.ToggleButtons(options=[(v[0], k) for k, v in METRICS.items()], value="util",
                                      style={"button_width": "auto"}, _dom_classes=["wb-util-metric"])
        self.window = W.Dropdown(options=[(window_label(m), m) for m in WINDOWS_MIN], value=window_min,
                                 layout=W.Layout(width="150px"), _dom_classes=["wb-util-window"])
        data, layout = utilization_figure([], None, None, "util", window_min, TimeAxis(time.time()))
        self.chart = Chart(layout, data, _dom_classes=["wb-chart", "wb-utilization-chart"])
        self._dirty = True
        self.metric.observe(self._changed, "value")
        self.window.observe(self._changed, "value")
        ctx.feed.window_min = window_min
        self.widget = W.VBox([heading("GPU utilization"), W.HBox([self.metric, self.window]), self.chart],
                             _dom_classes=["wb-utilization"])

    def _changed(self, _change) -> None:
        with self.ctx.lock:
            self.ctx.feed.window_min = self.window.value
            self._dirty = True

    def prepare(self, feed, news):
        with self.ctx.lock:
            dirty, self._dirty = self._dirty, False
            metric, window_min = self.metric.value, self.window.value
        if not dirty and not news & {"samples", "events", "segments", "meta"}:
            return None
        first = float(feed.samples["t"].min()) if len(feed.samples) else None
        return utilization_figure(feed.samples, feed.events, feed.segments, metric, window_min,
                                  TimeAxis.of(feed.meta, feed.kind, first))

    def show(self, payload) -> None:
        self.chart.draw(*payload)
