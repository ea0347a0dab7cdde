"""Real H200 reference runs (tests/data/README.md) as the store's steps and samples frames, with their plans as
knob changes: what the advisor, predictor and predictor-error tests and bench/predict_error.py read.

metrics.jsonl (verl's file logger) has no timestamps. For the 2026-11-30 runs a watcher noted when each line
landed (`T_metrics_line` in the timeline); the 2026-12-01 runs only noted start and end, so a step's end is the
log's "ready to fit" time plus the cumulative `timing_s/step` (verl's steps follow each other with no gap beyond
metric logging, well under a second)."""

from __future__ import annotations

import atexit
import datetime as dt
import functools
import gzip
import json
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

import pandas as pd

from workbench.store import SAMPLE_COLUMNS
from workbench.telemetry.nvml import read_recording

DATA = Path(__file__).parent / "data"
RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
FUSED = DATA / "h200_fused_logprob_2026-12-01"
H200_MEM_TOTAL_MIB = 143_771.0  # the recordings hold no memory total; this is what NVML reports for an H200
NODE = "h200"

# The runs' settings (shared/gpu/reference/ppo_cmd.sh, compare.sh and the fused runs' README lines) as knob values.
RUN_PLAN = {"train_batch_size": 64, "ppo_mini_batch_size": 32, "max_prompt_length": 256, "max_response_length": 256,
            "actor_micro_batch": 16, "logprob_micro_batch": 16, "ref_micro_batch": 16, "critic_micro_batch": 16,
            "rollout_gpu_memory": 0.4, "agent_workers": 2, "remove_padding": False}
A_PLAN = {**RUN_PLAN, "train_batch_size": 256, "ppo_mini_batch_size": 64, "max_prompt_length": 512,
          "max_response_length": 512, "actor_micro_batch": 4, "logprob_micro_batch": 8, "ref_micro_batch": 4,
          "critic_micro_batch": 4}
B_PLAN = {**A_PLAN, "use_dynamic_bsz": True, "actor_token_budget": 24576, "critic_token_budget": 49152,
          "gradient_checkpointing": False, "rollout_gpu_memory": 0.6, "rollout_max_batched_tokens": 16384,
          "actor_micro_batch": 16, "logprob_micro_batch": 32, "ref_micro_batch": 32, "critic_micro_batch": 16}
# 2026-12-01: C = quickstart + fused kernels (torch), dynamic batching 16 384 actor / 32 768 log-prob and critic
# inference, no gradient checkpointing; D = C with 8 agent-loop workers.
C_PLAN = {**A_PLAN, "fused_kernels": True, "fused_kernel_backend": "torch", "use_dynamic_bsz": True,
          "actor_token_budget": 16384, "logprob_token_budget": 32768, "critic_token_budget": 32768,
          "gradient_checkpointing": False, "actor_micro_batch": 16, "logprob_micro_batch": 32,
          "critic_micro_batch": 16}
D_PLAN = {**C_PLAN, "agent_workers": 8}
PLANS = {"run": RUN_PLAN, "A": A_PLAN, "B": B_PLAN, "fused_A": A_PLAN, "fused_C": C_PLAN, "fused_D": D_PLAN}
FUSED_DIRS = {"fused_A": "A_quickstart", "fused_C": "C_fused", "fused_D": "D_fused_agent8"}


def _samples(nvml: Path) -> pd.DataFrame:
    samples = read_recording(nvml).assign(node=NODE, gpu=0, mem_total=H200_MEM_TOTAL_MIB)
    return samples[list(SAMPLE_COLUMNS)]


def _watched(metrics: Path, timeline: Path, nvml: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    landed: dict[int, float] = {}
    for words in (line.split() for line in timeline.read_text().splitlines()):
        if words[0] == "T_metrics_line":
            landed.setdefault(int(words[1]), float(words[2]))
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps = pd.DataFrame([{"segment_id": 1, "step": r["step"], "t": landed[r["step"]], **r["data"]} for r in records])
    return steps, _samples(nvml)


def _ready_to_fit(log: Path) -> float:
    with gzip.open(log, "rt", errors="replace") as text:
        stamp = re.search(r"INFO:(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):all initialize finished", text.read()).group(1)
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=dt.timezone.utc).timestamp()


def _fused(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    end = _ready_to_fit(folder / "log.txt.gz")
    rows = []
    for r in records:
        end += r["data"]["timing_s/step"]
        rows.append({"segment_id": 1, "step": r["step"], "t": end, **r["data"]})
    return pd.DataFrame(rows), _samples(folder / "nvml.csv")


@functools.cache
def frames(name: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps, samples) of a reference run: "run", "A", "B" (2026-11-30) or "fused_A", "fused_C", "fused_D"."""
    if name in FUSED_DIRS:
        return _fused(FUSED / FUSED_DIRS[name])
    if name == "run":
        return _watched(DATA / "advisor" / "h200_run_metrics.jsonl", DATA / "advisor" / "h200_run_timeline.txt",
                        DATA / "h200_run_nvml.csv")
    folder = DATA / "h200_2026-11-30"
    return _watched(folder / f"{name}_metrics.jsonl", folder / f"{name}_timeline.txt", folder / f"{name}_nvml.csv")


@functools.cache
def packed_session(results_folder: str) -> Path:
    """The session directory a GPU campaign packed into bench/results/<results_folder>/campaign_recording.tar.gz,
    unpacked once per process into a temporary folder removed at exit (read it with Store(path, readonly=True)): real sessions kept
    with their results rather than among the bundled recordings, whose list drives the slow replay tests."""
    into = Path(tempfile.mkdtemp(prefix=f"{results_folder}-"))
    atexit.register(shutil.rmtree, into, ignore_errors=True)
    with tarfile.open(RESULTS / results_folder / "campaign_recording.tar.gz") as packed:
        members = [m for m in packed.getmembers() if m.name.endswith(("session.sqlite", "session.sqlite-wal"))]
        packed.extractall(into, members=members, filter="data")
    (session,) = {into / Path(m.name).parent for m in members}
    return session
