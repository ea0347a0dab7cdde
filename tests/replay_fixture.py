"""Assemble a recorded session (a session directory) from the real H200 measurements in tests/data/h200_2026-11-30/.

The measurements are real (verl 0.9.1 PPO on one H200, 2026-11-30: step metrics, a 5 Hz NVML trace, the run's log);
the session they are assembled into is a synthetic test fixture (see tests/data/README.md):
- segment 1: plan A (the quickstart settings of compare.sh) with run A's steps, samples and workers;
- segment 2: plan B (the tuned settings) with run B's — in truth a second run from scratch, not a resume;
- segment 3: plan A with actor_token_budget 8192, with run A's measurements again, shifted to after run B. A runs
  without use_dynamic_bsz, so verl never reads that budget: run A's measurements are what this plan does.
  It gives the recording a hot-applicable neighbour of plan A.
The plans point at the tiny model of tests/plan_fixtures.py, so they validate on a CPU machine.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from workbench.plan import Plan
from workbench.store import Store
from workbench.telemetry.nvml import read_recording

DATA = Path(__file__).parent / "data" / "h200_2026-11-30"
NODE = "h200-reference"
GPU_NAME = "NVIDIA H200"
HOT_NEIGHBOUR_BUDGET = 8192
# Qwen2.5-0.5B's shape, which the runs trained (ppo_cmd.sh; the recordings' meta says the same).
QWEN_05B_SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                      intermediate_size=4864, vocab_size=151936)
# compare.sh: what plan B changes from plan A.
TUNED_CHANGES = {
    "use_dynamic_bsz": True, "actor_token_budget": 24576, "critic_token_budget": 49152,
    "gradient_checkpointing": False, "rollout_gpu_memory": 0.6, "rollout_max_batched_tokens": 16384,
    "actor_micro_batch": 16, "logprob_micro_batch": 32, "ref_micro_batch": 32, "critic_micro_batch": 16,
}
# Ray actor classes in the runs' logs → the role the workbench's trainer would record for them.
ROLES = {
    "TaskRunnerV1": "driver", "WorkerDict": "actor_rollout_ref+critic", "vLLMHttpServer": "rollout",
    "EngineCore": "rollout", "AgentLoopWorkerTQ": "agent_loop",
}


def quickstart_overrides(model: Path) -> list[str]:
    """ppo_cmd.sh with compare.sh's settings for run A, on the tiny model (tests/plan_fixtures.py) beside its data
    paths (validation never opens them)."""
    data = model.parent / "data"
    return [
        "algorithm.adv_estimator=gae", f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
        "data.train_batch_size=256", "data.max_prompt_length=512", "data.max_response_length=512",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.enforce_eager=False", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-5", f"critic.model.path={model}", "critic.model.use_remove_padding=False",
        "+critic.model.override_config.attn_implementation=sdpa", "critic.ppo_micro_batch_size_per_gpu=4",
        "trainer.val_before_train=False", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.total_epochs=4", "trainer.total_training_steps=4",
    ]


def plans(model: Path) -> dict[str, Plan]:
    quickstart = Plan.from_verl(quickstart_overrides(model))
    return {
        "A": quickstart,
        "B": quickstart.with_changes(TUNED_CHANGES),
        "A_hot": quickstart.with_changes({"actor_token_budget": HOT_NEIGHBOUR_BUDGET}),
    }


def read_run(name: str) -> dict:
    """One measured run: start/end times, steps (step, t, metrics), NVML samples, and worker pids by class."""
    timeline = [line.split() for line in (DATA / f"{name}_timeline.txt").read_text().splitlines()]
    start = float(next(words[1] for words in timeline if words[0] == "T_ppo_start"))
    end = float(next(words[1] for words in timeline if words[0] == "T_ppo_end"))
    step_times: dict[int, float] = {}
    for words in timeline:
        if words[0] == "T_metrics_line":  # the watcher's first sighting of each step's metrics line
            step_times.setdefault(int(words[1]), float(words[2]))
    steps = [
        {"step": record["step"], "t": step_times[record["step"]], "metrics": record["data"]}
        for record in map(json.loads, (DATA / f"{name}_metrics.jsonl").read_text().splitlines())
    ]
    samples = read_recording(DATA / f"{name}_nvml.csv")
    with gzip.open(DATA / f"{name}_log.txt.gz", "rt", errors="replace") as log:
        pids = dict.fromkeys(re.findall(r"\((\w+) pid=(\d+)", log.read()))
    workers = [(int(pid), ROLES[cls]) for cls, pid in pids if cls in ROLES]
    return {"start": start, "end": end, "steps": steps, "samples": samples, "workers": workers}


def _add_segment(store: Store, plan: Plan, run: dict, shift: float, reason: str) -> int:
    """One recorded segment from one measured run, its times moved by `shift` seconds."""
    segment = store.begin_segment(plan.to_json(), reason=reason)
    store.add_event("launched", f"segment {segment} launched ({reason})", {"segment": segment}, t=run["start"] + shift)
    first = run["steps"][0]
    ready = first["t"] - first["metrics"]["timing_s/step"] + shift
    store.add_event("started", "verl is ready at step 1 (sync)", {"segment": segment, "first_step": 1}, t=ready)
    store.add_event(
        "telemetry", "NVML at 5 Hz by the reference sampler: no PCIe, NVLink, tensor or DRAM activity, no processes",
        {"hz": 5}, t=ready,
    )
    for pid, role in run["workers"]:
        store.add_worker(pid, role, NODE, segment)
    for row in run["steps"]:
        store.add_step(segment, row["step"], row["metrics"], t=row["t"] + shift)
    samples = run["samples"].assign(t=run["samples"]["t"] + shift, gpu=0, node=NODE)
    store.add_samples(samples.to_dict("records"))
    store.end_segment(segment, "done")
    # The store stamps segments (and workers) with the time of writing: put them on the recording's clock.
    store._db.execute("UPDATE segments SET started_at=?, ended_at=? WHERE id=?", (run["start"] + shift, run["end"] + shift, segment))
    store._db.execute("UPDATE workers SET t=? WHERE segment_id=?", (ready, segment))
    return segment


def build_recording(directory: Path, model: Path) -> Path:
    """Write the assembled recording into `directory` (a session directory) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    plan = plans(model)
    run_a, run_b = read_run("A"), read_run("B")
    store = Store(directory)
    store.set_meta(
        created=run_a["start"], kind="live", state="finished", initial_plan=plan["A"].to_json(), gpu_count=1,
        gpu_name=GPU_NAME, fixture="synthetic session assembled from real H200 measurements (tests/data/README.md)",
        # The measured runs' model (the plans point at the tiny model only so that they validate on a CPU).
        model_shape={**QWEN_05B_SHAPE, "architectures": ["Qwen2ForCausalLM"]},
    )
    _add_segment(store, plan["A"], run_a, 0.0, "start")
    _add_segment(store, plan["B"], run_b, 0.0, "tuned plan (a separate run)")
    _add_segment(store, plan["A_hot"], run_a, run_b["end"] + 4.0 - run_a["start"], "run A's measurements, unused budget")
    store.close()
    return directory
