"""What the time charts share: the session's time axis, min/max-preserving downsampling (tsdownsample), and marks
for segment boundaries and applied changes, as plotly.js figure parts for `plot.Chart`.

The x axis is minutes since the session began, so every chart's window fits the session. A replay plays its
recording faster than it ran: its axis is in recorded minutes (wall time × speed) and says so. Arrays stay numpy
float64 (sent as binary; DESIGN.md "Live widgets" measured what lists and timestamps cost).
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from tsdownsample import MinMaxLTTBDownsampler, NaNMinMaxLTTBDownsampler

# Points per line a chart of ~1000 px can show; more only costs transfer and drawing.
POINTS_PER_LINE = 1000
# Events worth a mark on a time axis (the rest, e.g. telemetry notes, stay in the events log).
MARKED_EVENTS = ("applied", "restart_pending", "checkpoint", "launched", "started", "crash", "stopped",
                 "paused", "resumed", "refused", "rollback")
# Segment labels closer than this share of the axis go on the next row down (at most LABEL_ROWS rows).
LABEL_GAP = 0.08
LABEL_ROWS = 3
EVENT_MARK = dict(symbol="triangle-down", size=10, color="#b26a00")
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


@dataclass(frozen=True)
class TimeAxis:
    """Epoch seconds → minutes since the session began, in the recording's time for a replay."""

    start: float  # epoch s the session began
    scale: float = 1.0  # recorded seconds per wall-clock second (a replay's speed)
    replay: bool = False

    @classmethod
    def of(cls, meta: dict[str, Any], kind: Any, first_t: float | None = None) -> "TimeAxis":
        """The axis of a session with this meta and kind (its SessionKind: a replay's time runs `speed` times
        faster)."""
        start = meta.get("created")
        start = float(start) if isinstance(start, (int, float)) else float(first_t if first_t is not None else time.time())
        if kind is not None and kind.is_replay:
            return cls(start, kind.time_scale, replay=True)
        return cls(start)

    def minutes(self, t) -> np.ndarray:
        return (np.asarray(t, dtype=np.float64) - self.start) * self.scale / 60.0

    @property
    def title(self) -> str:
        if self.replay:
            return f"recorded minutes since the start (replayed at ×{self.scale:g})"
        return f"minutes since the session started ({time.strftime('%H:%M', time.localtime(self.start))})"


def time_layout(title: str, y_title: str, axis: TimeAxis, height: int = 320, **extra: Any) -> dict[str, Any]:
    """A time chart's layout: x in the session's minutes (autoranged: the whole session), an invisible 0–1 axis
    (yaxis2) for event marks. Autorange is said every time (`fixed_range` turns it off): given a range once and
    then none, Plotly.react keeps autorange off and draws the empty default [-1, 6] (after Play again, the charts
    stayed there while the new session's steps ran off to the right)."""
    layout = dict(
        title=dict(text=title, font=dict(size=14)), height=height, margin=dict(l=55, r=55, t=40, b=45),
        xaxis=dict(title=dict(text=axis.title, font=dict(size=11)), zeroline=False, autorange=True),
        yaxis=dict(title=dict(text=y_title), rangemode="tozero"),
        yaxis2=dict(overlaying="y", range=[0, 1], visible=False, fixedrange=True),
        legend=dict(orientation="h", y=-0.2), hovermode="closest", uirevision="keep",
    )
    layout.update(extra)
    return layout


def fixed_range(layout: dict[str, Any], start: float, end: float) -> None:
    """The x axis shows [start, end] (autorange off, said: see time_layout)."""
    layout["xaxis"].update(range=[start, end], autorange=False)


def waiting(layout: dict[str, Any], axis: TimeAxis, note: str, now: float | None = None) -> dict[str, Any]:
    """An empty time chart's layout: its x axis from the session's start to now (at least a minute), in place of the
    range plotly makes of nothing or of one event mark (ticks like 0.111443, 0.111444, …), and `note` (what it waits
    for) in the middle."""
    end = float(axis.minutes(time.time() if now is None else now))
    fixed_range(layout, 0.0, max(1.0, end))
    layout.setdefault("annotations", []).append(dict(text=note, xref="paper", yref="paper", x=0.5, y=0.5,
                                                     showarrow=False, font=dict(color="#777")))
    return layout


def event_trace(events, axis: TimeAxis, t0: float, t1: float) -> dict[str, Any]:
    """Marked events inside [t0, t1] as triangles along the chart's top, their words on hover."""
    if events is None or not len(events):
        x, text = np.empty(0), []
    else:
        inside = events[events["kind"].isin(MARKED_EVENTS) & (events["t"] >= t0) & (events["t"] <= t1)]
        x = axis.minutes(inside["t"].to_numpy(dtype=np.float64))
        text = [f"{k}: {html.escape(str(t))}" for k, t in zip(inside["kind"], inside["text"])]
    return dict(type="scatter", x=x, y=np.full(len(x), 0.97), yaxis="y2", mode="markers", name="events",
                marker=EVENT_MARK, hoverinfo="text", text=text, showlegend=False)


def segment_marks(segments, axis: TimeAxis, t0: float, t1: float) -> tuple[list[dict], list[dict]]:
    """Dotted vertical lines where segments (one plan each) began inside [t0, t1], and their labels as annotations
    on rows that keep neighbours from overlapping."""
    if segments is None or not len(segments) or "started_at" not in segments:
        return [], []
    starts = segments[(segments["started_at"] >= t0) & (segments["started_at"] <= t1)]
    xs = axis.minutes(starts["started_at"].to_numpy(dtype=np.float64))
    span = max(float(axis.minutes(t1) - axis.minutes(t0)), 1e-9)
    shapes, labels, last_on_row = [], [], [-np.inf] * LABEL_ROWS
    for segment_id, x in zip(starts["id"], xs):
        shapes.append(dict(type="line", xref="x", yref="paper", x0=x, x1=x, y0=0, y1=1,
                           line=dict(color="#888", width=1, dash="dot")))
        row = next((r for r in range(LABEL_ROWS) if (x - last_on_row[r]) / span >= LABEL_GAP), None)
        if row is None:
            continue  # no room: the line stays, its number is on hover of the segments table
        last_on_row[row] = x
        labels.append(dict(x=x, xref="x", y=1.0 - 0.07 * row, yref="paper", text=f"seg {int(segment_id)}",
                           showarrow=False, xanchor="left", font=dict(size=10, color="#555"),
                           bgcolor="rgba(255,255,255,0.7)"))
    return shapes, labels
