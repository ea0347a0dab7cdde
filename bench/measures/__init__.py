"""One module per measure. Each has MEASURE (its name), WHERE ("cpu" or "gpu") and `run(ctx) -> dict` (a result
from bench.common.result). bench/run.py finds them here; each also runs alone: `python -m bench.measures.<name>`."""

from __future__ import annotations

import argparse
import importlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

CPU_MEASURES = ("poll_cost", "samples_cost", "apply_latency_replay", "dashboard_refresh", "page_open", "startup_phases",
                "page_memory", "first_visit")
# Minutes even when quick: bench/run.py runs them, the CI check of the scripts (tests/test_bench.py) does not.
# page_memory serves pages, then waits for their kernels to end after their grace (tests/test_probe_server.py asserts
# that page kernels end when their pages are gone); first_visit waits for a replay's steps after a click (the
# browser tests click an offer and see its segment drawn: tests/browser/test_page_loads.py).
SOAK_MEASURES = ("page_memory", "first_visit")
# Measured on a GPU by bench/gpu/campaign.sh (its drivers write these results); listed so the table knows them.
GPU_MEASURES = ("tuning_speedup", "hot_apply_latency", "restart_vs_cold", "overhead", "sampler_cost")


@dataclass
class Context:
    machine: str | None = None
    out: Path | None = None  # None: bench/results/<machine>/
    quick: bool = False  # a few repetitions on a small store: proves the script runs (CI), measures nothing
    work: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="wb-bench-")))
    _stores: dict = field(default_factory=dict)

    def load_store(self) -> Path:
        """The synthetic load store (8 GPUs × 1 h × 10 Hz, 2 000 steps; 1 GPU × 2 min, 50 steps when quick)."""
        from bench.synthetic_store import build

        key = "quick" if self.quick else "full"
        if key not in self._stores:
            target = self.work / f"synthetic-{key}"
            shutil.rmtree(target, ignore_errors=True)
            params = dict(gpus=1, hours=2 / 60, steps=50) if self.quick else dict(gpus=8, hours=1.0, steps=2000)
            self._stores[key] = (build(target, **params), params)
        return self._stores[key][0]

    def store_params(self) -> dict:
        self.load_store()
        return self._stores["quick" if self.quick else "full"][1]

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def module(name: str):
    if name not in CPU_MEASURES:
        raise SystemExit(f"unknown CPU measure {name!r}: choose from {', '.join(CPU_MEASURES)} "
                         f"(GPU measures {', '.join(GPU_MEASURES)} come from bench/gpu/campaign.sh)")
    return importlib.import_module(f"bench.measures.{name}")


def standalone(name: str, argv: list[str] | None = None) -> int:
    """`python -m bench.measures.<name> [--machine M] [--out DIR] [--quick]`"""
    from bench.common import write

    p = argparse.ArgumentParser(prog=f"python -m bench.measures.{name}")
    p.add_argument("--machine")
    p.add_argument("--out", type=Path)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args(argv)
    ctx = Context(machine=a.machine, out=a.out, quick=a.quick)
    try:
        res = module(name).run(ctx)
        print(write(res, a.out))
    finally:
        ctx.cleanup()
    return 0
