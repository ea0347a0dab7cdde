"""The what-if model on real H200 segments (tests/h200_traces.py, workbench/assets/recordings): predictions of one
plan from another plan's measurements, OOM warnings, uncertainty. bench/predict_error.py measures the error over
every held-out pair; these tests pin a few of them and the model's behaviour."""

from __future__ import annotations

import functools
import shutil

import pytest

from tests.h200_traces import PLANS, frames
from tests.plan_fixtures import runnable_overrides, tiny_model  # noqa: F401 (fixture)
from workbench import memory, predict
from workbench.advisor import measurements
from workbench.plan import Plan, PlanError
from workbench.session import Session, resolve_recording
from workbench.store import Store


class Runs:
    def __init__(self, base: Plan):
        self.base = base

    @functools.cache
    def knobs(self, name: str) -> dict:
        return self.base.with_changes(PLANS[name]).knob_values()

    @functools.cache
    def m(self, name: str):
        steps, samples = frames(name)
        return measurements(steps, samples, self.knobs(name))

    def cost(self, name: str) -> predict.SegmentCost:
        return predict.segment_cost(self.m(name))

    def measured_step(self, name: str) -> float:
        return float(self.m(name).steps["timing_s/step"].median())


@pytest.fixture(scope="module")
def runs(tiny_model):  # noqa: F811
    return Runs(Plan.from_verl(runnable_overrides(tiny_model)))


def test_calibration_reads_phases_tokens_and_memory(runs):
    cost = runs.cost("fused_A")
    assert cost.steps == (2, 3)  # step 1 is warm-up
    assert cost.phase_s["update_actor"] == pytest.approx((40.87 + 38.32) / 2, abs=0.01)
    assert cost.step_s == pytest.approx((66.73 + 62.86) / 2, abs=0.01)
    assert cost.trainer_peak_gb == pytest.approx(27.03, abs=0.01)
    assert cost.mem_total_gb == pytest.approx(143_771 / 1024)
    assert sum(cost.phase_s.values()) + cost.other_s == pytest.approx(cost.step_s)


def test_same_plan_predicts_the_measurement_with_its_own_spread(runs):
    cost = runs.cost("fused_C")
    p = predict.predict(cost, runs.knobs("fused_C"))
    assert p.step_s == pytest.approx(cost.step_s) and p.sources == {} and p.unmodelled == ()
    assert p.uncertainty == pytest.approx(cost.step_spread, rel=0.01)


@pytest.mark.parametrize("source,target,in_sample", [
    ("fused_A", "fused_C", True),   # the fused-kernel prior was read off this pair
    ("fused_A", "fused_D", False),  # another run of the fused plan (8 agent workers)
    ("A", "B", False),              # 2026-11-30: budgets, no checkpointing, rollout memory 0.6
    ("B", "fused_C", False),        # tuned → fused, across days
])
def test_held_out_predictions_within_15_percent(runs, source, target, in_sample):
    p = predict.predict(runs.cost(source), runs.knobs(target))
    assert p.step_s == pytest.approx(runs.measured_step(target), rel=0.15)
    low, high = p.step_range_s
    assert low <= runs.measured_step(target) <= high


def test_fused_kernels_move_the_log_prob_phases_and_name_their_source(runs):
    p = predict.predict(runs.cost("fused_A"), {**runs.knobs("fused_A"), "fused_kernels": True})
    frame = p.frame().set_index("phase")
    # The 0.5B shape with checkpointing kept: the h200-tuning recording's update_actor 41.32 → 5.305 s.
    assert frame.loc["update_actor", "predicted_s"] == pytest.approx(
        5.305 / 41.32 * frame.loc["update_actor", "measured_s"])
    assert frame.loc["gen", "predicted_s"] == frame.loc["gen", "measured_s"]
    assert "H200, 2026-12-01" in p.sources["fused_kernels"] and "/" not in p.sources["fused_kernels"]
    back = predict.predict(predict.segment_cost(runs.m("fused_A")), runs.knobs("fused_A"))
    assert back.step_s == pytest.approx(runs.cost("fused_A").step_s)


def recorded_segment(recording: str, segment: int):
    store = Store(resolve_recording(recording), readonly=True)
    row = next(r for r in store.rows("segments") if r["id"] == segment)
    knobs = Plan.from_json(row["plan_json"]).knob_values()
    steps, samples = store.frame("steps"), store.frame("samples")
    store.close()
    return measurements(steps, samples, knobs, segment_id=segment)


def phase_ratio(p: predict.Prediction, truth, phase: str) -> float:
    measured = float(truth.steps[f"timing_s/{phase}"].median())
    return p.phase_s[phase] / measured


def test_the_fused_factor_follows_the_models_shape():
    # Out of sample: the priors come from 0.5B runs; the 1.5B recording's quickstart → fused kernels with
    # checkpointing kept measured update_actor ×0.215 (32.25 → 6.94 s) where the 0.5B runs measured ×0.128.
    quickstart, fused = recorded_segment("h200-autopilot-1.5b", 1), recorded_segment("h200-autopilot-1.5b", 2)
    cost = predict.segment_cost(quickstart)
    assert predict.memory_model_for(cost).shape.hidden_size == 1536
    p = predict.predict(cost, fused.knobs)
    assert phase_ratio(p, fused, "update_actor") == pytest.approx(1.0, abs=0.05)
    assert phase_ratio(p, fused, "old_log_prob") == pytest.approx(1.0, abs=0.15)
    shapes = memory.KNOWN_SHAPES
    kept = [predict.pass_cost("update_actor", shapes[name], True, True, False)
            / predict.pass_cost("update_actor", shapes[name], False, True, False)
            for name in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")]
    assert kept == sorted(kept) and kept[0] == pytest.approx(5.305 / 41.32)  # larger models: the logits weigh less


def test_checkpointing_recomputes_the_transformer_part_only(runs):
    shape = memory.KNOWN_SHAPES["qwen2.5-0.5b"]
    fused_off = predict.pass_cost("update_actor", shape, True, False, True) / \
        predict.pass_cost("update_actor", shape, True, True, True)
    loop_off = predict.pass_cost("update_actor", shape, False, False, True) / \
        predict.pass_cost("update_actor", shape, False, True, True)
    # The critic (all transformer) measured 3.30 → 2.64 s without checkpointing (tests/data fused A → C).
    assert fused_off == pytest.approx(2.643 / 3.303, rel=0.02)
    assert fused_off < loop_off < 1.0  # beside the full-vocabulary logits the recompute weighs little
    critic = predict.pass_cost("update_critic", shape, False, False, True) / \
        predict.pass_cost("update_critic", shape, False, True, True)
    assert critic == pytest.approx(fused_off)


def test_smaller_budgets_cost_time_within_dynamic_batching():
    # Out of sample (the exponent comes from h200-proof, 0.5B): the 1.5B recording's checkpointing off with the
    # actor budget 16 384 → 8 192 and the critic's 32 768 → 8 192 made values 1.46 → 2.00 s and update_critic
    # 5.28 → 5.50 s, where checkpointing off alone would have made the update shorter.
    fused, smaller = recorded_segment("h200-autopilot-1.5b", 3), recorded_segment("h200-autopilot-1.5b", 4)
    p = predict.predict(predict.segment_cost(fused), smaller.knobs)
    assert p.phase_s["values"] > 1.2 * fused.steps["timing_s/values"].median()
    for phase in ("values", "update_critic", "update_actor"):
        assert phase_ratio(p, smaller, phase) == pytest.approx(1.0, abs=0.15), phase
    assert p.step_s == pytest.approx(float(smaller.steps["timing_s/step"].median()), rel=0.10)
    assert "micro batches^0.25" in p.sources["batching"]


def test_huge_budgets_warn_of_an_oom_before_anything_is_queued(runs):
    # Budgets only grow micro batches up to a whole mini batch: one mini batch of the whole step makes them bite.
    huge = {**runs.knobs("fused_C"), "ppo_mini_batch_size": 256, "actor_token_budget": 262144,
            "logprob_token_budget": 262144, "critic_token_budget": 262144}
    p = predict.predict(runs.cost("fused_C"), huge)
    assert p.oom and p.gpu_peak_share > 0.95 and not p.fits
    assert p.warnings["plan"].startswith("out of memory predicted") and "actor_token_budget" in p.warnings["plan"]
    fine = predict.predict(runs.cost("fused_C"), runs.knobs("fused_C"))
    assert not fine.oom and fine.fits and fine.warnings == {}
    # Beyond a whole mini batch a budget changes nothing, in memory as in verl.
    whole = predict.predict(runs.cost("fused_C"), {**runs.knobs("fused_C"), "critic_token_budget": 65536})
    same = predict.predict(runs.cost("fused_C"), {**runs.knobs("fused_C"), "critic_token_budget": 262144})
    assert same.memory.phase_gib("update_critic") == pytest.approx(whole.memory.phase_gib("update_critic"))


def test_rollout_memory_share_moves_the_generation_peak(runs):
    cost = runs.cost("fused_C")
    before = predict.predict(cost, runs.knobs("fused_C"))
    p = predict.predict(cost, {**runs.knobs("fused_C"), "rollout_gpu_memory": 0.9})
    assert p.memory.gen_peak_gib - before.memory.gen_peak_gib == pytest.approx(0.5 * cost.mem_total_gb)
    assert p.oom and not p.fits and p.memory.peak_phase == "gen"


def test_rollout_batched_tokens_past_its_share_are_an_oom(runs):
    # H200 2026-11-30 (the h200-proof recording, segment 4): max_num_batched_tokens 8 000 000 crashed vLLM at start.
    p = predict.predict(runs.cost("fused_C"), {**runs.knobs("fused_C"), "rollout_max_batched_tokens": 8_000_000})
    assert p.oom and p.memory.peak_phase == "gen"
    assert predict.predict(runs.cost("fused_C"), {**runs.knobs("fused_C"),
                                                  "rollout_max_batched_tokens": 16384}).fits


def test_an_unmodelled_knob_widens_the_band_and_says_so(runs):
    knobs = runs.knobs("fused_C")
    p = predict.predict(runs.cost("fused_C"), {**knobs, "rollout_tp": 2})
    assert p.unmodelled == ("rollout_tp",) and "rollout_tp" in p.warnings
    assert p.uncertainty > predict.UNMODELLED_UNCERTAINTY


def test_recorded_session_segments_predict_each_other():
    recording = resolve_recording("h200-proof")
    store = Store(recording, readonly=True)
    steps, samples = store.frame("steps"), store.frame("samples")
    plans = {row["id"]: Plan.from_json(row["plan_json"]).knob_values() for row in store.rows("segments")}
    store.close()
    source = measurements(steps, samples, plans[2], segment_id=2)
    target = measurements(steps, samples, plans[3], segment_id=3)  # LoRA critic + colocate_async
    p = predict.predict(predict.segment_cost(source), plans[3])
    assert set(p.sources) == {"critic_lora", "colocate_async"}
    assert p.step_s == pytest.approx(float(target.steps["timing_s/step"].median()), rel=0.15)
    low, high = p.step_range_s
    assert low <= predict.segment_cost(target).step_s <= high  # the pair mean, 10.86 s


def test_colocate_async_alone_on_one_gpu_is_predicted_within_its_band_of_the_measured_pair():
    """bench/results/h200_2026-12-02_inplace (1 × H200, 2026-12-02; 0.5B shape, 128 prompts × ≤ 256 + 768, fused
    kernels, dynamic batching, checkpointing off): sync steps 4–5 took 14.45 / 13.57 s (gen 6.17 / 5.83 s); with
    trainer_mode → colocate_async alone, steps 7–8 took 8.42 / 18.64 s (gen 0.15 / 10.57 s): a pair mean of 13.53 s,
    4 % faster. One GPU gains little: the rollout and training share it and verl puts vLLM to sleep while it trains,
    so async only lets the next batch decode beside this one in the tail of its rollout (predict.COLOCATE_ASYNC_GEN).
    From the sync segment alone the model predicts that pair within its band and within 5 %, and a gain under a
    tenth of the step; the training phases do not move."""
    from tests.h200_traces import packed_session

    store = Store(packed_session("h200_2026-12-02_inplace"), readonly=True)
    steps, samples = store.frame("steps"), store.frame("samples")
    plans = {row["id"]: Plan.from_json(row["plan_json"]).knob_values() for row in store.rows("segments")}
    store.close()
    assert {k for k in plans[3] if plans[3][k] != plans[2][k]} == {"trainer_mode"}
    sync = predict.segment_cost(measurements(steps, samples, plans[2], segment_id=2))
    pair = predict.segment_cost(measurements(steps, samples, plans[3], segment_id=3))
    assert sync.steps == (4, 5) and pair.steps == (7, 8)
    assert pair.step_s == pytest.approx((8.42 + 18.64) / 2, abs=0.01)
    p = predict.predict(sync, plans[3])
    low, high = p.step_range_s
    assert low <= pair.step_s <= high
    assert p.step_s == pytest.approx(pair.step_s, rel=0.05)
    assert 0 < 1 - p.step_s / sync.step_s < 0.10
    assert set(p.sources) == {"colocate_async"} and "share the GPUs" in p.sources["colocate_async"]
    training = {k: v for k, v in p.measured_phase_s.items() if k != "gen"}
    assert {k: v for k, v in p.phase_s.items() if k != "gen"} == training
    assert p.phase_s["gen"] == pytest.approx(sync.phase_s["gen"] * predict.COLOCATE_ASYNC_GEN)


def test_an_alternating_colocate_async_segment_is_costed_by_its_mean():
    """h200-proof segment 3 (H200, 2026-11-30, colocate_async): steps 15–17 took 8.73 / 12.60 / 7.93 s. Their
    median (8.73 s, a short step) is no step time of this plan: it runs long and short steps in turn, and the
    autopilot and the advisor judge it by their mean."""
    store = Store(resolve_recording("h200-proof"), readonly=True)
    steps, samples = store.frame("steps"), store.frame("samples")
    knobs = Plan.from_json(store.segment(3)["plan_json"]).knob_values()
    store.close()
    assert knobs["trainer_mode"] == "colocate_async"
    m = measurements(steps[steps["step"] <= 17], samples, knobs, segment_id=3)
    cost = predict.segment_cost(m)
    assert cost.steps == (15, 16, 17)
    assert cost.step_s == pytest.approx(m.steps["timing_s/step"].mean()) == pytest.approx((8.73 + 12.60 + 7.93) / 3,
                                                                                       abs=0.01)
    assert cost.phase_s["gen"] == pytest.approx(m.steps["timing_s/gen"].mean())
    assert sum(cost.phase_s.values()) + cost.other_s == pytest.approx(cost.step_s)


def test_closest_cost_is_the_segment_with_fewest_differences(runs):
    costs = [runs.cost("fused_A"), runs.cost("fused_C")]
    assert predict.closest_cost(costs, runs.knobs("fused_D")) is costs[1]
    assert predict.closest_cost(costs, runs.knobs("A")) is costs[0]
    assert predict.closest_cost([], runs.knobs("A")) is None


def test_memory_model_meets_the_measured_peaks(runs):
    # fused kernels with checkpointing kept memory low (h200-tuning: 21.7 GB), without it 68.4 GB (fused_C)
    quickstart = runs.cost("fused_A")
    with_checkpointing = predict.predict(quickstart, {**runs.knobs("fused_C"), "gradient_checkpointing": True})
    assert with_checkpointing.trainer_peak_gb == pytest.approx(21.7, rel=0.15)
    without = predict.predict(quickstart, runs.knobs("fused_C"))
    assert without.trainer_peak_gb == pytest.approx(runs.cost("fused_C").trainer_peak_gb, rel=0.15)


def test_session_predict_calibrates_on_its_own_segments():
    session = Session(resolve_recording("h200-proof"), read_only=True)  # the plan in force: segment 5's
    costs = session.segment_costs()
    assert [c.segment_id for c in costs] == [1, 2, 3, 5]  # 4 crashed before its first step
    p = session.predict({"fused_kernels": True})
    assert p.basis_segment == 5  # the plan in force, measured (segment 3 ran it too: the newest wins)
    assert p.step_s < p.measured_step_s and "fused_kernels" in p.sources
    with pytest.raises(PlanError):
        session.predict({"actor_token_budget": 0})


def test_preview_carries_the_prediction_and_warns_of_an_oom(tmp_path):
    # A copy of the recorded session marked running (no supervisor): preview judges changes against it.
    shutil.copytree(resolve_recording("h200-proof"), tmp_path / "proof")
    store = Store(tmp_path / "proof")
    store.set_meta(state="running", supervisor_pid=None)
    store.close()
    session = Session(tmp_path / "proof", read_only=True)
    # Budgets past a whole mini batch don't grow micro batches (64 prompts × 256 + 256 here); the rollout share does.
    huge = session.preview({"rollout_gpu_memory": 0.95})
    assert huge.ok and huge.prediction.oom and huge.warnings["plan"].startswith("out of memory predicted")
    fine = session.preview({"fused_kernels": True})
    assert fine.ok and fine.prediction.speedup > 1 and "plan" not in fine.warnings
