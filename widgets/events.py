"""Events log (newest first: starts, applied changes, checkpoints, restarts, crashes, advice, telemetry notes) and a
balance summary of the GPUs over the chart's window (mean utilization and SM activity, peak memory, power)."""

from __future__ import annotations

import time

import ipywidgets as W
import numpy as np
import pandas as pd

from .common import assign, fmt, heading, table
from .feed import gpu_rows

EVENTS_SHOWN = 100
BALANCE_EVERY_S = 5.0  # the balance summarises the whole chart window: at most this often, not every tick
BAD_EVENTS = ("crash", "refused", "error")


def balance_table(samples: pd.DataFrame) -> tuple[list[list], list[str]]:
    """Per GPU over the window: n-weighted means of the per-bucket means, and peaks of the per-bucket maxima."""
    if samples is None or not len(samples):
        return [], []
    weight = samples["n"].to_numpy(dtype=np.float64) if "n" in samples else np.ones(len(samples))
    columns = {c: samples[c].to_numpy(dtype=np.float64) for c in ("util", "sm_active", "tensor_active", "power_w",
                                                                   "mem_used", "mem_used_max", "mem_total")
               if c in samples}
    one_node = samples["node"].nunique() == 1
    rows = []
    for (node, gpu), positions in gpu_rows(samples, by_node=True):
        w = weight[positions]

        def mean(column: str) -> float:
            if column not in columns:
                return float("nan")
            v = columns[column][positions]
            ok = ~np.isnan(v)
            return float(np.average(v[ok], weights=w[ok])) if ok.any() and w[ok].sum() > 0 else float("nan")

        peak = float(pd.Series(columns.get("mem_used_max", columns["mem_used"])[positions]).max()) / 1024.0
        total = float(pd.Series(columns["mem_total"][positions]).max()) / 1024.0 if "mem_total" in columns \
            else float("nan")
        rows.append([gpu if one_node else f"{node}:{gpu}", mean("util"), mean("sm_active"),
                     mean("tensor_active"), f"{fmt(peak)} / {fmt(total)}", mean("power_w")])
    utils = [r[1] for r in rows if not np.isnan(r[1])]
    notes = []
    if len(utils) > 1:
        notes.append(f"utilization spread between the busiest and the idlest GPU: {max(utils) - min(utils):.0f} points")
    if utils:
        notes.append(f"mean utilization across GPUs: {np.mean(utils):.0f} %")
    return rows, notes


def in_words(text: str) -> str:
    """A raw message the page explains instead of quoting (Ray's, from recordings of older workbench versions)."""
    if "ServerUnavailable" in text and "ray[default]" in text:
        return ("Ray's dashboard (pip install ray[default]) is not installed, so Ray's state API can't name the role "
                "of each worker process: roles come from the processes' names instead. Nothing else is missing.")
    return text


def event_rows(events: pd.DataFrame) -> list[list]:
    """The newest EVENTS_SHOWN events, newest first, each message once: a repeat (the same kind and words, e.g. one
    per segment) is folded into its newest row with a count."""
    if not len(events):
        return []
    rows, index = [], {}
    for t, kind, text in zip(events["t"][::-1], events["kind"][::-1], events["text"][::-1]):
        words = in_words(str(text))
        if (kind, words) in index:
            rows[index[kind, words]][3] += 1
            continue
        index[kind, words] = len(rows)
        rows.append([time.strftime("%H:%M:%S", time.localtime(t)), kind, words, 1])
        if len(rows) == EVENTS_SHOWN:
            break
    return [[when, kind, words + (f" (×{count})" if count > 1 else "")] for when, kind, words, count in rows]


class EventsPanel:
    def __init__(self, ctx):
        self.ctx = ctx
        self.log = W.HTML(_dom_classes=["wb-events-log"],
                          layout=W.Layout(max_height="320px", overflow="auto"))
        self.balance = W.HTML(_dom_classes=["wb-balance"])
        self._balanced_at = -BALANCE_EVERY_S
        self.widget = W.VBox([heading("Events (newest first)"), self.log, heading("Balance (chart window)"),
                              self.balance], _dom_classes=["wb-events"])

    def prepare(self, feed, news):
        payload = {}
        if "events" in news or not self.log.value:
            rows = event_rows(feed.events)
            classes = ["wb-bad" if r[1] in BAD_EVENTS else "" for r in rows]
            payload["log"] = table(["time", "kind", "what"], rows, row_classes=classes, css="wb-table wb-events") \
                if rows else "<span class='wb-muted'>No events yet.</span>"
        if "samples" in news and time.monotonic() - self._balanced_at >= BALANCE_EVERY_S:
            self._balanced_at = time.monotonic()
            rows, notes = balance_table(feed.samples)
            payload["balance"] = (table(["GPU", "util %", "SM active %", "tensor active %", "peak memory GB",
                                         "power W"], rows) + "".join(f"<div>{n}</div>" for n in notes)) \
                if rows else "<span class='wb-muted'>No GPU samples in the window.</span>"
        return payload or None

    def show(self, payload) -> None:
        if "log" in payload:
            assign(self.log, value=payload["log"])
        if "balance" in payload:
            assign(self.balance, value=payload["balance"])
