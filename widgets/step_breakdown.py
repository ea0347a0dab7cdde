"""Step breakdown: stacked bars per step of where verl's time went (gen, old_log_prob, ref, values, adv,
update_critic, update_actor, update_weights, and the rest of the step), over the last N steps, with the GPUs' busy
share during each step (mean utilization over the step's time span) on the right axis."""

from __future__ import annotations

import ipywidgets as W
import numpy as np

from .common import heading
from .feed import STEPS_SHOWN
from .plot import Chart

PHASES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")
REST = "rest of step"

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#c7c7c7")


def phase_seconds(steps, shown: int = STEPS_SHOWN) -> tuple[list[str], dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The last `shown` steps: x labels ("segment·step"), seconds per phase (rest = step − phases), step start and end
    times (epoch s)."""
    recent = steps.iloc[-shown:]
    n = len(recent)
    total = recent["timing_s/step"].to_numpy(dtype=np.float64) if "timing_s/step" in recent else np.full(n, np.nan)
    seconds = {}
    for phase in PHASES:
        column = f"timing_s/{phase}"
        seconds[phase] = recent[column].to_numpy(dtype=np.float64) if column in recent else np.full(n, np.nan)
    known = np.nansum(np.vstack(list(seconds.values())), axis=0) if n else np.empty(0)
    seconds[REST] = np.clip(total - known, 0.0, None)
    labels = [f"{int(g)}·{int(s)}" for g, s in zip(recent["segment_id"], recent["step"])]
    ends = recent["t"].to_numpy(dtype=np.float64)
    starts = ends - np.nan_to_num(total, nan=0.0)
    return labels, seconds, starts, ends


def busy_share(samples, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mean GPU utilization (%) over each [start, end] span, across GPUs; NaN where no sample falls inside."""
    out = np.full(len(starts), np.nan)
    if samples is None or not len(samples) or "util" not in samples:
        return out
    ordered = samples.sort_values("t")
    t = ordered["t"].to_numpy(dtype=np.float64)
    util = ordered["util"].to_numpy(dtype=np.float64)
    weight = ordered["n"].to_numpy(dtype=np.float64) if "n" in ordered else np.ones(len(t))
    weight = np.where(np.isnan(util), 0.0, weight)
    cum_u = np.concatenate([[0.0], np.cumsum(np.nan_to_num(util) * weight)])
    cum_w = np.concatenate([[0.0], np.cumsum(weight)])
    lo, hi = np.searchsorted(t, starts, "left"), np.searchsorted(t, ends, "right")
    w = cum_w[hi] - cum_w[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(w > 0, (cum_u[hi] - cum_u[lo]) / w, np.nan)
    return out


def breakdown_figure(labels: list[str], seconds: dict[str, np.ndarray], busy: np.ndarray) -> tuple[list, dict]:
    """Stacked bars of seconds per phase for each step (x: "segment·step"), GPU-busy % on the right axis."""
    layout = dict(
        title=dict(text=f"Where each step's time goes (last {STEPS_SHOWN} steps; x = segment·step)",
                   font=dict(size=14)),
        barmode="stack", height=340, margin=dict(l=50, r=55, t=40, b=45), xaxis=dict(type="category"),
        yaxis=dict(title=dict(text="s")), legend=dict(orientation="h", y=-0.25), uirevision="keep",
        yaxis2=dict(title=dict(text="GPU busy %"), overlaying="y", side="right", range=[0, 105], tickmode="auto",
                    showgrid=False),
    )
    if not labels:
        layout["annotations"] = [dict(text="waiting for the first step", xref="paper", yref="paper", x=0.5, y=0.5,
                                      showarrow=False, font=dict(color="#777"))]
        return [], layout
    data = [dict(type="bar", x=labels, y=seconds[phase], name=phase, marker=dict(color=color))
            for phase, color in zip((*PHASES, REST), COLORS) if not np.isnan(seconds[phase]).all()]
    data.append(dict(type="scatter", x=labels, y=busy, name="GPU busy %", yaxis="y2", mode="lines+markers",
                     line=dict(color="black", width=1.5), marker=dict(size=4)))
    return data, layout


class StepBreakdownPanel:
    def __init__(self, ctx):
        self.ctx = ctx
        data, layout = breakdown_figure([], {}, np.empty(0))
        self.chart = Chart(layout, data, _dom_classes=["wb-chart", "wb-steps-chart"])
        self.widget = W.VBox([heading("Step breakdown"), self.chart], _dom_classes=["wb-steps"])
        self._phases_of, self._phases = None, None  # the steps frame the phases were computed from
        self._busy: np.ndarray | None = None  # the GPU-busy shares drawn last

    def prepare(self, feed, news):
        if not news & {"steps", "step_samples"} or not len(feed.steps):
            return None
        if feed.steps is not self._phases_of:  # the feed replaces its steps frame when steps arrive
            self._phases_of, self._phases = feed.steps, phase_seconds(feed.steps)
        labels, seconds, starts, ends = self._phases
        busy = busy_share(feed.step_samples, starts, ends)
        # Samples after the last step shown move nothing on this chart: most ticks have nothing to send.
        if "steps" not in news and self._busy is not None and np.array_equal(busy, self._busy, equal_nan=True):
            return None
        self._busy = busy
        return breakdown_figure(labels, seconds, busy)

    def show(self, payload) -> None:
        self.chart.draw(*payload)
