"""Per-step figures from a session's store: what the GPU campaign reports (pure pandas: runs on a replay too).

A step's window is [t - timing_s/step, t], t = when its row was recorded (the runner writes it at the step boundary).
NVML utilization alone misleads (busy != doing work); GPM SM active says how much of the SMs did work.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

STEP_COLUMNS = {
    "step_s": "timing_s/step", "tokens_per_s_per_gpu": "perf/throughput", "mfu_actor": "perf/mfu/actor",
    "mfu_critic": "perf/mfu/critic", "gen_s": "timing_s/gen", "update_actor_s": "timing_s/update_actor",
    "old_log_prob_s": "timing_s/old_log_prob", "update_critic_s": "timing_s/update_critic", "values_s": "timing_s/values",
}


def per_step(steps: pd.DataFrame, samples: pd.DataFrame, gpus: list[int] | None = None) -> pd.DataFrame:
    """One row per step: segment, step, the STEP_COLUMNS figures, and NVML util / GPM SM active means inside it."""
    rows = []
    if gpus is not None and len(samples):
        samples = samples[samples["gpu"].isin(gpus)]
    for rec in steps.to_dict("records"):
        d = {name: _num(rec.get(col)) for name, col in STEP_COLUMNS.items()}
        d.update(segment_id=int(rec["segment_id"]), step=int(rec["step"]), t=float(rec["t"]))
        inside = samples.iloc[0:0]
        if len(samples) and not math.isnan(d["step_s"]):
            inside = samples[(samples["t"] > d["t"] - d["step_s"]) & (samples["t"] <= d["t"])]
        d["n_samples"] = len(inside)
        for m in ("util", "sm_active", "tensor_active", "dram_active", "mem_used"):
            d[f"{m}_mean"] = float(inside[m].mean()) if len(inside) and m in inside else float("nan")
        rows.append(d)
    return pd.DataFrame(rows)


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def summarize(frame: pd.DataFrame) -> dict[str, float | None]:
    """Medians of the per-step figures (NaN-free), and the steps they cover."""
    if frame.empty:
        return {"steps": []}
    out: dict[str, Any] = {"steps": [int(s) for s in frame["step"]]}
    for col in frame.columns:
        if col in ("segment_id", "step", "t", "n_samples"):
            continue
        v = frame[col].dropna()
        out[col] = round(float(v.median()), 4) if len(v) else None
    return out


def segment_steps(frame: pd.DataFrame, segment_id: int, warmup: int = 1) -> pd.DataFrame:
    """A segment's steps without its first `warmup` steps (the first step after a launch carries start-up work)."""
    mine = frame[frame["segment_id"] == segment_id].sort_values("step")
    return mine.iloc[warmup:]


def launched_segments(segments: pd.DataFrame) -> pd.DataFrame:
    """Segments that started a process (cold start or restart), not hot applies in the same process."""
    return segments[~segments["reason"].fillna("").str.startswith("hot apply")]
