"""What the plotly charts share: a FigureWidget whose x axis is time in minutes before the newest data point,
min/max-preserving downsampling (tsdownsample), and marks for segment boundaries and applied changes.

Costs measured in DESIGN.md ("Live widgets"): numpy float arrays inside one `batch_update` per tick; whole arrays
re-sent (a page that connects later sees them). The x axis is a plain linear one: epoch-ms numpy arrays on a date
axis, as DESIGN.md proposes, came out wrong in this stack's FigureWidget under Voila (plotly 7.1: the axis showed
1.79e12-style numbers, or year 2000, while the same figure as static HTML was right), so x is sent as minutes
relative to the newest point, still numpy float64, and the axis title names that moment's clock time.
"""

from __future__ import annotations

import copy
import html
import time

import numpy as np
import plotly.graph_objects as go
from tsdownsample import MinMaxLTTBDownsampler, NaNMinMaxLTTBDownsampler

# Points per line a chart of ~1000 px can show; more only costs transfer and drawing.
POINTS_PER_LINE = 1000
# Events worth a mark on a time axis (the rest, e.g. telemetry notes, stay in the events log).
MARKED_EVENTS = ("applied", "restart_pending", "checkpoint", "launched", "started", "crash", "stopped",
                 "paused", "resumed", "refused", "rollback")
_MINMAX = MinMaxLTTBDownsampler()
_NAN_MINMAX = NaNMinMaxLTTBDownsampler()


def downsample(x: np.ndarray, y: np.ndarray, points: int = POINTS_PER_LINE) -> tuple[np.ndarray, np.ndarray]:
    """At most `points` of (x, y), keeping each stretch's minimum and maximum (MinMaxLTTB); x ascending."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    if len(x) <= points:
        return x, y
    sampler = _NAN_MINMAX if np.isnan(y).any() else _MINMAX
    index = sampler.downsample(x, y, n_out=points)
    return x[index], y[index]


def minutes_before(t: np.ndarray, t_end: float) -> np.ndarray:
    """Epoch seconds as minutes before t_end (≤ 0): the charts' x axis."""
    return (np.asarray(t, dtype=np.float64) - t_end) / 60.0


def time_axis_title(t_end: float) -> str:
    return f"minutes before {time.strftime('%H:%M:%S', time.localtime(t_end))} (newest data)"


def time_figure(title: str, y_title: str, height: int = 320) -> go.FigureWidget:
    """A FigureWidget with x in minutes before the newest data and an invisible 0–1 axis for event marks."""
    fig = go.FigureWidget(layout=dict(
        title=dict(text=title, font=dict(size=14)), height=height, margin=dict(l=50, r=20, t=40, b=40),
        xaxis=dict(title=dict(text="minutes", font=dict(size=11))), yaxis=dict(title=y_title, rangemode="tozero"),
        yaxis2=dict(overlaying="y", range=[0, 1], visible=False, fixedrange=True),
        legend=dict(orientation="h", y=-0.15), hovermode="closest", uirevision="keep",
    ))
    fig.add_scatter(x=np.empty(0), y=np.empty(0), yaxis="y2", mode="markers", name="events",
                    marker=dict(symbol="triangle-down", size=10, color="#b26a00"), hoverinfo="text",
                    text=[], showlegend=False)
    sync_page_state(fig)
    return fig


def sync_page_state(fig: go.FigureWidget) -> None:
    """Make traces and layout set after the figure was built part of the state a page draws it from. plotly sends
    them as messages only, and a page that renders the figure later (Voila renders after the cell ran) draws the
    state it was built with: without this it has no trace for any later update to land on."""
    fig._widget_data = copy.deepcopy(fig._data)
    fig._widget_layout = copy.deepcopy(fig._layout)


def event_marks(events, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Marked events inside [t0, t1] as (x in minutes before t1, y on the 0–1 axis, hover text)."""
    if events is None or not len(events):
        return np.empty(0), np.empty(0), []
    inside = events[events["kind"].isin(MARKED_EVENTS) & (events["t"] >= t0) & (events["t"] <= t1)]
    x = minutes_before(inside["t"].to_numpy(dtype=np.float64), t1)
    text = [f"{k}: {html.escape(str(t))}" for k, t in zip(inside["kind"], inside["text"])]
    return x, np.full(len(x), 0.97), text


def segment_lines(segments, t0: float, t1: float) -> tuple[dict, ...]:
    """Vertical lines where segments began inside [t0, t1] (a segment = one plan that ran), x in minutes before t1."""
    if segments is None or not len(segments) or "started_at" not in segments:
        return ()
    starts = segments[(segments["started_at"] >= t0) & (segments["started_at"] <= t1)]
    return tuple(
        dict(type="line", xref="x", yref="paper", x0=(t - t1) / 60.0, x1=(t - t1) / 60.0, y0=0, y1=1,
             line=dict(color="#888", width=1, dash="dot"), label=dict(text=f"segment {int(i)}", textposition="end",
                                                                          font=dict(size=10)))
        for i, t in zip(starts["id"], starts["started_at"])
    )
