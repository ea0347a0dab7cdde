"""The advisor's rules on real H200 recordings (tests/data/advisor/README.md) and, where no recording shows a case,
on synthetic frames built here (each such case says so)."""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pandas as pd
import pytest

from tests import issue16_session as issue16
from tests.h200_traces import A_PLAN, B_PLAN, C_PLAN, D_PLAN, H200_MEM_TOTAL_MIB, NODE, RUN_PLAN, frames
from tests.plan_fixtures import runnable_overrides, tiny_model  # noqa: F401 (fixture)
from workbench.advisor import (FINDING_COLUMNS, FUSED_BUDGETS, RULES, THRESHOLDS, Finding, advise, findings_frame,
                               measurements)
from workbench.control import REPLAY_POLL_S
from workbench.knobs import ALGORITHM_KNOBS, KNOBS
from workbench.plan import Plan
from workbench.session import Session, resolve_recording
from workbench.store import SAMPLE_COLUMNS, Store

# The real recordings and their plans live in tests/h200_traces.py (shared with the predictor tests).
recording = frames


# ------------------------------------------------------------------------------------------------ synthetic frames
# SYNTHETIC: a step's phases summing to a 10 s step in which no phase stands out (gen 30 %, update_actor 40 %,
# critic at 0.2 of the actor, weight sync 1 %), so each case below changes only what it is about.
CALM_PHASES = {"gen": 3.0, "old_log_prob": 1.5, "values": 0.3, "adv": 0.1, "update_critic": 0.5,
               "update_actor": 4.0, "update_weights": 0.1}
STEP_S = 10.0
T0 = 1_000_000.0
SYNTHETIC_PLAN = {"train_batch_size": 64, "ppo_mini_batch_size": 32, "max_prompt_length": 512,
                  "max_response_length": 512, "use_dynamic_bsz": True, "actor_token_budget": 8192,
                  "logprob_token_budget": 16384, "ref_token_budget": 16384, "critic_token_budget": 16384}
# h200-proof (1 × H200, 2026-11-30, the workbench's own recording): segment 3 ran colocate_async with a LoRA critic.
PROOF = Store(resolve_recording("h200-proof"), readonly=True)
PROOF_STEPS, PROOF_SAMPLES = PROOF.frame("steps"), PROOF.frame("samples")
PROOF_ASYNC_PLAN = {k: v for k, v in Plan.from_json(PROOF.segment(3)["plan_json"]).knob_values().items()
                    if k not in ("gpus",)}
PROOF.close()
# The plans the cases run under (few: composing each costs ~0.3 s).
PLANS = {
    "run": RUN_PLAN, "A": A_PLAN, "B": B_PLAN, "C": C_PLAN, "D": D_PLAN, "synthetic": SYNTHETIC_PLAN,
    "synthetic_offload": {**SYNTHETIC_PLAN, "actor_param_offload": True, "actor_optimizer_offload": True},
    "synthetic_critic_gpu": {**SYNTHETIC_PLAN, "gpus": [0, 1], "critic_gpus": 1},
    "issue16": issue16.QUICKSTART,
    "proof_async": PROOF_ASYNC_PLAN,
}


def synthetic_steps(phases: dict | None = None, n_steps: int = 4, segment_id: int = 1, **metrics) -> pd.DataFrame:
    """SYNTHETIC steps: back-to-back 10 s steps ending at T0 + 10 s × k with the given phase seconds."""
    phases = {**CALM_PHASES, **(phases or {})}
    return pd.DataFrame([
        {"segment_id": segment_id, "step": k, "t": T0 + STEP_S * k, "timing_s/step": STEP_S,
         **{f"timing_s/{phase}": seconds for phase, seconds in phases.items()}, **metrics}
        for k in range(1, n_steps + 1)
    ])


def synthetic_samples(gpus: dict[int, dict], n_steps: int = 4, hz: float = 5.0) -> pd.DataFrame:
    """SYNTHETIC samples at `hz` over the steps, per GPU the given columns (util 60 %, memory 60 % by default)."""
    times = np.arange(T0, T0 + STEP_S * n_steps, 1 / hz)
    frames = []
    for gpu, values in gpus.items():
        columns = {"util": 60.0, "mem_used": 0.6 * H200_MEM_TOTAL_MIB, "mem_total": H200_MEM_TOTAL_MIB, **values}
        frame = pd.DataFrame({column: np.nan for column in SAMPLE_COLUMNS}, index=range(len(times)))
        frames.append(frame.assign(t=times, node=NODE, gpu=gpu, **columns))
    return pd.concat(frames, ignore_index=True)


def new_values(proposed: dict, knobs: dict) -> dict:
    """The proposed values a plan doesn't have yet (a proposal never repeats a knob's value)."""
    return {k: v for k, v in proposed.items() if knobs[k] != v}


# ------------------------------------------------------------------------------------------------ cases
# Every case: steps, samples, the name of its plan in PLANS, procs. Real recordings first, then synthetic frames.
def _case(steps, samples, plan, procs=None, record=None):
    return {"steps": steps, "samples": samples, "plan": plan, "procs": procs, "record": record}


def _issue16(crashed: bool):
    frames = issue16.frames(crashed)
    return _case(frames.steps, frames.samples, "issue16", record=frames.record())


CASES = {
    "A": lambda: _case(*recording("A"), "A"),
    "B": lambda: _case(*recording("B"), "B"),
    "run": lambda: _case(*recording("run"), "run"),
    # 2026-12-01, same workload as A/B: quickstart again (fused_A), with fused kernels (C), and C with 8 agent workers.
    "fused_A": lambda: _case(*recording("fused_A"), "A"),
    "fused_C": lambda: _case(*recording("fused_C"), "C"),
    "fused_D": lambda: _case(*recording("fused_D"), "D"),
    # SYNTHETIC: an actor update at 60 % of the step with the fused run's MFU (14 %): batching, not the loop.
    "actor_bound_fused": lambda: _case(synthetic_steps({"update_actor": 6.0, "gen": 1.0}, **{"perf/mfu/actor": 0.14}),
                                       synthetic_samples({0: {}}), "synthetic"),
    # SYNTHETIC: colocate_async's overlapped generation (H200: timing_s/gen 0.19 s), below one 2 s poll.
    "gen_overlapped": lambda: _case(synthetic_steps({"gen": 0.19}), synthetic_samples({0: {}}), "synthetic"),
    # SYNTHETIC: the quickstart's MFU on an 80 GiB GPU whose trainer holds 36 GiB at 8 192-token micro batches:
    # the fused run's budgets fit with checkpointing on (+3 GiB), not without it (+48 GiB), so it stays on.
    "loop_little_room": lambda: _case(
        synthetic_steps(**{"perf/mfu/actor": 0.013, "actor/perf/max_memory_reserved_gb": 36.0}),
        synthetic_samples({0: {"mem_used": 0.5 * 81_920.0, "mem_total": 81_920.0}}), "A"),
    # SYNTHETIC: no recording has a critic this heavy (the real ones: 0.12–0.20 of the actor's time).
    "critic_heavy": lambda: _case(synthetic_steps({"values": 1.0, "update_critic": 2.0}),
                                  synthetic_samples({0: {}}), "synthetic"),
    # SYNTHETIC: the same, with GPU 1 sampled idle outside the plan.
    "critic_heavy_spare_gpu": lambda: _case(synthetic_steps({"values": 1.0, "update_critic": 2.0}),
                                            synthetic_samples({0: {}, 1: {"util": 0.0, "mem_used": 500.0}}),
                                            "synthetic"),
    # SYNTHETIC (the recordings are single-GPU): the critic's own GPU 1 idles at 5 % while GPU 0 works at 80 %.
    "spread_critic_gpu": lambda: _case(synthetic_steps(), synthetic_samples({0: {"util": 80.0}, 1: {"util": 5.0}}),
                                       "synthetic_critic_gpu",
                                       pd.DataFrame({"t": [T0 + 5.0] * 2, "node": NODE, "gpu": [0, 1], "pid": [11, 12],
                                                     "role": ["actor/rollout/ref", "critic"], "mem_used": 1000.0})),
    # SYNTHETIC: two data-parallel GPUs within 5 points of each other.
    "spread_even": lambda: _case(synthetic_steps(), synthetic_samples({0: {"util": 70.0}, 1: {"util": 65.0}}),
                                 "synthetic_critic_gpu"),
    # SYNTHETIC: dynamic batching with memory peaking at 30 % (recorded B, the dynamic run, peaked at 71 %).
    "headroom": lambda: _case(synthetic_steps(), synthetic_samples({0: {"mem_used": 0.3 * H200_MEM_TOTAL_MIB}}),
                              "synthetic"),
    # SYNTHETIC: memory peaking at 97 % (the recordings peaked at 49–71 %).
    "oom_dynamic": lambda: _case(synthetic_steps(), synthetic_samples({0: {"mem_used": 0.97 * H200_MEM_TOTAL_MIB}}),
                                 "synthetic"),
    # SYNTHETIC: NVML peak 80 %, but PyTorch reserved 137 GiB for the critic; the quickstart's fixed micro batches.
    "oom_reserved_micro": lambda: _case(
        synthetic_steps(**{"critic/perf/max_memory_reserved_gb": 137.0, "actor/perf/max_memory_reserved_gb": 60.0}),
        synthetic_samples({0: {"mem_used": 0.8 * H200_MEM_TOTAL_MIB}}), "A"),
    # SYNTHETIC: weight sync at 25 % of the step (recorded: 1–2 %), actor parameters offloaded, memory at 40 %.
    "weight_sync_offload": lambda: _case(synthetic_steps({"update_weights": 2.5, "gen": 1.0}),
                                         synthetic_samples({0: {"mem_used": 0.4 * H200_MEM_TOTAL_MIB}}),
                                         "synthetic_offload"),
    # SYNTHETIC: the same weight-sync share without offload: no knob left.
    "weight_sync_plain": lambda: _case(synthetic_steps({"update_weights": 2.5, "gen": 1.0}),
                                       synthetic_samples({0: {}}), "synthetic"),
    # SYNTHETIC (the recordings have no PCIe counters): 58 GB/s host→GPU with offload on, memory at 40 %.
    "pcie_offload": lambda: _case(synthetic_steps(),
                                  synthetic_samples({0: {"pcie_rx": 58_000.0, "pcie_tx": 3_000.0,
                                                         "mem_used": 0.4 * H200_MEM_TOTAL_MIB}}),
                                  "synthetic_offload"),
    # SYNTHETIC: the same traffic without offload.
    "pcie_no_offload": lambda: _case(synthetic_steps(), synthetic_samples({0: {"pcie_rx": 58_000.0}}),
                                     "synthetic"),
    # SYNTHETIC: offload on, PCIe quiet (5 GB/s).
    "pcie_offload_quiet": lambda: _case(synthetic_steps(), synthetic_samples({0: {"pcie_rx": 5_000.0}}),
                                        "synthetic_offload"),
    # SYNTHETIC from issue 16's figures (tests/issue16_session.py): the ≈1.5B quickstart, then the lever crashed.
    "issue16_crashed": lambda: _issue16(crashed=True),
    # Real: h200-proof's colocate_async segment (steps 15–18: 8.7 / 12.6 / 7.9 / 14.2 s).
    "proof_async": lambda: _case(PROOF_STEPS[PROOF_STEPS["segment_id"] == 3], PROOF_SAMPLES, "proof_async"),
    "issue16": lambda: _issue16(crashed=False),
}


class Advised:
    """Each case's plan (on a one-GPU GAE plan whose model is a tiny local config, so verl's own validation runs
    offline) and the advisor's findings for it, computed once per test session."""

    def __init__(self, base: Plan):
        self.base = base

    @functools.cache
    def plan(self, plan_name: str) -> Plan:
        return self.base.with_changes(PLANS[plan_name])

    def knobs(self, name: str) -> dict:
        return self.plan(CASES[name]()["plan"]).knob_values()

    @functools.cache
    def findings(self, name: str) -> tuple[Finding, ...]:
        case = CASES[name]()
        return tuple(advise(case["steps"], case["samples"], self.knobs(name), procs=case["procs"],
                            record=case["record"]))

    def rules(self, name: str) -> list[str]:
        return [f.rule for f in self.findings(name)]

    def finding(self, name: str, rule: str) -> Finding:
        found = [f for f in self.findings(name) if f.rule == rule]
        assert found, f"{rule} did not fire on {name}: {self.rules(name)}"
        return found[0]


@pytest.fixture(scope="session")
def advised(tiny_model) -> Advised:
    return Advised(Plan.from_verl(runnable_overrides(tiny_model)))


RULE_NAMES = ("crash", "async-alternation", "rollout-bound", "critic-heavy", "actor-update-bound", "gpu-idle",
              "util-spread", "memory-headroom", "oom-risk", "weight-sync", "pcie-offload", "logprob-loop",
              "checkpointing-headroom", "gen-on-poll-grid")
FIRES = [("crash", "issue16_crashed"), ("async-alternation", "proof_async"), ("rollout-bound", "run"),
         ("rollout-bound", "fused_C"), ("critic-heavy", "critic_heavy"),
         ("critic-heavy", "critic_heavy_spare_gpu"), ("actor-update-bound", "actor_bound_fused"), ("gpu-idle", "B"),
         ("gpu-idle", "run"), ("util-spread", "spread_critic_gpu"), ("memory-headroom", "headroom"),
         ("memory-headroom", "fused_C"),         ("oom-risk", "oom_dynamic"), ("oom-risk", "oom_reserved_micro"), ("weight-sync", "weight_sync_offload"),
         ("weight-sync", "weight_sync_plain"), ("pcie-offload", "pcie_offload"),
         ("logprob-loop", "A"), ("logprob-loop", "fused_A"), ("logprob-loop", "B"), ("logprob-loop", "run"),
         ("checkpointing-headroom", "A"), ("checkpointing-headroom", "fused_A"),
         ("gen-on-poll-grid", "A"), ("gen-on-poll-grid", "fused_C"), ("gen-on-poll-grid", "fused_D")]
SILENT = [("crash", "issue16"), ("crash", "A"), ("async-alternation", "B"), ("async-alternation", "fused_C"),
          ("rollout-bound", "A"), ("rollout-bound", "B"), ("critic-heavy", "A"), ("critic-heavy", "B"),
          ("critic-heavy", "run"), ("actor-update-bound", "A"), ("actor-update-bound", "fused_A"),
          ("actor-update-bound", "B"), ("actor-update-bound", "run"), ("gpu-idle", "A"),
          ("util-spread", "spread_even"), ("util-spread", "A"), ("memory-headroom", "B"), ("memory-headroom", "A"),
          ("oom-risk", "B"), ("oom-risk", "headroom"), ("oom-risk", "fused_C"),
          ("weight-sync", "B"), ("pcie-offload", "pcie_no_offload"), ("pcie-offload", "pcie_offload_quiet"),
          ("logprob-loop", "fused_C"), ("logprob-loop", "fused_D"), ("logprob-loop", "actor_bound_fused"),
          ("checkpointing-headroom", "B"), ("checkpointing-headroom", "fused_C"),
          ("gen-on-poll-grid", "B"), ("gen-on-poll-grid", "headroom"), ("gen-on-poll-grid", "gen_overlapped")]


def test_every_rule_has_a_firing_and_a_silent_case():
    assert {rule for rule, _ in FIRES} == {rule for rule, _ in SILENT} == set(RULE_NAMES)
    assert len(RULES) == len(RULE_NAMES)


@pytest.mark.parametrize("rule,case", FIRES)
def test_rule_fires(rule, case, advised):
    advised.finding(case, rule)


@pytest.mark.parametrize("rule,case", SILENT)
def test_rule_stays_silent(rule, case, advised):
    assert rule not in advised.rules(case)


# ------------------------------------------------------------------------------------------------ what fired, in detail
def test_reference_run_is_rollout_bound_and_gets_colocate_async(advised):
    f = advised.finding("run", "rollout-bound")
    steps, _ = recording("run")
    later = steps[steps["step"] > 1]
    assert f.evidence["gen_share"] == pytest.approx(later["timing_s/gen"].sum() / later["timing_s/step"].sum())
    assert f.evidence["gen_share"] == pytest.approx(0.482, abs=0.001)
    assert f.change["trainer_mode"] == "colocate_async"
    # vLLM's KV cache at 0.4 of the H200 holds millions of tokens; 64 sequences × 512 tokens fill under 1 % of it:
    # more rollout memory can't keep more of them decoding at once, so none is proposed, and the finding says why.
    assert "rollout_gpu_memory" not in f.change
    assert f.evidence["kv_cache_tokens"] > 100 * f.evidence["kv_tokens_needed"] == 100 * 64 * 512
    assert "rollout memory stays at 0.4" in f.expected and "KV cache holds" in f.expected
    # Its prompts are at most 55 tokens (verl's prompt_length/max): 64 of them (3 520 tokens) prefill in one pass of
    # vLLM's 8 192 batched tokens. The 256-token limit once made the rule double them to 16 384: a rollout change
    # that bought nothing and made the restart rebuild the rollout engine.
    assert "rollout_max_batched_tokens" not in f.change
    # colocate_async shares the GPU with training: the offer quotes its measured pair mean (13.5 s against sync's
    # 14.0 s, H200 2026-12-02), not a short step of the pair (8.1 s until then, which read as a 40 % gain).
    assert "48%" in f.evidence_text and "13.5 s" in f.expected and "does not overlap training" in f.expected


def test_budgets_grow_into_the_trainers_headroom_though_generation_sets_the_gpu_peak(advised):
    """fused_C (H200, 2026-12-01): NVML peaked at 52 % of the GPU in generation (vLLM's 0.4 share), which no token
    budget touches; the trainer reserved at most 68.4 GiB (49 %). Its budgets (16 384 / 32 768) grow, sized by the
    memory model so that the predicted peak, band included, stays under 80 % of the GPU."""
    f = advised.finding("fused_C", "memory-headroom")
    assert f.evidence["peak_memory_share"] > 0.5 > f.evidence["trainer_peak_share"] > 0.45
    assert "the trainer reserved at most 68.4 of 140.4 GiB" in f.evidence_text, f.evidence_text
    knobs = advised.knobs("fused_C")
    assert f.change and all(value > knobs[k] for k, value in f.change.items())
    case = CASES["fused_C"]()
    m = measurements(case["steps"], case["samples"], knobs)
    predicted = m.predicted(f.change)
    assert predicted.memory.upper_gib < 0.8 * predicted.mem_total_gb and predicted.step_s < m.cost.step_s


def test_budgets_stay_where_the_trainer_itself_used_over_half_the_gpu(advised):
    """B (H200, 2026-11-30): the trainer reserved 79.0 GiB of 140 (56 %): no headroom rule speaks."""
    assert "memory-headroom" not in advised.rules("B")


def test_the_kv_cache_size_is_what_vllm_logged():
    """vLLM 0.24 on the H200 (bench/results/h200_2026-12-02/campaign_logs.tar.gz, segment-1.log), the 0.5B shape
    at gpu_memory_utilization 0.4: "Available KV cache memory: 53.66 GiB", "GPU KV cache size: 4,689,264 tokens"."""
    from workbench.memory import KNOWN_SHAPES, kv_cache_tokens

    knobs = {"rollout_gpu_memory": 0.4, "rollout_max_batched_tokens": None, "rollout_tp": 1}
    tokens = kv_cache_tokens(knobs, KNOWN_SHAPES["qwen2.5-0.5b"], H200_MEM_TOTAL_MIB / 1024)
    assert tokens == pytest.approx(4_689_264, rel=0.05)


def test_rollout_memory_grows_only_as_far_as_the_kv_cache_needs(advised):
    """SYNTHETIC: the reference run's measurements read as if its plan had given vLLM 0.05 of the GPU and asked for
    4 096-token responses: 64 × 4 352 tokens are more than half of what that KV cache holds, so rollout memory
    grows, to the smallest share whose cache holds twice that (the estimate's margin), and no further."""
    from workbench.advice.generation import rollout_bound
    from workbench.memory import kv_cache_tokens

    case = CASES["run"]()
    knobs = {**advised.knobs("run"), "max_response_length": 4096, "rollout_gpu_memory": 0.05}
    m = measurements(case["steps"], case["samples"], knobs)
    f = rollout_bound(m)
    raised, needed = f.change["rollout_gpu_memory"], 64 * (256 + 4096)
    shape, total = m.predicted({}).memory.shape, m.cost.mem_total_gb

    def cache(share):
        return kv_cache_tokens({**knobs, **f.change, "rollout_gpu_memory": share}, shape, total)
    assert f.evidence["kv_tokens_needed"] == needed and f.evidence["kv_cache_tokens"] < 2 * needed
    assert raised > 0.05 and cache(raised) >= 2 * needed > cache(round(raised - 0.05, 2))
    assert m.predicted(f.change).memory.upper_gib < 0.8 * total
    assert "KV cache" in f.expected


@pytest.mark.parametrize("case", ["A", "fused_A"])
def test_quickstart_gets_fused_kernels_and_what_goes_with_them(case, advised):
    f = advised.finding(case, "logprob-loop")
    assert f.severity == "high" and advised.findings(case)[0] is f
    assert max(f.evidence["actor_mfu"]) < 0.02 and f.evidence["remove_padding"] is False
    # Memory peaked near 52 % (below 60 %): checkpointing goes too, and the fused run's budgets come with it.
    assert f.change == {"fused_kernels": True, "use_dynamic_bsz": True,
                        **new_values(FUSED_BUDGETS, advised.knobs(case)), "gradient_checkpointing": False}
    assert "logprobs_from_logits_v2" in f.evidence_text and "3.9–4.6 s" in f.expected
    # The plan the finding proposes is what ran as C on 2026-12-01: its predicted step is C's measured one ± 15 %.
    steps, _ = recording("fused_C")
    measured = steps.loc[steps["step"] > 1, "timing_s/step"].median()
    assert f.evidence["predicted_step_s"] == pytest.approx(measured, rel=0.15)
    assert f.evidence["predicted_gpu_peak_share"] < 0.9


def test_the_fused_run_is_generation_bound_next(advised):
    assert "logprob-loop" not in advised.rules("fused_C")
    f = advised.finding("fused_C", "rollout-bound")
    assert f.evidence["gen_share"] == pytest.approx(0.45, abs=0.01)
    assert f.change["trainer_mode"] == "colocate_async" and "Predicted for this segment" in f.expected


def test_loop_bound_actor_keeps_checkpointing_when_dropping_it_would_not_fit(advised):
    f = advised.finding("loop_little_room", "logprob-loop")
    assert f.change == {"fused_kernels": True, "use_dynamic_bsz": True,
                        **new_values(FUSED_BUDGETS, advised.knobs("loop_little_room"))}
    assert f.evidence["predicted_gpu_peak_share"] < 0.95


def test_actor_update_bound_without_the_loop_still_gets_batching(advised):
    f = advised.finding("actor_bound_fused", "actor-update-bound")
    assert f.change["actor_token_budget"] > 8192


def test_gen_on_the_poll_grid_proposes_nothing_and_says_the_runner_fixes_it(advised):
    f = advised.finding("fused_C", "gen-on-poll-grid")
    assert f.change == {} and max(f.evidence["seconds_past_grid"]) < 0.25
    assert f"polls every {REPLAY_POLL_S} s" in f.expected and "/" not in f.expected  # a measurement, no path


def test_checkpointing_off_is_proposed_only_with_room(advised):
    f = advised.finding("A", "checkpointing-headroom")
    assert f.change == {"gradient_checkpointing": False}
    assert f.evidence["predicted_step_s"] < recording("A")[0]["timing_s/step"].iloc[1:].median()


def test_lora_critic_predicted_slower_is_not_proposed(advised):
    f = advised.finding("fused_C", "critic-heavy")
    assert f.change == {} and "slower" in f.expected


def test_no_finding_proposes_a_knob_that_changes_the_algorithm(advised):
    for name in CASES:
        for f in advised.findings(name):
            assert not set(f.change) & set(ALGORITHM_KNOBS), (name, f.rule)


def test_tuned_plan_idles_a_fifth_of_the_time(advised):
    f = advised.finding("B", "gpu-idle")
    assert f.evidence["idle_share"] == pytest.approx(0.219, abs=0.001)
    assert f.change == {"trainer_mode": "colocate_async"}
    assert advised.rules("B") == ["logprob-loop", "gpu-idle"]
    assert advised.rules("A") == ["logprob-loop", "checkpointing-headroom", "gen-on-poll-grid"]


def test_critic_heavy_proposes_lora_or_the_spare_gpu(advised):
    lora = advised.finding("critic_heavy", "critic-heavy")
    assert lora.evidence["critic_to_actor"] == pytest.approx(3.0 / 4.0)
    # The only measurement of a LoRA critic (H200, 0.5B) made update_critic 3.5× slower: not proposed, said why.
    assert lora.change == {} and "predicted to make the step slower" in lora.expected
    spare = advised.finding("critic_heavy_spare_gpu", "critic-heavy")
    assert spare.change == {"gpus": [0, 1], "critic_gpus": 1}
    assert spare.evidence["spare_gpus"] == [1]


def test_spread_names_the_idle_gpu_and_its_role(advised):
    f = advised.finding("spread_critic_gpu", "util-spread")
    assert f.evidence["idlest_gpu"] == 1 and f.evidence["idlest_role"] == "critic"
    assert f.evidence["spread_points"] == pytest.approx(75.0)
    assert f.change == {"critic_gpus": 0}
    assert "GPU 1 (critic) 5%" in f.evidence_text


def test_headroom_grows_budgets_sized_from_memory_per_token(advised):
    # SYNTHETIC memory at 30 %, nothing recorded about the model: the memory model (the 0.5B shape assumed) sizes
    # the growth so that the predicted peak, band included, stays under 80 % of the GPU.
    f = advised.finding("headroom", "memory-headroom")
    before = {"actor_token_budget": 8192, "logprob_token_budget": 16384, "ref_token_budget": 16384,
              "critic_token_budget": 16384}
    assert f.change and all(f.change[k] > before[k] and f.change[k] % 1024 == 0 for k in f.change)
    assert "ref_token_budget" not in f.change  # no reference policy runs: its budget makes no batch fuller
    case = CASES["headroom"]()
    m = measurements(case["steps"], case["samples"], advised.knobs("headroom"))
    grown = m.predicted(f.change)
    assert grown.memory.upper_gib < 0.8 * H200_MEM_TOTAL_MIB / 1024 <= m.predicted(
        {k: 2 * v for k, v in f.change.items()}).memory.upper_gib
    assert f.evidence["predicted_gpu_peak_gib"] == pytest.approx(grown.gpu_peak_gb)
    assert "2026-11-30" in f.expected and "≈ 15 % shorter" in f.expected


def test_oom_risk_lowers_budgets_or_micro_batches(advised):
    budgets = advised.finding("oom_dynamic", "oom-risk")
    assert budgets.severity == "high" and advised.findings("oom_dynamic")[0] is budgets  # most severe first
    assert budgets.change["actor_token_budget"] < 8192 and budgets.change["logprob_token_budget"] < 16384
    micro = advised.finding("oom_reserved_micro", "oom-risk")
    assert micro.evidence["reserved_share"] == pytest.approx(137.0 / (H200_MEM_TOTAL_MIB / 1024))
    # verl 0.9.1's critic packs by tokens whatever use_dynamic_bsz says (knobs.batching_knobs_read): the relief for
    # a critic at 137 GiB is its token budget; its micro-batch size, never read, is left alone.
    critic_budget = advised.knobs("oom_reserved_micro")["critic_token_budget"]
    assert micro.change == {"actor_micro_batch": 2, "logprob_micro_batch": 4, "ref_micro_batch": 2,
                            "critic_token_budget": micro.change.get("critic_token_budget")}
    assert micro.change["critic_token_budget"] < critic_budget


def test_weight_sync_proposes_a_knob_only_where_one_exists(advised):
    offload = advised.finding("weight_sync_offload", "weight-sync")
    assert offload.evidence["update_weights_share"] == pytest.approx(0.25)
    assert offload.change == {"actor_param_offload": False}
    plain = advised.finding("weight_sync_plain", "weight-sync")
    assert plain.change == {} and plain.expected.startswith("No knob change proposed")


def test_pcie_saturation_turns_offload_off(advised):
    f = advised.finding("pcie_offload", "pcie-offload")
    assert f.evidence["pcie_rx_p90_mb_s"] == 58_000.0
    assert f.change == {"actor_param_offload": False, "actor_optimizer_offload": False}


# ------------------------------------------------------------------------------------------------ evidence hygiene
def test_warmup_step_is_left_out_and_said_so(advised):
    f = advised.finding("run", "rollout-bound")
    assert f.evidence["warmup_step_excluded"] == 1 and f.evidence["steps"] == [2, 3, 4]
    assert len(f.evidence["gen_s"]) == 3
    assert "step 1 left out as warm-up" in f.evidence_text


def test_a_slow_first_step_alone_fires_nothing(advised):
    # SYNTHETIC: only the warm-up step is rollout-heavy.
    steps = synthetic_steps()
    steps.loc[0, "timing_s/gen"] = 9.0
    assert "rollout-bound" not in [f.rule for f in advise(steps, synthetic_samples({0: {}}), advised.knobs("headroom"))]


def test_too_few_steps_after_the_first_fire_nothing(advised):
    steps, samples = recording("run")
    assert advise(steps[steps["step"] <= 2], samples, advised.knobs("run")) == []
    assert advise(steps[steps["step"] <= 3], samples, advised.knobs("run")) != []


def test_unmeasured_columns_fire_nothing(advised):
    steps, samples = recording("A")
    blank_steps = steps.assign(**{c: np.nan for c in steps.columns if c.startswith(("timing_s/", "perf/"))})
    blank_samples = samples.assign(**{c: np.nan for c in SAMPLE_COLUMNS if c not in ("t", "node", "gpu")})
    assert advise(blank_steps, blank_samples, advised.knobs("A")) == []
    assert [f.rule for f in advise(steps, samples.iloc[0:0], advised.knobs("A"))] == ["logprob-loop",
                                                                                       "gen-on-poll-grid"]
    # Without memory readings the kernels come with the fused run's budgets and checkpointing is left alone.
    assert advise(steps, None, advised.knobs("A"))[0].change == {"fused_kernels": True, "use_dynamic_bsz": True,
                                                                 **new_values(FUSED_BUDGETS, advised.knobs("A"))}


def test_newest_segment_by_default_or_the_one_asked_for(advised):
    run_steps, run_samples = recording("run")
    a_steps, a_samples = recording("A")
    steps = pd.concat([run_steps, a_steps.assign(segment_id=2, step=a_steps["step"] + 4)], ignore_index=True)
    samples = pd.concat([run_samples, a_samples], ignore_index=True)
    newest = advise(steps, samples, advised.knobs("A"))
    assert [f.rule for f in newest] == ["logprob-loop", "checkpointing-headroom", "gen-on-poll-grid"]
    assert newest[0].evidence["warmup_step_excluded"] == 5
    first = advise(steps, samples, advised.knobs("run"), segment_id=1)
    assert [f.rule for f in first] == ["logprob-loop", "rollout-bound", "gpu-idle", "checkpointing-headroom",
                                       "gen-on-poll-grid"]


def test_evidence_is_json_and_texts_are_sentences(advised):
    for name in CASES:
        for f in advised.findings(name):
            json.dumps(f.evidence)
            assert f.severity in ("high", "medium", "low") and f.title and f.expected.endswith(".")


def test_thresholds_each_say_why():
    assert all(len(threshold.why) > 40 and not math.isnan(threshold.value) for threshold in THRESHOLDS.values())


# ------------------------------------------------------------------------------------------------ proposals are valid
def test_every_proposed_change_is_a_valid_plan(advised):
    proposals = {(CASES[name]()["plan"], json.dumps(f.change, sort_keys=True))
                 for name in CASES for f in advised.findings(name) if f.change}
    for plan_name, change in sorted(proposals):
        assert set(json.loads(change)) <= set(KNOBS), change
        advised.plan(plan_name).with_changes(json.loads(change)).validate()
    assert len(proposals) >= 10


# ------------------------------------------------------------------------------------------------ frame and session
def test_findings_frame(advised):
    frame = findings_frame(list(advised.findings("run")))
    assert list(frame.columns) == list(FINDING_COLUMNS) and len(frame) == 5
    assert frame.set_index("rule").loc["rollout-bound", "change"]["trainer_mode"] == "colocate_async"
    assert list(findings_frame([]).columns) == list(FINDING_COLUMNS)


def test_apply_finding_hands_the_change_to_the_session(advised):
    class FakeSession:
        applied = []

        def apply(self, change, wait=False):
            self.applied.append(change)
            return "queued"

    f = advised.finding("A", "logprob-loop")
    session = FakeSession()
    assert Session.apply_finding(session, f) == "queued" and session.applied == [f.change]
    with pytest.raises(ValueError, match="no knob change"):
        Session.apply_finding(session, advised.finding("weight_sync_plain", "weight-sync"))


def test_session_advice_reads_the_store_and_the_plan(tmp_path, advised):
    steps, samples = recording("A")
    store = Store(tmp_path)
    segment = store.begin_segment(advised.plan("A").to_json())
    for row in steps.to_dict("records"):
        store.add_step(segment, row.pop("step"), {k: v for k, v in row.items() if k not in ("segment_id", "t")},
                       t=row["t"])
    store.add_samples(samples.to_dict("records"))
    store.close()
    session = Session(tmp_path)
    assert session.knob_values()["actor_micro_batch"] == 4
    advice = session.advice()
    assert list(advice["rule"]) == ["logprob-loop", "checkpointing-headroom", "gen-on-poll-grid"]
    assert advice.loc[0, "change"] == advised.finding("A", "logprob-loop").change
    assert [f.rule for f in session.advice_findings(segment_id=segment)][0] == "logprob-loop"


def test_colocate_async_alternation_is_named_with_its_pair_mean(advised):
    f = advised.finding("proof_async", "async-alternation")
    steps = f.evidence["step_s"]
    assert [round(s, 1) for s in steps] == [8.7, 12.6, 7.9, 14.2]  # h200-proof, steps 15–18
    assert f.change == {} and f.evidence["pair_mean_s"] == pytest.approx(sum(steps) / 4)
    assert "mean of a pair" in f.expected and "1 × H200, 2026-12-01" in f.expected
    assert f"mean of a pair, {sum(steps) / 4:.1f} s here" in f.expected
    assert not any(path in f.expected for path in ("tests/", ".py", "recordings"))  # measurements, not paths


def test_a_range_whose_ends_read_the_same_is_said_as_one_value():
    """Issue 15: a card said "Actor MFU 2.0%–2.0%"."""
    from workbench.advice.core import value_range

    assert value_range(pd.Series([0.0201, 0.0199]), ".1%") == "2.0%"
    assert value_range(pd.Series([0.013, 0.018]), ".1%") == "1.3%–1.8%"
    assert value_range(pd.Series([38.3, 40.9]), ".1f", " s") == "38.3–40.9 s"


def test_batched_tokens_grow_only_as_far_as_the_measured_prompts_need(advised):
    """The same rule where the prompts do fill more than vLLM's batched tokens: sized by their measured longest."""
    from workbench.advice.core import measurements
    from workbench.advice.generation import rollout_bound

    steps, samples = recording("run")
    knobs = advised.knobs("run")
    long_prompts = steps.assign(**{"prompt_length/max": 200.0})  # SYNTHETIC: the run's steps with longer prompts
    f = rollout_bound(measurements(long_prompts, samples, knobs, segment_id=1))
    assert f.change["rollout_max_batched_tokens"] == min(64 * 200, 2 * knobs["rollout_max_batched_tokens"])
    assert "12,800 tokens at their longest" in f.expected
