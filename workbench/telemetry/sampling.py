"""The sampler: reads GPUs at a fixed rate in a thread and writes batches to the session store.

Rows are buffered and written once per flush (one transaction for samples, one for processes), so 10 Hz × 8 GPUs
costs a couple of small transactions a second. Process → role attribution runs at ~1 Hz: roles change at worker
start-up, not within a second. The sampler measures its own cost (thread CPU time, loop time, achieved rate).

The supervisor runs it as a process of its own (telemetry/sampler.py), so its CPU cost shows on its own.
"""

from __future__ import annotations

import collections
import json
import socket
import sys
import threading
import time
from typing import Any, Callable, Mapping

from ..store import Store
from .nvml import GpuReader
from .roles import RoleAttributor, WorkersTable

EVENT_KIND = "telemetry"
# The achieved rate is measured over this many recent samples, so a pause long ago doesn't distort it.
_RATE_WINDOW = 100


class Sampler:
    """Samples `reader` at `hz` into `store` (a Store, or any sink with add_samples / add_procs / add_event).

    known_roles: pid → role of registered workers; by default the store's `workers` rows for this node.
    procs_every_s: how often to attribute GPU processes to roles (None: never).
    """

    def __init__(
        self,
        store,
        reader: GpuReader,
        hz: float = 10.0,
        node: str | None = None,
        flush_every_s: float = 1.0,
        procs_every_s: float | None = 1.0,
        known_roles: Callable[[], Mapping[int, str]] | None = None,
    ):
        if hz <= 0:
            raise ValueError(f"hz must be positive, got {hz}")
        self.store = store
        self.reader = reader
        self.hz = hz
        self.node = node or socket.gethostname()
        self.flush_every_s = flush_every_s
        self.procs_every_s = procs_every_s
        self._roles = RoleAttributor(known_roles or WorkersTable(store, self.node))
        self._samples: list[dict[str, Any]] = []
        self._procs: list[dict[str, Any]] = []
        self._events: list[tuple[str, dict[str, Any]]] = []
        self._reported: set[Any] = set()  # reasons and errors already recorded as events
        self._stop = threading.Event()
        self._running = threading.Event()  # cleared while paused
        self._running.set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._taken = 0
        self._flushes = 0
        self._loop_seconds = 0.0
        self._cpu_seconds = 0.0
        self._ticks: collections.deque[float] = collections.deque(maxlen=_RATE_WINDOW)

    # ------------------------------------------------------------------ control
    def start(self) -> "Sampler":
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._thread = threading.Thread(target=self._run, name=f"gpu-sampler-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sampling and write what is buffered."""
        self._stop.set()
        self._running.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    # ------------------------------------------------------------------ cost
    def cpu_seconds(self) -> float:
        """CPU time the sampling thread has used (reading, attributing, writing)."""
        return self._cpu_seconds

    def stats(self) -> dict[str, Any]:
        with self._lock:
            ticks = list(self._ticks)
            taken, flushes, loop_seconds = self._taken, self._flushes, self._loop_seconds
        span = ticks[-1] - ticks[0] if len(ticks) > 1 else 0.0
        return {
            "hz": self.hz,
            "samples": taken,
            "flushes": flushes,
            "mean_loop_s": loop_seconds / taken if taken else float("nan"),
            "achieved_hz": (len(ticks) - 1) / span if span > 0 else float("nan"),
            "cpu_seconds": self._cpu_seconds,
        }

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        cpu_start = time.thread_time()
        period = 1.0 / self.hz
        next_tick = next_flush = next_procs = time.monotonic()
        while not self._stop.is_set():
            if not self._running.is_set():
                self._flush()
                self._running.wait()
                next_tick = time.monotonic()
                continue
            started = time.monotonic()
            procs_due = bool(self.procs_every_s) and started >= next_procs
            self._sample_once(procs_due)
            if procs_due:
                next_procs = started + self.procs_every_s
            if started >= next_flush:
                self._flush()
                next_flush = started + self.flush_every_s
            with self._lock:
                self._loop_seconds += time.monotonic() - started
                self._ticks.append(started)
            self._cpu_seconds = time.thread_time() - cpu_start
            next_tick += period
            if next_tick < time.monotonic():  # fell behind (slow read, loaded machine): skip, don't burst
                next_tick = time.monotonic() + period
            self._stop.wait(max(0.0, next_tick - time.monotonic()))
        self._flush()
        self._cpu_seconds = time.thread_time() - cpu_start

    def _sample_once(self, with_procs: bool) -> None:
        try:
            rows = self.reader.read()
            for row in rows:
                row["node"] = self.node
            self._samples.extend(rows)
            if with_procs:
                now = time.time()
                self._procs.extend(
                    {**p, "t": now, "node": self.node, "role": self._roles.role_of(p["pid"])}
                    for p in self.reader.processes()
                )
        except Exception as e:  # a GPU fell off the bus, a process vanished mid-read: say so once, keep sampling
            self._report(("error", type(e).__name__, str(e)), f"{self.node}: GPU sampling failed: {e!r}", {"node": self.node})
        with self._lock:
            self._taken += 1

    def _report(self, key: Any, text: str, data: dict[str, Any]) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self._events.append((text, data))

    def _flush(self) -> None:
        for (gpu, metric), reason in self.reader.nan_reasons().items():
            self._report((gpu, metric), reason, {"node": self.node, "gpu": gpu, "metric": metric})
        samples, self._samples = self._samples, []
        procs, self._procs = self._procs, []
        events, self._events = self._events, []
        try:
            self.store.add_samples(samples)
            if procs:
                self.store.add_procs(procs)
            for text, data in events:
                self.store.add_event(EVENT_KIND, text, data)
        except Exception as e:  # the store already waits 30 s on locks, so this is no blip: say so and go on sampling
            print(f"telemetry: {len(samples)} samples lost, the store refused them: {e!r}", file=sys.stderr)
            return
        with self._lock:
            self._flushes += 1


EXIT_NO_NVML = 3  # a sampler process exits with this when NVML is not there
