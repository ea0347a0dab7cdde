"""Load balance across GPUs: per-GPU summary of a time window and plain-words verdicts over it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd



@dataclass(frozen=True)
class BalanceThresholds:
    """Every threshold the verdicts use, with why."""

    # Points of mean utilization between the busiest and the idlest GPU. Data-parallel ranks doing equal work sit
    # within a few points of each other; a gap this wide means some GPUs wait for others every step.
    util_spread_points: float = 35.0
    # Share of samples with utilization 0. A GPU idle half the time is half a GPU left unused.
    idle_share: float = 0.5
    # PCIe traffic (90th percentile, MB/s) counted as near saturation: 80% of a PCIe Gen5 x16 link's ~63 GB/s per
    # direction. Beyond it, host↔GPU transfers (offload, weight sync, data) hold the GPU back.
    pcie_near_saturation_mb_s: float = 0.8 * 63_000
    # Peak memory / total above which the next longer batch or bigger budget may not fit (OOM).
    memory_near_full: float = 0.95


THRESHOLDS = BalanceThresholds()


def balance_frame(samples: pd.DataFrame, t0: float | None = None, t1: float | None = None) -> pd.DataFrame:
    """Per (node, gpu) over samples with t0 <= t <= t1: utilization mean/p10/p90, idle share, peak memory and its
    share of the total, PCIe tx/rx mean and p90, mean SM activity (GPM). NaN where the GPU couldn't say."""
    window = samples
    if t0 is not None:
        window = window[window["t"] >= t0]
    if t1 is not None:
        window = window[window["t"] <= t1]
    if "node" not in window:
        window = window.assign(node="")
    groups = window.groupby(["node", "gpu"], sort=True)
    frame = pd.DataFrame({
        "samples": groups.size(),
        "util_mean": groups["util"].mean(),
        "util_p10": groups["util"].quantile(0.10),
        "util_p90": groups["util"].quantile(0.90),
        "idle_share": groups["util"].agg(lambda u: (u == 0).sum() / u.notna().sum() if u.notna().any() else math.nan),
        "mem_used_max": groups["mem_used"].max(),
        "mem_total": groups["mem_total"].max(),
        "pcie_tx_mean": groups["pcie_tx"].mean(),
        "pcie_rx_mean": groups["pcie_rx"].mean(),
        "pcie_tx_p90": groups["pcie_tx"].quantile(0.90),
        "pcie_rx_p90": groups["pcie_rx"].quantile(0.90),
        "sm_active_mean": groups["sm_active"].mean(),
    })
    frame.insert(frame.columns.get_loc("mem_total") + 1, "mem_used_share", frame["mem_used_max"] / frame["mem_total"])
    return frame.reset_index()


def balance_verdicts(frame: pd.DataFrame, thresholds: BalanceThresholds = THRESHOLDS) -> list[str]:
    """What in a balance_frame crosses a threshold, in plain words; empty when nothing does."""
    verdicts = []
    several_nodes = frame["node"].nunique() > 1
    name = {i: (f"{r.node} GPU {r.gpu}" if several_nodes else f"GPU {r.gpu}") for i, r in frame.iterrows()}

    means = frame["util_mean"].dropna()
    if len(means) > 1:
        spread = means.max() - means.min()
        if spread > thresholds.util_spread_points:
            verdicts.append(
                f"utilization spread {spread:.0f} points across GPUs > {thresholds.util_spread_points:.0f}: imbalanced "
                f"({name[means.idxmax()]} {means.max():.0f}%, {name[means.idxmin()]} {means.min():.0f}%)"
            )
    for i, row in frame.iterrows():
        if row["idle_share"] > thresholds.idle_share:
            verdicts.append(f"{name[i]} idle {row['idle_share']:.0%} of the time")
        for direction, column in (("RX (to GPU)", "pcie_rx_p90"), ("TX (from GPU)", "pcie_tx_p90")):
            if row[column] > thresholds.pcie_near_saturation_mb_s:
                verdicts.append(
                    f"PCIe {direction} near saturation on {name[i]}: {row[column] / 1000:.0f} GB/s at the 90th percentile "
                    f"> {thresholds.pcie_near_saturation_mb_s / 1000:.0f} GB/s"
                )
        if row["mem_used_share"] > thresholds.memory_near_full:
            verdicts.append(
                f"{name[i]} memory {row['mem_used_share']:.0%} full at peak "
                f"({row['mem_used_max'] / 1024:.1f} of {row['mem_total'] / 1024:.1f} GiB): little headroom"
            )
    return verdicts
