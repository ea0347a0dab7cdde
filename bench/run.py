"""Run benchmarks and write bench/results/<machine>/<measure>.json, then refresh the table in bench/README.md.

    python -m bench.run --measure all                     # every CPU measure on this machine
    python -m bench.run --measure poll_cost --machine cpu-2core_2026-12-01
    python -m bench.run --measure all --quick --out /tmp/x   # a few repetitions on a small store: checks the scripts
    python -m bench.run --list

GPU measures (tuning_speedup, hot_apply_latency, restart_vs_cold, overhead, sampler_cost) are made by
bench/gpu/campaign.sh on the GPU machine, which writes the same JSON.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from bench.common import default_machine, write
from bench.measures import CPU_MEASURES, GPU_MEASURES, Context, module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--measure", default="all", help=f"one of {', '.join(CPU_MEASURES)}, or all")
    p.add_argument("--machine", help="names the results folder (default: cpu-<cores>core_<date> or <gpu>_<date>)")
    p.add_argument("--out", type=Path, help="write here instead of bench/results/<machine>/ (no table update)")
    p.add_argument("--quick", action="store_true", help="few repetitions, small store: proves the scripts run")
    p.add_argument("--list", action="store_true")
    a = p.parse_args(argv)
    if a.list:
        print("CPU:", ", ".join(CPU_MEASURES))
        print("GPU (bench/gpu/campaign.sh):", ", ".join(GPU_MEASURES))
        return 0
    names = CPU_MEASURES if a.measure == "all" else tuple(a.measure.split(","))
    ctx = Context(machine=a.machine or default_machine(), out=a.out, quick=a.quick)
    failed = []
    try:
        for name in names:
            print(f"== {name}", flush=True)
            try:
                res = module(name).run(ctx)
            except Exception:
                traceback.print_exc()
                failed.append(name)
                continue
            path = write(res, a.out)
            print(f"   {res['value']} {res['unit']} (goal {res['goal']}, met {res['goal_met']}) -> {path}", flush=True)
    finally:
        ctx.cleanup()
    if a.out is None and not a.quick:
        from bench.table import update_readme

        update_readme()
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
