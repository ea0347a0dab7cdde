"""Where verl's start-up goes on the H200: the phases of recorded real runs, parsed from their logs' own timestamps
(workbench/startup.py), and what a restart-class change cost against a cold start in the recorded sessions.

Inputs are real logs kept in this repository (never generated): the workbench's own segment logs of 2026-11-30
(bench/results/h200_2026-11-30/*.log.gz, anchored to their sessions' stores in workbench/assets/recordings/: segment
start and first step from the store) and the plain-verl reference runs of that day (tests/data/). The result is
written for the machine the logs come from (h200_2026-11-30), not for the machine that parses them.
"""

from __future__ import annotations

from pathlib import Path

from bench.common import median, result, versions
from bench.measures import Context, standalone

MEASURE = "startup_phases"
WHERE = "cpu"
ROOT = Path(__file__).resolve().parents[2]
RECORDINGS = ROOT / "workbench" / "assets" / "recordings"
MACHINE = "h200_2026-11-30"
# (log, what it is, (recording, segment id) whose store anchors it, or None)
LOGS = (
    ("bench/results/h200_2026-11-30/lora_critic_sync_segment1.log.gz", "workbench cold start (LoRA critic, sync)",
     ("h200-lora-critic-sync", 1)),
    ("bench/results/h200_2026-11-30/session_proof_segment3_lora_async.log.gz",
     "workbench restart-class relaunch, resumed from step 13 (LoRA critic + colocate_async)", ("h200-proof", 3)),
    ("bench/results/h200_2026-11-30/session_proof_segment4_crash.log.gz",
     "workbench relaunch that died of OOM in vLLM's profiling (start-up until the crash)", ("h200-proof", 4)),
    ("tests/data/startup/h200_run_2026-11-30_log.txt.gz", "plain verl cold start, 64 x 256+256, enforce_eager, vLLM at INFO", None),
    ("tests/data/h200_2026-11-30/A_log.txt.gz", "plain verl cold start, quickstart settings, 256 x 512+512, CUDA graphs", None),
    ("tests/data/h200_2026-11-30/B_log.txt.gz", "plain verl cold start, hand-tuned plan, 256 x 512+512, CUDA graphs", None),
)


def anchors(recording: str, segment_id: int) -> dict:
    """From a recorded session's store: when the segment was launched, its first step's row, the apply before it."""
    from workbench.store import Store

    store = Store(RECORDINGS / recording, readonly=True)
    try:
        seg = store.segment(segment_id)
        steps = store.frame("steps")
        mine = steps[steps["segment_id"] == segment_id]
        commands = store.frame("commands")
        applies = commands[(commands["kind"] == "apply") & (commands["t"] <= seg["started_at"])] if len(commands) else commands
        meta = store.meta()
        return {
            "launched_at": seg["started_at"], "first_step_end": float(mine["t"].min()) if len(mine) else None,
            "first_step": int(mine["step"].min()) if len(mine) else None, "reason": seg["reason"],
            "apply_t": float(applies["t"].max()) if segment_id > 1 and len(applies) else None, "meta": meta,
        }
    finally:
        store.close()


def run(ctx: Context) -> dict:
    from datetime import timezone

    from workbench.startup import parse_startup, read_log, summary

    reps, meta = [], {}
    for rel, what, anchor in LOGS:
        kw, a = {}, None
        if anchor:
            a = anchors(*anchor)
            meta = meta or a["meta"]
            kw = {"launched_at": a["launched_at"], "first_step_end": a["first_step_end"]}
        phases = parse_startup(read_log(ROOT / rel), tz=timezone.utc, **kw)  # the H200 logged in UTC
        s = summary(phases)
        reached = any(phases["phase"].str.startswith("first step"))
        before_ray = float(phases["seconds"].iloc[0]) if anchor and len(phases) else 0.0  # imports, config
        rep = {
            "value": round(s["total_s"] - before_ray, 1) if reached else None,  # Ray's first line -> first step
            "log": rel, "what": what, "largest": s["largest"],
            "from_launch_s": s["total_s"] if anchor and reached else None,
            "to_ready_from_ray_s": round(s["to_ready_s"] - before_ray, 1) if s["to_ready_s"] else None,
            "cuda_graph_bars_s": phases.attrs.get("cuda_graph_bars_s"),
            "phases": [{"phase": r.phase, "seconds": r.seconds, "offset_s": r.offset_s, "source": r.source}
                       for r in phases.itertuples()],
        }
        if "cold" not in what:  # a relaunch or a crash: kept, but not a cold-start figure
            rep["relaunch_from_ray_s"] = rep.pop("value")
        if a and a["apply_t"] and a["first_step_end"]:
            rep["apply_to_first_step_s"] = round(a["first_step_end"] - a["apply_t"], 1)
        reps.append(rep)
    cold = [r["value"] for r in reps if r.get("value")]
    env = {
        "machine": MACHINE, "host": meta.get("machine"), "cpu": None, "cpu_count": 16, "gpu": meta.get("gpu_name"),
        "gpu_count": meta.get("gpu_count"), "driver": meta.get("driver"),
        "versions": {"verl": meta.get("verl_version"), "vllm": meta.get("vllm_version"), "torch": meta.get("torch_version"),
                     "ray": meta.get("ray_version"), "transformers": meta.get("transformers_version"),
                     "python": meta.get("python"), "parsed_with": versions()["python"]},
    }
    proof = anchors("h200-proof", 1), anchors("h200-proof", 3), anchors("h200-proof", 5)
    cold_proof = proof[0]["first_step_end"] - proof[0]["launched_at"]
    restart = proof[1]["first_step_end"] - proof[1]["apply_t"]
    return result(
        MEASURE, value=median(cold), unit="s", goal=None, repetitions=reps, env=env, machine=MACHINE,
        model_shape=meta.get("model_shape"),
        details={
            "h200_proof_cold_start_s": round(cold_proof, 1),
            "h200_proof_restart_apply_to_first_resumed_step_s": round(restart, 1),
            "h200_proof_restart_over_cold": round(restart / cold_proof, 3),
            "h200_proof_rollback_launch_to_first_step_s": round(proof[2]["first_step_end"] - proof[2]["launched_at"], 1),
        },
        notes="value: median cold start from Ray's first log line to the first step's end (each repetition's value "
              "is that span; plain-verl logs don't show their process start, workbench segments add ~11-13 s of "
              "imports and config before Ray: from_launch_s). vLLM logged at WARN in every run but "
              "h200_run: there its engine phases are not split. Restart vs cold in h200-proof: different plans "
              "(cold: sync, full critic; restart: LoRA critic + colocate_async), same machine and run.",
        command="python -m bench.run --measure startup_phases",
    )


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
