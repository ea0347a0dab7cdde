"""Device planner: a GPUs × roles grid, planned (from the plan in force) beside actual (process attribution),
with memory per GPU and per process and a warning where they differ. The placement knobs' editors (which GPUs,
how many for the critic / reward / rollout pools) come from the knob table through the changes panel, so a new
placement is previewed and applied like any other change.
"""

from __future__ import annotations

import html
from typing import Any, Iterable

import ipywidgets as W
import pandas as pd

from .common import Raw, assign, fmt, heading, table

ROLES = ("actor+rollout+ref", "critic", "reward", "rollout")
MIB_PER_GB = 1024.0


def _roles(value: Any) -> set[str]:
    """Roles from a placement cell: a list, or a '+'/','-joined string whose parts may combine ("actor+rollout+ref")."""
    if value is None or (isinstance(value, float) and value != value):
        return set()
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace(",", ";").split(";") if p.strip()]
    else:
        parts = [str(p) for p in value]
    found = set()
    for part in parts:
        if part in ROLES:
            found.add(part)
        else:  # "actor_rollout_ref+critic" style (worker classes that hold several roles)
            words = part.replace("_", "+").split("+")
            if {"actor", "rollout", "ref"} & set(words) and "critic" in words:
                found |= {"actor+rollout+ref", "critic"}
            elif {"actor", "ref"} & set(words):
                found.add("actor+rollout+ref")
            else:
                found |= {w for w in words if w in ROLES} or {part}
    return found


def _gb(mib: Any) -> str:
    try:
        return f"{float(mib) / MIB_PER_GB:.1f}"
    except (TypeError, ValueError):
        return "–"


def _processes(procs: Iterable[dict] | None) -> str:
    if not procs:
        return "<span class='wb-muted'>none seen</span>"
    return "<br>".join(
        f"{html.escape(str(p.get('role', '?')))} (pid {html.escape(str(p.get('pid', '?')))}): "
        f"{_gb(p.get('mem_used'))} GB" for p in procs
    )


def placement_rows(placement: pd.DataFrame) -> tuple[list[list[Any]], list[str], list[str]]:
    """Grid rows, their CSS classes and the mismatch messages, from `Session.placement()`."""
    rows, classes, warnings = [], [], []
    for rec in placement.to_dict("records"):
        planned, actual = _roles(rec.get("planned")), _roles(rec.get("actual"))
        cells = []
        for role in ROLES:
            mark = ("✓ planned" if role in planned else "") + (" · ● running" if role in actual else "")
            if role in actual and role not in planned:
                mark = "● running (not planned)"
            cells.append(mark.strip(" ·") or "")
        others = sorted(actual - set(ROLES) - {"other"})
        mem = f"{_gb(rec.get('mem_used'))} / {_gb(rec.get('mem_total'))} GB"
        gpu = f"{rec.get('node', '')}:{rec.get('gpu')}" if rec.get("node") not in (None, "", "vm") else rec.get("gpu")
        rows.append([fmt(gpu), *cells, ", ".join(others), mem, Raw(_processes(rec.get("procs")))])
        mismatch = bool(rec.get("mismatch"))
        classes.append("wb-warn" if mismatch else "")
        if mismatch:
            warnings.append(f"GPU {gpu}: {rec.get('message') or 'actual placement differs from the plan'}")
    return rows, classes, warnings


class PlacementPanel:
    def __init__(self, ctx, placement_editors: W.Widget):
        self.ctx = ctx
        self.grid = W.HTML(_dom_classes=["wb-placement-grid"])
        self.warnings = W.HTML(_dom_classes=["wb-placement-warnings"])
        self.widget = W.VBox(
            [heading("Device planner"), placement_editors, self.grid, self.warnings], _dom_classes=["wb-placement"]
        )

    def prepare(self, feed, news):
        if "placement" not in news or feed.placement is None:
            return None
        placement = feed.placement
        if not isinstance(placement, pd.DataFrame):
            placement = pd.DataFrame(placement)
        rows, classes, warnings = placement_rows(placement)
        grid = table(["GPU", *ROLES, "other processes", "memory used / total", "processes (memory)"], rows,
                     css="wb-table wb-placement-table", row_classes=classes)
        warn = "".join(f"<div class='wb-warning'>⚠ {html.escape(w)}</div>" for w in warnings)
        return grid, warn or "<span class='wb-muted'>Actual placement matches the plan.</span>"

    def show(self, payload) -> None:
        grid, warn = payload
        assign(self.grid, value=grid)
        assign(self.warnings, value=warn)
