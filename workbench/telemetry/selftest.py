"""What NVML can tell on this machine, as JSON: per GPU one reading of every metric, GPM support, the sources in use,
compute processes and the reason for every NaN; plus what a read costs.

    python -m workbench.telemetry.selftest [--gpus 0,1] [--reads 10] [--interval 0.1]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import sys
import time
from typing import Any

from .nvml import NvmlReader, NvmlUnavailable, parse_gpu_list
from .sampling import EXIT_NO_NVML


def _json_safe(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


def selftest(gpus: list[int] | None = None, reads: int = 10, interval_s: float = 0.1) -> dict[str, Any]:
    """Read every GPU `reads` times, `interval_s` apart (GPM and the counters need an interval), and report the last
    reading. Raises NvmlUnavailable where NVML can't start."""
    with NvmlReader(gpus) as reader:
        costs = []
        rows: list[dict[str, Any]] = []
        for _ in range(reads):
            time.sleep(interval_s)
            started = time.perf_counter()
            rows = reader.read()
            costs.append(time.perf_counter() - started)
        processes = reader.processes()
        reasons = reader.nan_reasons()
        return {
            "driver": reader.driver_version(),
            "nvidia_ml_py": importlib.metadata.version("nvidia-ml-py"),
            "read_ms_mean": 1000 * sum(costs) / len(costs),
            "read_ms_max": 1000 * max(costs),
            "gpus": [
                {
                    **info,
                    "reading": {k: _json_safe(v) for k, v in row.items()},
                    "processes": [{k: _json_safe(v) for k, v in p.items()} for p in processes if p["gpu"] == info["gpu"]],
                    "nan_reasons": {metric: text for (gpu, metric), text in reasons.items() if gpu == info["gpu"]},
                }
                for info, row in zip(reader.describe(), rows)
            ],
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.telemetry.selftest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default=None, help="GPU indices, e.g. 0,1 (default: all)")
    parser.add_argument("--reads", type=int, default=10, help="readings to take (the last is shown; default 10)")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between readings (default 0.1)")
    args = parser.parse_args(argv)
    try:
        result = selftest(parse_gpu_list(args.gpus), max(1, args.reads), args.interval)
    except NvmlUnavailable as e:
        print(json.dumps({"nvml": False, "error": str(e)}, indent=2))
        return EXIT_NO_NVML
    print(json.dumps({"nvml": True, **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
