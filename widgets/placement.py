"""Device planner: a GPUs × roles grid, planned (from the plan in force) beside actual (process attribution),
with memory per GPU and per process and a warning where they differ. The placement knobs' editors (which GPUs,
how many for the critic / reward / rollout pools) come from the knob table through the changes panel, so a new
placement is previewed and applied like any other change.
"""

from __future__ import annotations

import html
import math
from typing import Any

import ipywidgets as W
import numpy as np
import pandas as pd

from .common import Raw, assign, heading, table

ROLES = ("actor+rollout+ref", "critic", "reward", "rollout")
MIB_PER_GB = 1024.0


def _roles(value: Any) -> set[str]:
    """Grid columns from a placement cell: a list of role names ("actor_rollout_ref" is the actor+rollout+ref
    worker; "rollout" a rollout server, colocated or on its own GPUs)."""
    if value is None or isinstance(value, float):
        return set()
    names = [value] if isinstance(value, str) else [str(v) for v in value]
    return {"actor+rollout+ref" if name in ("actor_rollout_ref", "actor", "ref") else name for name in names}


def _gb(mib: Any) -> str:
    """MiB as GB with one decimal; "–" where unknown (no sample yet: never "nan")."""
    try:
        gb = float(mib) / MIB_PER_GB
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(gb) else f"{gb:.1f}"


def _processes(processes: Any) -> str:
    """`{"role (pid N)": MiB}` as lines of "role (pid N): x GB"."""
    if not isinstance(processes, dict) or not processes:
        return "<span class='wb-muted'>none seen</span>"
    return "<br>".join(f"{html.escape(str(name))}: {_gb(mib)} GB" for name, mib in processes.items())


def gpu_memory(samples: pd.DataFrame) -> dict[int, tuple[float, float]]:
    """GPU index -> (MiB used, MiB total) in the newest bucket of the feed's aggregated samples."""
    if samples is None or not len(samples) or "mem_used" not in samples:
        return {}
    in_time = np.argsort(samples["t"].to_numpy(), kind="stable")
    gpu = samples["gpu"].to_numpy()[in_time]
    gpus, from_end = np.unique(gpu[::-1], return_index=True)
    newest = in_time[len(gpu) - 1 - from_end]  # each GPU's last row in time
    used = samples["mem_used"].to_numpy(dtype=np.float64)[newest]
    total = samples["mem_total"].to_numpy(dtype=np.float64)[newest] if "mem_total" in samples \
        else np.full(len(newest), np.nan)
    return {int(g): (float(u), float(t)) for g, u, t in zip(gpus, used, total)}


def placement_rows(placement: pd.DataFrame, memory: dict[int, tuple[float, float]]) \
        -> tuple[list[list[Any]], list[str], list[str]]:
    """Grid rows, their CSS classes and the mismatch messages, from `Session.placement()`."""
    rows, classes, warnings = [], [], []
    for rec in placement.to_dict("records"):
        planned, actual = _roles(rec.get("planned")), _roles(rec.get("actual"))
        cells = []
        for role in ROLES:
            if role in planned:
                cells.append("✓ ●" if role in actual else "✓")
            else:
                cells.append("● not planned" if role in actual else "")
        others = sorted(actual - set(ROLES))
        used, total = memory.get(int(rec["gpu"]), (float("nan"), float("nan")))
        rows.append([rec["gpu"], *cells, ", ".join(others), f"{_gb(used)} / {_gb(total)} GB",
                     f"{_gb(rec.get('mem_used'))} GB", Raw(_processes(rec.get("processes")))])
        mismatch = bool(rec.get("mismatch"))
        classes.append("wb-warn" if mismatch else "")
        if mismatch:
            warnings.append(str(rec.get("message") or f"GPU {rec['gpu']}: actual placement differs from the plan"))
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
        if not news & {"placement", "samples"} or feed.placement is None:
            return None
        placement = feed.placement
        if not isinstance(placement, pd.DataFrame):
            placement = pd.DataFrame(placement)
        rows, classes, warnings = placement_rows(placement, gpu_memory(feed.samples))
        grid = table(["GPU", *ROLES, "other roles", "GPU memory used / total", "session processes now",
                      "per process (alive now)"], rows,
                     css="wb-table wb-placement-table", row_classes=classes)
        warn = "<div class='wb-muted'>✓ planned here · ● its processes seen here</div>" + "".join(
            f"<div class='wb-warning'>⚠ {html.escape(w)}</div>" for w in warnings)
        if not warnings:
            warn += "<div class='wb-muted'>Actual placement matches the plan.</div>"
        return grid, warn

    def show(self, payload) -> None:
        grid, warn = payload
        assign(self.grid, value=grid)
        assign(self.warnings, value=warn)
