"""The real H200 NVML recordings the telemetry tests replay (see tests/data/README.md), and stretches of them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from workbench.telemetry.nvml import read_recording

DATA = Path(__file__).parent / "data"
RUN = DATA / "h200_run_nvml.csv"  # start-up (GPU idle for the first ~480 s), then 4 PPO steps
QUICKSTART = DATA / "h200_2026-11-30" / "A_nvml.csv"  # verl quickstart settings
TUNED = DATA / "h200_2026-11-30" / "B_nvml.csv"  # hand-tuned plan, same workload

# Seconds into the A and B recordings where PPO steps run steadily; the first 150 s of every recording are start-up.
STEADY = (200.0, 330.0)
STARTUP = (0.0, 150.0)


def stretch(path: Path, gpu: int, seconds: tuple[float, float], node: str = "h200", t0: float = 0.0) -> pd.DataFrame:
    """Samples-table rows for one GPU playing `seconds` of a recording, re-timed to start at t0."""
    frame = read_recording(path)
    offset = frame["t"] - frame["t"].iloc[0]
    frame = frame[(offset >= seconds[0]) & (offset < seconds[1])].copy()
    frame["t"] = frame["t"] - frame["t"].iloc[0] + t0
    return frame.assign(node=node, gpu=gpu)
