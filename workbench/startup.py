"""Where a verl run's start-up goes: its phases, read from the run's own log and the timestamps in it.

verl 0.9.1, Ray and vLLM each stamp their lines in their own format (Ray `2026-11-30 16:26:28,359`, verl
`INFO:2026-11-30 16:27:04,546:`, vLLM `INFO 11-30 16:28:26 [file.py:1]` without year or milliseconds, torch/glog
`W1130 16:27:24.967`). A phase ends at a line that marks a milestone (Ray is up, the critic's engine is built,
vLLM's engine has captured its CUDA graphs, …) and starts where the milestone before it was reached, so every phase
is measured between two real timestamps. vLLM logs at WARN under verl by default: then its inner phases (engine
spawn, model load, compile, KV cache, CUDA graphs) are missing and show as one "vLLM engine" phase — the workbench
runs vLLM at INFO (runner/runtime.py) so its sessions have them.

    parse_startup(log_text, launched_at=segment_start, first_step_end=t_of_first_step_row)  -> DataFrame
    Session.startup_phases(segment)                                                           -> the same, from a session

No verl import: this reads text.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from pathlib import Path

import pandas as pd

COLUMNS = ["phase", "start", "end", "seconds", "offset_s", "source", "evidence"]


@dataclass(frozen=True)
class Milestone:
    key: str
    pattern: str
    phase: str  # the phase that ends here
    last: bool = False  # take the last match before the first step instead of the first


# In the order they normally happen; a milestone that is absent (no critic, vLLM at WARN, …) is skipped, and the
# phase before the next one found then spans both.
MILESTONES = (
    Milestone("ray_begin", r"authentication_token_setup\.py|Connecting to existing Ray cluster|ray\.init", "python imports, config validation"),
    Milestone("ray_ready", r"Started a local Ray instance|Connected to Ray cluster", "Ray start"),
    # The workbench's own stamps (runner/runtime.py milestone) split what verl logs as one stretch.
    Milestone("taskrunner", r"\[workbench\] .* TaskRunner up", "TaskRunner process: start, imports"),
    Milestone("transfer_queue", r"\[workbench\] .* TransferQueue ready", "TransferQueue: controller, storage units"),
    Milestone("dataloader", r"train and validate dataloader initialized|\[workbench\] .* dataloader built",
              "TaskRunner, TransferQueue, dataloader"),
    Milestone("worker_group", r"create worker group", "worker group (Ray actors for the roles)"),
    Milestone("critic", r"critic model engine initialized", "critic worker: model + FSDP"),
    Milestone("actor", r"actor and ref model engine initialized", "actor/ref worker: model + FSDP"),
    Milestone("reward", r"reward loop manager initialized", "reward loop"),
    Milestone("vllm_spawn", r"We must use the `spawn` multiprocessing|Resolved architecture", "vLLM server: process, imports, config"),
    Milestone("engine_core", r"Initializing a V1 LLM engine", "vLLM engine core spawn"),
    Milestone("vllm_worker", r"Starting to load model", "vLLM GPU worker spawn, distributed init"),
    Milestone("model_load", r"Model loading took", "vLLM model load"),
    Milestone("compile", r"torch\.compile takes|Compiling a graph for dynamic shape takes|Directly load the compiled graph",
              "vLLM torch.compile (or loading it from the compile cache)", last=True),
    Milestone("kv_cache", r"Available KV cache memory", "vLLM memory profiling (KV cache size)"),
    Milestone("cuda_graphs", r"Graph capturing finished", "vLLM CUDA graph capture"),
    Milestone("engine_init", r"init engine \(profile, create kv cache, warmup model\) took", "vLLM engine warm-up"),
    Milestone("vllm_ready", r"checkpoint engine manager initialized", "vLLM API server, weight-sync engine"),
    Milestone("resume", r"Loaded optimizer from|Resuming from .*setting global step", "resume: load checkpoint", last=True),
    Milestone("ready", r"all initialize finished, ready to fit", "trainer ready"),
    Milestone("first_request", r"Passing raw prompts to InputProcessor|Added \d+ warmup prompts", "first step: agent-loop workers, first batch"),
)
VLLM_UNSPLIT = "vLLM engine: spawn, load, compile, KV cache, CUDA graphs, API server (vLLM at WARN: not split)"
# The dataloader's phase where the workbench's stamps split off what came before it.
DATALOADER_AFTER = {"transfer_queue": "trainer: tokenizer, datasets, dataloader",
                    "taskrunner": "TransferQueue, tokenizer, datasets, dataloader"}
STEP_LINE = re.compile(r"\bstep:(\d+) - ")
STEP_TIME = re.compile(r"timing_s/step:([0-9.]+)")
GRAPH_BAR = re.compile(r"Capturing CUDA graphs \(([^)]*)\):\s*100%.*?\[(\d+):(\d+)<")

_FULL = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{2}):(\d{2}):(\d{2})[,.](\d{1,6})")  # Ray, verl, TransferQueue
_VLLM = re.compile(r"\b(?:INFO|WARNING|ERROR|DEBUG|CRITICAL) (\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})\b")
_GLOG = re.compile(r"\[?(?:\[rank\d+\]:)?[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{1,9})")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def read_log(path: str | Path) -> str:
    path = Path(path)
    data = path.read_bytes()
    if path.suffix == ".gz" or data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return data.decode("utf-8", errors="replace")


def line_time(line: str, year: int | None, tz: tzinfo | None) -> float | None:
    """The epoch time a log line carries, or None. Year-less formats take `year` (the last full date seen)."""
    m = _FULL.search(line)
    if m:
        y, mo, d, h, mi, s, frac = m.groups()
        return _epoch(int(y), int(mo), int(d), int(h), int(mi), int(s), float("0." + frac), tz)
    if year is None:
        return None
    m = _VLLM.search(line)
    if m:
        mo, d, h, mi, s = map(int, m.groups())
        return _epoch(year, mo, d, h, mi, s, 0.0, tz)
    m = _GLOG.search(line)
    if m:
        mo, d, h, mi, s, frac = m.groups()
        return _epoch(year, int(mo), int(d), int(h), int(mi), int(s), float("0." + frac), tz)
    return None


def _epoch(y, mo, d, h, mi, s, frac, tz) -> float:
    dt = datetime(y, mo, d, h, mi, s)
    dt = dt.replace(tzinfo=tz) if tz is not None else dt.astimezone()  # naive: this machine's local time
    return dt.timestamp() + frac


def launches(text: str) -> list[list[str]]:
    """A log may hold several launches one after the other (a relaunch appends): split them."""
    out: list[list[str]] = [[]]
    for line in text.splitlines():
        clean = _ANSI.sub("", line)
        starts = clean.startswith("[validate_config]") or (
            clean.startswith("ray init kwargs:") and not (out[-1] and out[-1][-1].startswith("[validate_config]")))
        if starts and out[-1]:
            out.append([])
        out[-1].append(clean)
    return [run for run in out if run]


def parse_startup(
    text: str, *, launched_at: float | None = None, first_step_end: float | None = None, launch: int = -1,
    tz: tzinfo | None = None, year: int | None = None,
) -> pd.DataFrame:
    """The start-up phases of one launch in a verl log, in order, as a DataFrame (COLUMNS).

    launched_at: when the process was started (epoch s; the segment's start in a session) — adds the first phase
    (imports and config before Ray). first_step_end: when the first step's metrics were recorded (the session
    store's step row); without it the first step's end is estimated from the step line's own `timing_s/step`
    (source "estimate"). tz: the time zone the run's machine logged in (default: this machine's)."""
    runs = launches(text)
    if not runs:
        return pd.DataFrame(columns=COLUMNS)
    lines = runs[launch]
    found: dict[str, tuple[float, str]] = {}
    last_full_year = year
    step_idx = step_no = step_s = None
    times: list[float | None] = []
    for i, line in enumerate(lines):
        m = _FULL.search(line)
        if m:
            last_full_year = int(m.group(1))
        t = line_time(line, last_full_year, tz)
        times.append(t)
        if step_idx is None:
            sm = STEP_LINE.search(line)
            if sm:
                step_idx, step_no = i, int(sm.group(1))
                st = STEP_TIME.search(line)
                step_s = float(st.group(1)) if st else None
                continue
        if t is None or step_idx is not None:
            continue
        for ms in MILESTONES:
            if re.search(ms.pattern, line) and (ms.key not in found or ms.last):
                found[ms.key] = (t, _evidence(line))
    marks = sorted(((t, key, ev) for key, (t, ev) in found.items()), key=lambda x: x[0])
    rows = []
    phase_of = {ms.key: ms.phase for ms in MILESTONES}
    prev_t = launched_at
    prev_key = None
    for t, key, ev in marks:
        if prev_t is not None and not (key == "ray_begin" and launched_at is None):
            phase = phase_of[key]
            if key == "vllm_ready" and prev_key == "vllm_spawn":
                phase = VLLM_UNSPLIT
            if key == "dataloader":
                phase = DATALOADER_AFTER.get(prev_key, phase)
            rows.append(_row(phase, prev_t, t, "log", ev))
        prev_t, prev_key = t, key
    if step_idx is not None and prev_t is not None:
        end, source = first_step_end, "store"
        if end is None:
            before = next((x for x in reversed(times[:step_idx]) if x is not None), None)
            after = next((x for x in times[step_idx + 1:] if x is not None), None)
            ready = found.get("ready", found.get("resume", (None,)))[0]
            # The first step starts when the trainer is ready (seen within ~1.5 s where the log says both).
            end = (ready + step_s) if (ready is not None and step_s is not None) else None
            end = before if end is None else max(end, before) if before is not None else end
            if end is not None and after is not None:
                end = min(end, after)
            source = "estimate"
        if end is not None:
            rows.append(_row(f"first step: generation + training (step {step_no}"
                             f"{'' if step_s is None else f', verl timing {step_s:.1f} s'})",
                             prev_t, end, source, f"step:{step_no}"))
    df = pd.DataFrame(rows, columns=COLUMNS)
    if len(df):
        t0 = df["start"].iloc[0]
        df["offset_s"] = (df["start"] - t0).round(2)
        df["start"] = pd.to_datetime(df["start"], unit="s", utc=True)
        df["end"] = pd.to_datetime(df["end"], unit="s", utc=True)
    df.attrs["cuda_graph_bars_s"] = cuda_graph_seconds(lines)
    return df


def cuda_graph_seconds(lines: list[str]) -> dict[str, int]:
    """Seconds vLLM's CUDA-graph progress bars report per kind (they carry no timestamps; at WARN level they are
    the only sign of the capture)."""
    out: dict[str, int] = {}
    for line in lines:
        m = GRAPH_BAR.search(line)
        if m:
            out[m.group(1)] = int(m.group(2)) * 60 + int(m.group(3))
    return out


def _row(phase: str, start: float, end: float, source: str, evidence: str) -> dict:
    return {"phase": phase, "start": start, "end": end, "seconds": round(end - start, 2), "offset_s": 0.0,
            "source": source, "evidence": evidence}


def _evidence(line: str) -> str:
    return re.sub(r"^\([^)]*\)\s*", "", line.strip())[:160]


def summary(phases: pd.DataFrame) -> dict:
    """Total seconds to the first step's end and to 'trainer ready', and the largest phase."""
    if not len(phases):
        return {"total_s": None, "to_ready_s": None, "largest": None}
    t0, t_end = phases["start"].iloc[0], phases["end"].iloc[-1]
    ready = phases[phases["phase"] == "trainer ready"]
    big = phases.loc[phases["seconds"].idxmax()]
    return {
        "total_s": round((t_end - t0).total_seconds(), 1),
        "to_ready_s": round((ready["end"].iloc[0] - t0).total_seconds(), 1) if len(ready) else None,
        "largest": {"phase": big["phase"], "seconds": float(big["seconds"])},
    }


__all__ = ["parse_startup", "read_log", "summary", "cuda_graph_seconds", "MILESTONES", "COLUMNS"]
