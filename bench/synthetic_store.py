"""SYNTHETIC session stores for load benchmarks — the numbers in them are made up and mean nothing.

What the benchmarks need is a store of the size a long session reaches: 8 GPUs × 1 h × 10 Hz of samples (288 000
rows), process attribution once a second per GPU (2 processes each), and 2 000 steps. Shapes are borrowed from a real
recording (the plan and the set of metric names of workbench/assets/recordings/h200-proof, so every reader sees the
columns a real session has); the values are that recording's step metrics cycled with noise and random GPU samples.
Never use such a store as a recording or as evidence of anything but read/write cost.

    python -m bench.synthetic_store DIR [--gpus 8] [--hours 1] [--hz 10] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from workbench.store import SAMPLE_COLUMNS, Store

SHAPE_SOURCE = Path(__file__).resolve().parents[1] / "workbench" / "assets" / "recordings" / "h200-proof"
ROLES = ("actor_rollout_ref+critic", "rollout")
NODE = "synthetic-node"
CHUNK = 50_000


def build(directory: str | Path, *, gpus: int = 8, hours: float = 1.0, hz: float = 10.0, steps: int = 2000,
          seed: int = 0, end: float | None = None) -> Path:
    """Write a synthetic session directory (store only) and return it. Its meta says `synthetic: true`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    source = Store(SHAPE_SOURCE, readonly=True)
    plan_json = source.rows("segments")[0]["plan_json"]
    real_steps = [r["metrics"] for r in source.rows("steps")]
    source_meta = source.meta()
    source.close()

    end = end or time.time()
    start = end - hours * 3600
    store = Store(directory)
    store.set_meta(
        kind="bench", synthetic=True, state="running", created=start, initial_plan=plan_json,
        gpu_count=gpus, gpu_name=source_meta.get("gpu_name"), model_shape=source_meta.get("model_shape"),
        what=f"SYNTHETIC load store: {gpus} GPUs x {hours} h x {hz} Hz samples, {steps} steps (bench/synthetic_store.py)",
    )
    segment = store.begin_segment(plan_json, reason="synthetic")
    _steps(store, segment, real_steps, steps, start, end, rng)
    _samples(store, gpus, start, end, hz, rng)
    _procs(store, gpus, start, end, rng)
    store.add_event("started", "synthetic session (load only)", t=start)
    store.close()
    return directory


def _steps(store: Store, segment: int, real: list[dict], n: int, start: float, end: float, rng) -> None:
    dt = (end - start) / n
    rows = []
    for i in range(n):
        base = real[i % len(real)]
        noisy = {k: (v * float(rng.normal(1.0, 0.02)) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
                 for k, v in base.items()}
        rows.append((segment, i + 1, start + (i + 1) * dt, json.dumps(noisy)))
    with store._tx() as db:  # one transaction: the generator is not what is measured
        db.executemany("INSERT INTO steps(segment_id, step, t, metrics_json) VALUES(?,?,?,?)", rows)


def _samples(store: Store, gpus: int, start: float, end: float, hz: float, rng) -> None:
    ticks = np.arange(start, end, 1.0 / hz)
    total = len(ticks) * gpus
    t = np.repeat(ticks, gpus)
    gpu = np.tile(np.arange(gpus), len(ticks))
    util = np.clip(rng.normal(45, 30, total), 0, 100).round()
    mem_total = np.full(total, 143771.0)
    cols = {
        "t": t, "node": None, "gpu": gpu, "util": util, "mem_used": np.clip(rng.normal(60000, 20000, total), 0, 143771),
        "mem_total": mem_total, "power_w": rng.uniform(100, 700, total), "sm_clock": rng.uniform(1000, 1980, total),
        "sm_active": util * rng.uniform(0.1, 0.9, total), "sm_occupancy": rng.uniform(0, 40, total),
        "tensor_active": rng.uniform(0, 30, total), "dram_active": rng.uniform(0, 40, total),
        "pcie_tx": rng.uniform(0, 1e8, total), "pcie_rx": rng.uniform(0, 1e8, total),
        "nvlink_tx": np.full(total, np.nan), "nvlink_rx": np.full(total, np.nan),
    }
    node = NODE
    for lo in range(0, total, CHUNK):
        hi = min(total, lo + CHUNK)
        rows = [
            tuple(node if c == "node" else (None if np.isnan(v := float(cols[c][i])) else v) if c != "gpu" else int(cols[c][i])
                  for c in SAMPLE_COLUMNS)
            for i in range(lo, hi)
        ]
        store.add_samples(rows)


def _procs(store: Store, gpus: int, start: float, end: float, rng) -> None:
    rows = []
    for second in np.arange(start, end, 1.0):
        for g in range(gpus):
            for k, role in enumerate(ROLES):
                rows.append((float(second), NODE, g, 10_000 + 10 * g + k, role, float(rng.uniform(5e3, 7e4))))
        if len(rows) >= CHUNK:
            store.add_procs(rows)
            rows = []
    store.add_procs(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.synthetic_store", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("directory", type=Path)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--steps", type=int, default=2000)
    a = p.parse_args(argv)
    t0 = time.time()
    build(a.directory, gpus=a.gpus, hours=a.hours, hz=a.hz, steps=a.steps)
    print(f"synthetic store at {a.directory} in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
