"""What every benchmark result says: the figure, its goal, every repetition, and where it was measured.

A result is one JSON file, bench/results/<machine>/<measure>.json. `result(...)` builds it, `write(...)` stores it;
bench/table.py turns the folder into the table in bench/README.md.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Iterable

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
PACKAGES = ("verl", "vllm", "torch", "ray", "transformers", "nvidia-ml-py")


def default_machine() -> str:
    """`cpu-<cores>core_<date>` without a GPU, `<gpu>_<date>` with one (e.g. h200_2026-12-01)."""
    gpu = gpu_info().get("gpu")
    date = time.strftime("%Y-%m-%d")
    if gpu:
        short = re.sub(r"[^a-z0-9]+", "", gpu.lower().replace("nvidia", "").split("-")[0].split()[0])
        return f"{short}_{date}"
    return f"cpu-{os.cpu_count()}core_{date}"


def gpu_info() -> dict[str, Any]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if count else None
            return {"gpu": name, "gpu_count": count, "driver": pynvml.nvmlSystemGetDriverVersion()}
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return {"gpu": None, "gpu_count": 0, "driver": None}


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def environment(machine: str | None = None) -> dict[str, Any]:
    """Where a figure was measured: machine name, host, CPU, GPU, driver, package versions."""
    return {
        "machine": machine or default_machine(),
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],  # a shared machine's timings need this beside them
        **gpu_info(),
        "versions": versions(),
    }


def spread(values: Iterable[float]) -> dict[str, float | None]:
    v = sorted(float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x)))
    if not v:
        return {"n": 0, "min": None, "max": None, "p10": None, "p90": None, "stdev": None}

    def q(p: float) -> float:
        return v[min(len(v) - 1, int(round(p * (len(v) - 1))))]

    return {"n": len(v), "min": v[0], "max": v[-1], "p10": q(0.1), "p90": q(0.9),
            "stdev": statistics.stdev(v) if len(v) > 1 else 0.0}


def median(values: Iterable[float]) -> float | None:
    v = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(v) if v else None


def goal_met(value: float | None, goal: str | None) -> bool | None:
    """`goal` reads like "<= 200 ms", ">= 4x", "== next boundary" (words: judged by the measure, not here)."""
    if value is None or not goal:
        return None
    m = re.match(r"\s*(<=|>=|<|>)\s*([0-9.]+)", goal)
    if not m:
        return None
    op, bound = m.group(1), float(m.group(2))
    return {"<=": value <= bound, ">=": value >= bound, "<": value < bound, ">": value > bound}[op]


def result(
    measure: str, *, value: float | None, unit: str, goal: str | None, repetitions: list[Any],
    machine: str | None = None, model_shape: dict[str, Any] | None = None, plan_overrides: list[str] | None = None,
    details: dict[str, Any] | None = None, notes: str = "", met: bool | None = None, env: dict[str, Any] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """One measure's result. `repetitions` keeps every raw figure; median and spread are over the numeric ones
    (a repetition may be a dict with a "value" key and its own context)."""
    numbers = [r.get("value") if isinstance(r, dict) else r for r in repetitions]
    numbers = [x for x in numbers if isinstance(x, (int, float))]
    env = env or environment(machine)
    if machine:
        env = {**env, "machine": machine}
    return {
        "measure": measure,
        "value": value,
        "unit": unit,
        "goal": goal,
        "goal_met": met if met is not None else goal_met(value, goal),
        **env,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model_shape": model_shape,
        "plan_overrides": plan_overrides,
        "repetitions": repetitions,
        "median": median(numbers),
        "spread": spread(numbers),
        "details": details or {},
        "notes": notes,
        "command": command,
    }


def write(res: dict[str, Any], out_dir: str | os.PathLike | None = None) -> Path:
    """bench/results/<machine>/<measure>.json (or OUT_DIR/<measure>.json)."""
    folder = Path(out_dir) if out_dir else RESULTS / res["machine"]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{res['measure']}.json"
    path.write_text(json.dumps(res, indent=1, default=_json_default) + "\n")
    return path


def _json_default(o: Any):
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


class Timer:
    """`with Timer() as t: ...; t.ms`"""

    def __enter__(self) -> "Timer":
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.s = time.perf_counter() - self.t0
        self.ms = 1000 * self.s
