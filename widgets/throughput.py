"""Throughput chart (tokens/s/GPU per step, and MFU where verl reports it) and the segments table: each segment
(one plan that ran) with its tokens/s/GPU, step time, utilization and memory, and its diff from the previous one."""

from __future__ import annotations

import time

import ipywidgets as W
import numpy as np
import pandas as pd

from .charts import TimeAxis, downsample, event_trace, segment_marks, time_layout, waiting
from .common import assign, heading, table
from .plot import Chart

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
WAITING = "waiting for the first step (verl's start-up comes first)"


def throughput_figure(steps: pd.DataFrame, events, segments, axis: TimeAxis) -> tuple[list[dict], dict]:
    """Traces and layout: tokens/s/GPU and MFU per step, segment starts and marked events, on the session's axis."""
    layout = time_layout("Throughput per step", "tokens/s/GPU", axis, height=300,
                         yaxis3=dict(title=dict(text="MFU %"), overlaying="y", side="right", rangemode="tozero",
                                     tickmode="auto", showgrid=False))  # its own round ticks, not the left's
    if not len(steps):
        return [], waiting(layout, axis, WAITING)
    t = steps["t"].to_numpy(dtype=np.float64)
    x = axis.minutes(t)
    data = []
    for column, name, yaxis, scale in SERIES:
        if column not in steps or steps[column].isna().all():
            continue  # verl did not report it (e.g. no critic): no empty legend entry
        sx, sy = downsample(x, steps[column].to_numpy(dtype=np.float64) * scale)
        data.append(dict(type="scatter", x=sx, y=sy, name=name, yaxis=yaxis, mode="lines+markers",
                         marker=dict(size=5), line=dict(dash="dot" if yaxis == "y3" else "solid")))
    t0 = min(float(t[0]) - 60.0, axis.start)
    t1 = float(t[-1])
    data.append(event_trace(events, axis, t0, t1))
    layout["shapes"], layout["annotations"] = segment_marks(segments, axis, t0, t1)
    return data, layout


def segment_rows(segments: pd.DataFrame) -> tuple[list[list], list[str]]:
    rows, classes = [], []
    for rec in segments.to_dict("records"):
        rows.append([rec.get(column) for column, _ in SEGMENT_COLUMNS])
        classes.append("wb-bad" if rec.get("status") == "failed" else "")
    return rows, classes


class ThroughputPanel:
    def __init__(self, ctx):
        self.ctx = ctx
        data, layout = throughput_figure(pd.DataFrame(), None, None, TimeAxis(time.time()))
        self.chart = Chart(layout, data, _dom_classes=["wb-chart", "wb-throughput-chart"])
        self.segments = W.HTML(_dom_classes=["wb-segments-table"])
        self.widget = W.VBox([heading("Throughput"), self.chart, heading("Segments"), self.segments],
                             _dom_classes=["wb-throughput"])

    def prepare(self, feed, news):
        payload = {}
        if news & {"steps", "events", "segments", "meta"}:
            first = float(feed.steps["t"].iloc[0]) if len(feed.steps) else None
            payload["chart"] = throughput_figure(feed.steps, feed.events, feed.segments, TimeAxis.of(feed.meta, feed.kind, first))
        if "segments" in news and len(feed.segments):
            rows, classes = segment_rows(feed.segments)
            payload["table"] = table([h for _, h in SEGMENT_COLUMNS], rows, row_classes=classes,
                                     css="wb-table wb-segments")
        return payload or None

    def show(self, payload) -> None:
        if "chart" in payload:
            self.chart.draw(*payload["chart"])
        if "table" in payload:
            assign(self.segments, value=payload["table"])
