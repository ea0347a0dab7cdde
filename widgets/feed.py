"""What the dashboard knows about its session, read incrementally through `Session.poll`.

One `Feed.read()` per tick (in a worker thread): one cheap poll, then only the tables it names as changed, and of
those only the rows after the ones already held. Samples come aggregated in SQL for the chart's fixed window.
Slow derived reads (segments with their statistics, placement, advice) are rate-limited: the numbers they show
move at step pace, not at 2 Hz.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd

# Names `Session.poll` reports news for.
TABLES = ("steps", "samples", "procs", "events", "segments", "commands", "meta")
# Buckets per GPU the SQL aggregation returns for the window; the charts downsample further (min/max-preserving).
SAMPLE_BUCKETS = 2000
# Seconds between re-reads of derived data that only moves at step pace (a full refresh ignores these).
MIN_INTERVAL_S = {"segments": 3.0, "placement": 2.0, "findings": 10.0, "step_samples": 5.0}
# Steps the step breakdown shows; their GPU-busy share needs the samples of their time span.
STEPS_SHOWN = 60
EVENTS_KEPT = 500


def _append(held: pd.DataFrame, new: pd.DataFrame, keep: int | None = None) -> pd.DataFrame:
    if held is None or held.empty:
        out = new
    elif new.empty:
        out = held
    else:
        out = pd.concat([held, new], ignore_index=True)
    if keep is not None and len(out) > keep:
        out = out.iloc[-keep:].reset_index(drop=True)
    return out


def _last_id(frame: pd.DataFrame | None) -> int:
    return int(frame["id"].iloc[-1]) if frame is not None and len(frame) else 0


class Feed:
    def __init__(self, session, window_s: float = 600.0):
        self.session = session
        self.window_s = float(window_s)
        self.cursor = None
        self.state: str | None = None
        self.last_step: int | None = None
        self.meta: dict[str, Any] = {}
        self.steps = pd.DataFrame()
        self.events = pd.DataFrame()
        self.segments = pd.DataFrame()
        self.samples = pd.DataFrame()
        self.step_samples = pd.DataFrame()
        self.placement: Any = None
        self.knob_table = pd.DataFrame()
        self.findings: list = []
        self._read_at: dict[str, float] = {}
        self._sampled_window_s: float | None = None
        self._stale: set[str] = set()  # derived reads with news not read yet (rate-limited)

    def _due(self, name: str, full: bool) -> bool:
        if full or name not in self._read_at:
            return True
        return time.monotonic() - self._read_at[name] >= MIN_INTERVAL_S[name]

    def read(self, full: bool = False) -> set[str]:
        """Read what changed since the last call; returns the names of what this feed now holds anew."""
        s = self.session
        poll = s.poll(self.cursor)
        changed = set(TABLES) if full or self.cursor is None else set(poll.changed)
        self.cursor = poll.cursor
        news: set[str] = set()
        if poll.state != self.state or poll.last_step != self.last_step:
            news.add("state")
        self.state, self.last_step = poll.state, poll.last_step
        if "meta" in changed or not self.meta:
            self.meta = s.meta
            news.add("meta")
        if "steps" in changed:
            new = s.steps(since_id=_last_id(self.steps))
            if len(new):
                self.steps = _append(self.steps, new)
                news.add("steps")
        if "events" in changed:
            new = s.events(since_id=_last_id(self.events))
            if len(new):
                self.events = _append(self.events, new, keep=EVENTS_KEPT)
                news.add("events")
        if "samples" in changed or self._sampled_window_s != self.window_s:
            window_s = self.window_s
            self.samples = s.samples(window_s=window_s, every_s=max(0.1, window_s / SAMPLE_BUCKETS))
            self._sampled_window_s = window_s
            news.add("samples")
        if "segments" in changed or self.knob_table.empty:
            self.knob_table = s.knob_table()
            news.add("knobs")
        for name, triggers, reader in (
            ("segments", {"segments", "steps"}, s.segments),
            ("placement", {"procs", "segments"}, s.placement),
            ("findings", {"steps", "segments"}, s.advice_findings),
            ("step_samples", {"steps"}, self._step_samples),
        ):
            if changed & triggers:
                self._stale.add(name)
            if name in self._stale and self._due(name, full):
                setattr(self, name, reader())
                self._read_at[name] = time.monotonic()
                self._stale.discard(name)
                news.add(name)
        return news

    def _step_samples(self) -> pd.DataFrame:
        """Samples aggregated over the time span of the steps the step breakdown shows."""
        recent = self.steps.iloc[-STEPS_SHOWN:]
        if recent.empty:
            return pd.DataFrame()
        first_step_s = recent["timing_s/step"].iloc[0] if "timing_s/step" in recent else 0.0
        first = float(recent["t"].iloc[0]) - (0.0 if pd.isna(first_step_s) else float(first_step_s))
        span = max(time.time(), float(recent["t"].iloc[-1])) - first + 5.0
        return self.session.samples(window_s=span, every_s=max(0.5, span / SAMPLE_BUCKETS))
