"""Throughput chart (tokens/s/GPU per step, and MFU where verl reports it) and the segments table: each segment
(one plan that ran) with its tokens/s/GPU, step time, utilization and memory, and its diff from the previous one."""

from __future__ import annotations

import ipywidgets as W
import numpy as np
import pandas as pd

from .charts import (
    downsample, event_marks, minutes_before, segment_lines, sync_page_state, time_axis_title, time_figure,
)
from .common import assign, heading, table

SERIES = (  # step metric -> (legend name, axis, scale)
    ("perf/throughput", "tokens/s/GPU", "y", 1.0),
    ("perf/mfu/actor", "actor MFU %", "y3", 100.0),
    ("perf/mfu/critic", "critic MFU %", "y3", 100.0),
)
SEGMENT_COLUMNS = (  # column -> heading
    ("id", "segment"), ("status", "status"), ("steps", "steps"), ("throughput", "tokens/s/GPU"),
    ("step_time_s", "s/step"), ("util_mean", "util %"), ("sm_active_mean", "SM active %"),
    ("mem_peak_gb", "peak memory GB"), ("diff_text", "change from the previous segment"), ("reason", "why it began/ended"),
)


def segment_rows(segments: pd.DataFrame) -> tuple[list[list], list[str]]:
    rows, classes = [], []
    for rec in segments.to_dict("records"):
        rows.append([rec.get(column) for column, _ in SEGMENT_COLUMNS])
        classes.append("wb-bad" if rec.get("status") == "failed" else "")
    return rows, classes


class ThroughputPanel:
    def __init__(self, ctx):
        self.ctx = ctx
        self.fig = time_figure("Throughput per step", "tokens/s/GPU", height=300)
        self.fig.layout.yaxis3 = dict(title="MFU %", overlaying="y", side="right", rangemode="tozero")
        for _, name, axis, _ in SERIES:
            self.fig.add_scatter(x=np.empty(0), y=np.empty(0), name=name, yaxis=axis, mode="lines+markers",
                                 marker=dict(size=4), line=dict(dash="dot" if axis == "y3" else "solid"))
        sync_page_state(self.fig)
        self.segments = W.HTML(_dom_classes=["wb-segments-table"])
        self.widget = W.VBox([heading("Throughput"), self.fig, heading("Segments"), self.segments],
                             _dom_classes=["wb-throughput"])

    def prepare(self, feed, news):
        payload = {}
        steps = feed.steps
        if news & {"steps", "events", "segments"} and len(steps):
            t1 = float(steps["t"].iloc[-1])
            x = minutes_before(steps["t"].to_numpy(dtype=np.float64), t1)
            lines = []
            for column, _, _, scale in SERIES:
                y = steps[column].to_numpy(dtype=np.float64) * scale if column in steps else np.full(len(x), np.nan)
                lines.append(downsample(x, y))
            t0 = float(steps["t"].iloc[0]) - 60.0
            payload["chart"] = (lines, event_marks(feed.events, t0, t1), segment_lines(feed.segments, t0, t1),
                                time_axis_title(t1))
        if "segments" in news and len(feed.segments):
            rows, classes = segment_rows(feed.segments)
            payload["table"] = table([h for _, h in SEGMENT_COLUMNS], rows, row_classes=classes,
                                     css="wb-table wb-segments")
        return payload or None

    def show(self, payload) -> None:
        if "chart" in payload:
            lines, (mx, my, mtext), shapes, x_title = payload["chart"]
            with self.fig.batch_update():
                for trace, (x, y) in zip(self.fig.data[1:], lines):
                    trace.x, trace.y = x, y
                self.fig.data[0].x, self.fig.data[0].y, self.fig.data[0].text = mx, my, mtext
                self.fig.layout.shapes = shapes
                self.fig.layout.xaxis.title.text = x_title
        if "table" in payload:
            assign(self.segments, value=payload["table"])
