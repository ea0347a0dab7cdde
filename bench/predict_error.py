"""How far the what-if model (workbench/predict.py) is from what a changed plan really did, on held-out segments.

Each pair predicts a target segment's median step time (warm-up step left out) from a source segment of another
plan, never reading the target's steps; the error is (predicted - measured) / measured. Sources and targets are
real H200 measurements only:
- the workbench's recorded sessions (workbench/assets/recordings: h200-proof, h200-lora-critic-sync, 2026-11-30;
  h200-tuning, h200-hot-lever (0.5B) and h200-autopilot-1.5b (1.5B), 2026-12-01);
- the plain-verl reference runs (tests/data: h200_2026-11-30 quickstart A and tuned B, h200_fused_logprob_2026-12-01
  quickstart, fused C and fused + 8 agent workers D), with the plans their scripts ran (tests/h200_traces.py);
- sessions a GPU campaign packed with its results (bench/results/<folder>/campaign_recording.tar.gz: the 2026-12-02
  in-place session, sync → colocate_async alone on the fused round-1 plan).
A target is measured as the model costs a segment (predict.segment_cost): its median step, or under colocate_async,
whose steps alternate long and short, its mean (what the autopilot judges it by).
Some of predict.py's priors were read off the same runs (the update's split into a transformer and a logits part
from 2026-12-01 A → C and h200-tuning 1 → 2, dynamic batching's effect on the logits part from 2026-11-30 A → B,
the micro-batch exponent from h200-proof 1 → 2, the LoRA critic factor from h200-proof, colocate_async's
generation factor from h200_2026-12-02_inplace 2 → 3); pairs that use a prior on
the run it came from are marked `in_sample` and the table reports the median over the out-of-sample pairs too, and
the median per model size (the shape the memory model reads off each target's peaks).

The trainer's peak memory (PyTorch's max reserved) is predicted on the same pairs; its error is in `details`.

Runs on the CPU: `.venv/bin/python bench/predict_error.py [--out FOLDER]` writes predict_error.json to FOLDER
(default bench/results/h200_2026-12-01/).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from common import environment, result, write  # noqa: E402
from tests.h200_traces import PLANS, RESULTS, frames, packed_session  # noqa: E402
from tests.plan_fixtures import runnable_overrides, write_tiny_model  # noqa: E402
from workbench import predict  # noqa: E402
from workbench.advisor import measurements  # noqa: E402
from workbench.plan import Plan  # noqa: E402
from workbench.store import Store  # noqa: E402

MACHINE = "h200_2026-12-01"
GOAL = "<= 15"
RECORDINGS = ROOT / "workbench" / "assets" / "recordings"

# (source, target, in_sample): reference runs by name, recorded segments as "recording#segment".
PAIRS = [
    ("fused_A", "fused_C", True), ("fused_C", "fused_A", True), ("fused_A", "fused_D", False),
    ("fused_C", "fused_D", False), ("fused_D", "fused_C", False), ("fused_D", "fused_A", False),
    ("A", "B", True), ("B", "A", True), ("A", "fused_A", False), ("fused_A", "A", False),
    ("A", "fused_C", False), ("B", "fused_C", False), ("B", "fused_D", False),
    ("h200-proof#1", "h200-proof#2", True), ("h200-proof#2", "h200-proof#1", True),
    ("h200-proof#2", "h200-proof#3", True), ("h200-proof#3", "h200-proof#5", False),
    ("h200-proof#2", "h200-lora-critic-sync#1", True), ("h200-lora-critic-sync#1", "h200-proof#2", True),
    ("h200-lora-critic-sync#1", "h200-proof#3", False),
    # 2026-12-01, recorded after the priors were set: verl's quickstart → the advisor's fused-kernel proposal.
    ("h200-tuning#1", "h200-tuning#2", True), ("h200-tuning#2", "h200-tuning#1", True),
    # 2026-12-01, lease 2 (0.5B, 128 prompts × 256+768): quickstart → the fused lever applied hot (checkpointing off).
    ("h200-hot-lever#1", "h200-hot-lever#2", False), ("h200-hot-lever#2", "h200-hot-lever#1", False),
    # 2026-12-01, lease 3 (1.5B, 128 prompts × 512+1024): quickstart → fused lever with checkpointing kept (hot, then
    # the same plan restarted) → checkpointing off with smaller budgets.
    ("h200-autopilot-1.5b#1", "h200-autopilot-1.5b#2", False), ("h200-autopilot-1.5b#1", "h200-autopilot-1.5b#3", False),
    ("h200-autopilot-1.5b#3", "h200-autopilot-1.5b#1", False), ("h200-autopilot-1.5b#3", "h200-autopilot-1.5b#4", False),
    ("h200-autopilot-1.5b#4", "h200-autopilot-1.5b#3", False),
    # 2026-12-02, in place (0.5B, 128 prompts × 256+768, the fused round-1 plan): sync → colocate_async alone.
    ("h200_2026-12-02_inplace#2", "h200_2026-12-02_inplace#3", True),
    ("h200_2026-12-02_inplace#3", "h200_2026-12-02_inplace#2", True),
]


class Segments:
    """Measured segments by name, each as the advisor's Measurements (the predictor's calibration input)."""

    def __init__(self):
        model = write_tiny_model(Path(tempfile.mkdtemp(prefix="predict-error-model-")))
        self.base = Plan.from_verl(runnable_overrides(model))
        self._cache: dict[str, object] = {}

    def __call__(self, name: str):
        if name not in self._cache:
            self._cache[name] = self._load(name)
        return self._cache[name]

    def _load(self, name: str):
        if "#" in name:
            recording, segment = name.split("#")
            packed = (RESULTS / recording).is_dir()
            store = Store(packed_session(recording) if packed else RECORDINGS / recording, readonly=True)
            row = next(r for r in store.rows("segments") if r["id"] == int(segment))
            knobs = Plan.from_json(row["plan_json"]).knob_values()
            steps, samples = store.frame("steps"), store.frame("samples")
            store.close()
            return measurements(steps, samples, knobs, segment_id=int(segment))
        steps, samples = frames(name)
        return measurements(steps, samples, self.base.with_changes(PLANS[name]).knob_values())


def evaluate() -> pd.DataFrame:
    """One row per pair: measured and predicted step, the error and whether the band held it."""
    segments = Segments()
    rows = []
    for source, target, in_sample in PAIRS:
        cost = predict.segment_cost(segments(source))
        truth = segments(target)
        truth_cost = predict.segment_cost(truth)
        measured, memory = truth_cost.step_s, truth_cost.trainer_peak_gb
        p = predict.predict(cost, truth.knobs)
        low, high = p.step_range_s
        changed = [k for k in truth.knobs if truth.knobs[k] != cost.knobs.get(k)]
        shape = predict.memory_model_for(truth_cost).shape
        rows.append({
            "source": source, "target": target, "in_sample": in_sample, "changed": ", ".join(changed),
            "model": f"{shape.policy_params / 1e9:.1f}B",
            "source_step_s": cost.step_s, "measured_step_s": measured, "predicted_step_s": p.step_s,
            "uncertainty": p.uncertainty, "error_pct": 100 * (p.step_s - measured) / measured,
            "inside_band": low <= measured <= high, "target_steps": list(truth.steps["step"].astype(int)),
            "measured_trainer_gb": memory, "predicted_trainer_gb": p.trainer_peak_gb,
            "memory_error_pct": 100 * (p.trainer_peak_gb - memory) / memory,
        })
    return pd.DataFrame(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for the JSON (default bench/results/<machine>/)")
    args = parser.parse_args()
    table = evaluate()
    absolute = table["error_pct"].abs()
    out_of_sample = absolute[~table["in_sample"]]
    env = {**environment(MACHINE), "gpu": "NVIDIA H200 (where the segments were measured; this script ran on "
                                          "the CPU)", "gpu_count": 1}
    res = result(
        "predict_error", value=float(absolute.median()), unit="% |error| of predicted step time (median)",
        goal=GOAL, machine=MACHINE, env=env,
        repetitions=[{"value": abs(r["error_pct"]), **r} for r in table.to_dict("records")],
        details={"median_abs_error_out_of_sample_pct": float(out_of_sample.median()),
                 "median_abs_error_by_model_pct": {model: float(errors.median())
                                                   for model, errors in absolute.groupby(table["model"])},
                 "pairs": len(table), "pairs_out_of_sample": int((~table["in_sample"]).sum()),
                 "inside_band_share": float(table["inside_band"].mean()),
                 "max_abs_error_pct": float(absolute.max()),
                 "colocate_async_abs_error_pct": {f"{r.source} -> {r.target}": abs(r.error_pct) for r in
                                                  table[table["changed"].str.contains("trainer_mode")].itertuples()},
                 "trainer_memory_median_abs_error_pct": float(table["memory_error_pct"].abs().median()),
                 "trainer_memory_max_abs_error_pct": float(table["memory_error_pct"].abs().max())},
        notes="Held-out pairs: each target segment predicted from another plan's segment, its own steps unread. "
              "Sources: workbench/assets/recordings (H200, 2026-11-30) and tests/data reference runs (H200, "
              "2026-11-30 and 2026-12-01). The 2026-11-30 and 2026-12-01 quickstart runs of one plan differ by "
              "13 % by themselves (57.1 vs 64.8 s): the run-to-run floor.",
        command="python bench/predict_error.py",
    )
    path = write(res, args.out)
    pd.set_option("display.width", 200)
    print(table[["source", "target", "model", "in_sample", "measured_step_s", "predicted_step_s", "error_pct",
                 "inside_band", "memory_error_pct"]].round(2).to_string(index=False))
    by_model = ", ".join(f"{model} {errors.median():.1f} %" for model, errors in absolute.groupby(table["model"]))
    print(f"median |error| {absolute.median():.1f} % (out of sample {out_of_sample.median():.1f} %; {by_model}) "
          f"-> {path}")


if __name__ == "__main__":
    main()
