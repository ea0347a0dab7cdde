"""What a fresh process of each kind a verl run spawns pays in Python imports before doing any work (issue 17: a
relaunch spends ~20 s per process it starts: the runner, TaskRunner, TransferQueue, FSDP worker, vLLM server, engine
core, engine worker, agent-loop workers).

    python3 bench/gpu/import_times.py OUT.json

Each module is imported in a process of its own, one after the other (`python -X importtime`), so the figures are
a cold process's on a warm page cache. Writes the wall time of each import and the packages its time went to
(self time summed per top-level package).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

# What each kind of process imports first (the module whose import pulls in the rest).
MODULES = {
    "runner (workbench.runner.launch)": "workbench.runner.launch",
    "TaskRunner / trainer (verl.trainer.ppo.v1)": "verl.trainer.ppo.v1",
    "TransferQueue storage": "transfer_queue",
    "FSDP worker (verl.workers.engine_workers)": "verl.workers.engine_workers",
    "vLLM server (verl's vllm_async_server)": "verl.workers.rollout.vllm_rollout.vllm_async_server",
    "vLLM engine core": "vllm.v1.engine.core",
    "torch alone": "torch",
}
TOP = 12


def import_time(module: str) -> dict:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True,
                          text=True, timeout=300)
    wall = time.time() - t0
    self_time: dict[str, int] = defaultdict(int)  # per top-level package: additive, unlike cumulative times
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:"):].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        self_time[parts[2].strip().split(".")[0]] += int(parts[0].strip())
    top = sorted(self_time.items(), key=lambda kv: -kv[1])[:TOP]
    return {"module": module, "wall_s": round(wall, 2), "rc": proc.returncode,
            "self_s_by_package": {name: round(us / 1e6, 2) for name, us in top},
            "error_tail": proc.stderr[-1500:] if proc.returncode else ""}


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:])[0])
    rows = {}
    for kind, module in MODULES.items():
        rows[kind] = import_time(module)
        print(f"{kind}: {rows[kind]['wall_s']} s", flush=True)
    out.write_text(json.dumps({"python": sys.version.split()[0], "imports": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
