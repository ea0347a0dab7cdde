"""What the dashboard knows about its session, read incrementally through `Session.poll`.

One `Feed.read()` per tick (in a worker thread): one cheap poll, then only the tables it names as changed, and of
those only the rows after the ones already held. GPU samples come aggregated in SQL per bucket
(`Session.samples(window_s, every_s)`), of the metrics the panels show; a `Buckets` window re-reads only its newest
bucket on each tick (`since_t`). Derived reads that move at step pace (segments with their statistics, placement) are
rate-limited, and advice (which reads every sample of a segment) is computed in a thread of its own, on a store
connection of its own, so that no tick waits for it.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import numpy as np
import pandas as pd

from workbench.session import Session

# Names `Session.poll` reports news for.
TABLES = ("steps", "samples", "procs", "events", "segments", "commands", "meta")
# Buckets per GPU the SQL aggregation returns for a window; the charts downsample further (min/max-preserving).
SAMPLE_BUCKETS = 2000
# The sample columns the panels show: the utilization chart's metrics, memory in the device planner, the balance
# table. The window aggregates only these (each costs SQL time per row), the step breakdown's only utilization.
WINDOW_METRICS = ("util", "sm_active", "tensor_active", "dram_active", "mem_used", "power_w", "mem_total")
STEP_METRICS = ("util",)
# Seconds between re-reads of derived data that only moves at step pace.
MIN_INTERVAL_S = {"knobs": 0.0, "segments": 3.0, "placement": 3.0, "offers": 0.0, "findings": 30.0}
# Derived reads: news name -> (the feed's attribute, the poll tables whose news make it stale, the Session method).
# The knob table and a replay's offers compose plans with Hydra (~1 s a plan on a quiet 2-core machine): never on
# the page's first read, which the page's first render waits for.
DERIVED = {
    "knobs": ("knob_table", {"segments"}, "knob_table"),
    "segments": ("segments", {"segments", "steps"}, "segments"),
    "placement": ("placement", {"procs", "segments"}, "placement"),
    "offers": ("offers", {"segments"}, "recorded_changes"),
}
EVENTS_KEPT = 500
# Steps the step breakdown shows; their GPU-busy share needs the samples of their time span.
STEPS_SHOWN = 60


def _append(held: pd.DataFrame, new: pd.DataFrame, keep: int | None = None) -> pd.DataFrame:
    out = new if held.empty else held if new.empty else pd.concat([held, new], ignore_index=True)
    if keep is not None and len(out) > keep:
        out = out.iloc[-keep:].reset_index(drop=True)
    return out


def _last_id(frame: pd.DataFrame) -> int:
    return int(frame["id"].iloc[-1]) if len(frame) else 0


class Buckets:
    """A sliding window of samples aggregated in SQL per `every_s` bucket, of `metrics` only. Each tick re-reads only
    the buckets from the newest one held on (it may have been still filling; the store's index on t finds its rows),
    so every bucket held is what a fresh read of the whole window gives. The window holds whole buckets: those that
    start at most `window_s` before the newest one. The frame stays ordered by t: positions come from a binary
    search, never from a boolean mask over the whole window."""

    def __init__(self, every_s: float, metrics: tuple[str, ...]):
        self.every_s = float(every_s)
        self.metrics = metrics
        self.frame = pd.DataFrame()
        self.window_s = 0.0  # the window of the last read

    def read(self, session, window_s: float) -> pd.DataFrame:
        every, held = self.every_s, self.frame
        # A sample near a bucket's start may fall on either side of it (t / every_s in floating point): each read
        # takes a bucket more than it keeps, and buckets are told apart by their start, never by a sample's t.
        if held.empty or window_s > self.window_s:  # first read, or the window grew
            # Every row of a bucket kept lies less than window_s + every_s before the newest sample (a bucket more
            # for the rounding).
            frame = session.samples(window_s=window_s + 2 * every, every_s=every, metrics=self.metrics)
        else:
            held_t = held["t"].to_numpy()
            newest = float(held_t[-1])
            tail = session.samples(since_t=newest - every, every_s=every, metrics=self.metrics)
            tail = tail.iloc[int(np.searchsorted(tail["t"].to_numpy(), newest, "left")):]
            frame = _append(held.iloc[:int(np.searchsorted(held_t, newest, "left"))], tail)
        if len(frame):
            t = frame["t"].to_numpy()
            frame = frame.iloc[int(np.searchsorted(t, t[-1] - window_s, "left")):].reset_index(drop=True)
        self.frame, self.window_s = frame, window_s
        return frame


def gpu_rows(samples: pd.DataFrame, by_node: bool) -> list[tuple[tuple, np.ndarray]]:
    """Each GPU's rows of an aggregated samples frame: [((gpu,) or (node, gpu), row positions)], keys in order,
    rows in the frame's order (by_node: per node:GPU; rows without a node left out, as pandas' groupby does). Row
    positions, not groupby: a groupby's groups copied every column of the window (~10k rows) once per GPU."""
    if samples is None or not len(samples):
        return []
    gpu = samples["gpu"].to_numpy()
    if not by_node:
        return [((int(g),), np.flatnonzero(gpu == g)) for g in np.unique(gpu)]
    node_code, nodes = pd.factorize(samples["node"], sort=True)  # codes in the nodes' order; -1: no node
    per_node = int(gpu.max()) + 1
    key = node_code.astype(np.int64) * per_node + gpu  # ordered as (node, gpu)
    return [((nodes[k // per_node], int(k % per_node)), np.flatnonzero(key == k))
            for k in np.unique(key[node_code >= 0])]


def bucket_seconds(window_s: float, floor: float = 0.1) -> float:
    """A bucket size giving at most SAMPLE_BUCKETS per GPU over the window, as a power of two times `floor`
    (so a window keeps its buckets, and its cache, while it slides)."""
    return floor * 2 ** max(0, math.ceil(math.log2(max(window_s / SAMPLE_BUCKETS / floor, 1e-9))))


def sample_window_s(meta: dict[str, Any], kind: Any, window_min: float | None, now: float | None = None) -> float:
    """Wall seconds of samples the charts show: the last `window_min` minutes of the session's time (recorded
    minutes in a replay, which plays them `speed` times faster), or with None / 0 the whole session so far, rounded
    up to a power of two minutes (so that the window, and its cached buckets, changes rarely)."""
    speed = kind.time_scale if kind is not None else 1.0  # kind: the session's SessionKind
    if window_min:
        return float(window_min) * 60.0 / speed
    created = meta.get("created")
    now = time.time() if now is None else now
    elapsed = now - float(created) if isinstance(created, (int, float)) else 600.0
    return 60.0 * 2 ** math.ceil(math.log2(max(elapsed, 60.0) / 60.0))


class Feed:
    def __init__(self, session, window_min: float | None = None):
        self.session = session
        self.window_min = window_min  # None / 0: the whole session (see sample_window_s)
        self.window_s = 600.0  # the wall seconds of the last samples read
        self.cursor = None
        self.state: str | None = None
        self.last_step: int | None = None
        self.meta: dict[str, Any] = {}
        self.kind = None  # the session's SessionKind (live, or a replay and how), read with the meta
        self.steps = pd.DataFrame()
        self.events = pd.DataFrame()
        self.segments = pd.DataFrame()
        self.samples = pd.DataFrame()  # the chart window, aggregated per bucket
        self.step_samples = pd.DataFrame()  # the span of the last STEPS_SHOWN steps, per second
        self.placement: Any = None
        self.knob_table = pd.DataFrame()
        self.offers: list[dict[str, Any]] = []  # on a replay: the changes its recording can play from the plan in force
        self.findings: list = []
        self.findings_note = "advice: waiting for measured steps"
        self._buckets: Buckets | None = None
        self._step_buckets = Buckets(every_s=1.0, metrics=STEP_METRICS)
        self._read_at: dict[str, float] = {}
        self._stale: set[str] = set()  # derived reads with news not read yet (rate-limited)
        self._advice: threading.Thread | None = None
        self._advisor: Session | None = None  # the advice thread's handle (see _advice_session)
        self._advice_result: tuple | None = None
        self._deriving: threading.Thread | None = None
        self._derived_results: dict[str, Any] = {}
        self._derived_lock = threading.Lock()

    def _due(self, name: str) -> bool:
        return time.monotonic() - self._read_at.get(name, -math.inf) >= MIN_INTERVAL_S[name]

    def read(self) -> set[str]:
        """Read what changed since the last call; returns the names of what this feed now holds anew."""
        s = self.session
        poll = s.poll(self.cursor)
        changed = set(TABLES) if self.cursor is None else set(poll.changed)
        self.cursor = poll.cursor
        news: set[str] = set()
        if poll.state != self.state or poll.last_step != self.last_step:
            news.add("state")
        self.state, self.last_step = poll.state, poll.last_step
        if "meta" in changed:
            self.meta, self.kind = s.meta, s.kind
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
        self.window_s = sample_window_s(self.meta, self.kind, self.window_min)
        every = bucket_seconds(self.window_s)
        if self._buckets is None or self._buckets.every_s != every:
            self._buckets = Buckets(every, WINDOW_METRICS)
            changed.add("samples")
        if "samples" in changed or self._buckets.window_s != self.window_s:
            self.samples = self._buckets.read(s, self.window_s)
            news.add("samples")
        if ("samples" in changed or "steps" in news) and len(self.steps):
            self.step_samples = self._step_buckets.read(s, self._steps_span())
            news.add("step_samples")
        news |= self._derive(changed)
        news |= self._advise(changed)
        return news

    def _derive(self, changed: set[str]) -> set[str]:
        """The derived reads (knob table, segments with their figures, placement) run in a thread of their own, one
        after the other, when their tables have news and their interval has passed: the knob table's first read
        imports verl for its defaults (seconds), and the charts must not wait for it. Their results land here."""
        news = set()
        with self._derived_lock:
            results, self._derived_results = self._derived_results, {}
        for name, value in results.items():
            setattr(self, DERIVED[name][0], value)
            news.add(name)
        for name, (_, triggers, _reader) in DERIVED.items():
            if changed & triggers:
                self._stale.add(name)
        due = [name for name in DERIVED if name in self._stale and self._due(name)]
        if due and not (self._deriving is not None and self._deriving.is_alive()):
            session = self.session
            for name in due:
                self._stale.discard(name)
                self._read_at[name] = time.monotonic()

            def run() -> None:
                for name in due:
                    try:
                        value = getattr(session, DERIVED[name][2])()
                    except Exception:  # e.g. the store went away: keep what is held; the next news retries
                        with self._derived_lock:
                            self._stale.add(name)
                        continue
                    with self._derived_lock:
                        self._derived_results[name] = value

            self._deriving = threading.Thread(target=run, name="wb-derived", daemon=True)
            self._deriving.start()
        return news

    def deriving(self) -> bool:
        """Whether derived reads are under way, or have results the next read picks up."""
        with self._derived_lock:
            landed = bool(self._derived_results)
        return landed or (self._deriving is not None and self._deriving.is_alive())

    def wait_for_derived(self, timeout: float = 120.0) -> None:
        """Block until the derived reads under way have finished (a full refresh); the next read picks them up."""
        if self._deriving is not None:
            self._deriving.join(timeout)

    def _steps_span(self) -> float:
        """Seconds from the start of the first step the breakdown shows to the newest sample (+ a margin), rounded
        up to a power of two: a window that grew every tick made its buckets re-read whole every tick."""
        recent = self.steps.iloc[-STEPS_SHOWN:]
        first_step_s = recent["timing_s/step"].iloc[0] if "timing_s/step" in recent else 0.0
        first = float(recent["t"].iloc[0]) - (0.0 if pd.isna(first_step_s) else float(first_step_s))
        span = max(time.time(), float(recent["t"].iloc[-1])) - first + 5.0
        return 2.0 ** math.ceil(math.log2(max(span, 1.0)))

    def _advise(self, changed: set[str]) -> set[str]:
        """Advice runs in its own thread (it reads every sample of the segment it judges); its result lands here."""
        news = set()
        if self._advice_result is not None:
            self.findings, self.findings_note = self._advice_result
            self._advice_result = None
            news.add("findings")
        if changed & {"steps", "segments"}:
            self._stale.add("findings")
        busy = self._advice is not None and self._advice.is_alive()
        if "findings" in self._stale and not busy and self._due("findings"):
            self._stale.discard("findings")
            self._read_at["findings"] = time.monotonic()
            session = self._advice_session()

            def run() -> None:
                try:
                    findings = session.advice_findings()
                    note = f"advice as of {time.strftime('%H:%M:%S')} (re-judged at most every " \
                           f"{MIN_INTERVAL_S['findings']:.0f} s)"
                    self._advice_result = (findings, note)
                except Exception as error:  # shown in the advisor panel
                    self._advice_result = ([], f"advice failed: {error!r}")

            self._advice = threading.Thread(target=run, name="wb-advice", daemon=True)
            self._advice.start()
        return news

    def _advice_session(self) -> Session:
        """A read-only handle of the session with a store connection of its own, for the advice thread: a connection
        runs one query at a time, and advice reads every sample of the session (seconds on a long one), which the
        tick's reads on the feed's handle waited for (a tick of 2-6 s every 30 s on the 8 GPU x 1 h store)."""
        if self._advisor is None or self._advisor.dir != self.session.dir:
            self._advisor = Session.attach(self.session.dir, read_only=True)
        return self._advisor

    def wait_for_advice(self, timeout: float = 60.0) -> None:
        """Block until a running advice computation has finished (tests, scripts); the next read picks it up."""
        if self._advice is not None:
            self._advice.join(timeout)
