"""The benchmark scripts run (marker `bench`): each CPU measure once in --quick mode (few repetitions, a small
synthetic store, a fast replay of the real recording h200-proof), and the GPU campaign's driver as a dry run on that
replay. These check that the scripts work and write well-formed results; they measure nothing (RULES: speed goals
are met in bench/, never in timed tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common import goal_met, result, write
from bench.measures import CPU_MEASURES, SOAK_MEASURES, Context, module
from bench.table import load, table

pytestmark = pytest.mark.bench

FIELDS = {"measure", "value", "unit", "goal", "goal_met", "machine", "gpu", "driver", "versions", "model_shape",
          "plan_overrides", "repetitions", "median", "spread", "details", "notes", "command"}


@pytest.fixture(scope="module")
def ctx():
    context = Context(machine="ci-quick", quick=True)
    yield context
    context.cleanup()


@pytest.mark.parametrize("name", [name for name in CPU_MEASURES if name not in SOAK_MEASURES])
def test_cpu_measure_runs_and_writes_a_full_result(name, ctx, tmp_path, home):
    res = module(name).run(ctx)
    assert FIELDS <= set(res)
    assert res["measure"] == name
    assert res["repetitions"], "every repetition is kept"
    assert isinstance(res["value"], (int, float))
    assert res["spread"]["n"] >= 1 and res["median"] is not None
    path = write(res, tmp_path)
    assert json.loads(path.read_text())["measure"] == name


def test_result_format_and_table(tmp_path):
    res = result("x_cost", value=3.0, unit="ms", goal="<= 5 ms", repetitions=[1, 3, {"value": 7, "case": "b"}],
                 machine="m1", env={"machine": "m1", "gpu": None, "driver": None, "versions": {"verl": "0.9.1"}})
    assert res["median"] == 3 and res["spread"]["min"] == 1 and res["spread"]["max"] == 7 and res["goal_met"] is True
    assert goal_met(6, "<= 5 ms") is False and goal_met(4.1, ">= 4") is True and goal_met(1, None) is None
    write(res, tmp_path / "m1")
    rows = load(tmp_path)
    assert [r["measure"] for r in rows] == ["x_cost"]
    assert "| m1 | x_cost | 3 ms | <= 5 ms | yes |" in table(rows)


def test_gpu_campaign_driver_dry_run_on_a_replay(tmp_path, home):
    """The driver on replays of the real recordings: h200-tuning for workload 1.5b (its fused lever, hot now), whose
    control restart a replay can't play (no recorded segment: the part fails, the next one runs), and h200-proof
    for 0.5b (its recorded restart-class change stands in for a restart round)."""
    from bench.gpu.campaign import Campaign

    out = tmp_path / "campaign"
    Campaign(out, replay=True, budget_s=600, steps_before=2, plain_steps=3, assets=tmp_path, machine="ci-replay").run()
    progress = (out / "progress.log").read_text()
    assert progress.rstrip().endswith("DONE")
    assert "== b the same plan restarted (control): restart vs cold, hot vs fresh: FAILED" in progress
    hot = json.loads((out / "results" / "hot_lever_1.5b.json").read_text())
    assert hot["notes"].startswith("DRY RUN ON A REPLAY") and hot["repetitions"]
    assert hot["details"]["changes"]["fused_kernels"] is True and hot["details"]["in_force_from_step"] == 4
    assert hot["details"]["boundaries_late"] == 0
    assert hot["details"]["applied_text"].startswith("replay: hot:")
    # per phase and step - gen beside the step time (generation varies; the lever does not touch it)
    assert hot["details"]["phase_s"]["update_actor"]["hot"] > 0 and hot["details"]["step_minus_gen_s"]["hot"] > 0
    restart = json.loads((out / "results" / "restart_vs_cold_0.5b.json").read_text())
    assert restart["value"] > 0 and restart["details"]["changes"]["trainer_mode"] == "colocate_async"
    sampler = json.loads((out / "results" / "sampler_ab_1.5b.json").read_text())
    assert [r["sampler"] for r in sampler["repetitions"]] == [False, True]  # a replay has few steps left
    assert (out / "recording.tar.gz").exists() and (out / "per_step_1.5b.csv").exists()


def test_gpu_campaign_generates_every_asset_set_in_a_process_of_its_own(tmp_path, monkeypatch):
    """On the H200 the 1.5B set, generated in the campaign's process while a thread of it generated the 0.5B set,
    failed at `from transformers import PreTrainedTokenizerFast`; on the GPU it would also have kept CUDA memory in
    the process that then measures. Both go through generate_assets_apart (the 1.5B one on the GPU), never in-process."""
    from bench.gpu.campaign import WORKLOADS, Campaign
    from workbench.assets import generate as generate_module

    def in_process(*args, **kwargs):
        raise AssertionError("generate_assets ran in the campaign's own process")

    apart = []

    def generate_apart(out_dir, **recipe):
        apart.append((Path(out_dir).name, recipe["shape"], recipe["device"]))
        return {"shape": recipe["shape"], "reused": True}

    monkeypatch.setattr(generate_module, "generate_assets", in_process)
    monkeypatch.setattr(generate_module, "generate_assets_apart", generate_apart)
    campaign = Campaign(tmp_path / "out", replay=False, budget_s=60, steps_before=2, plain_steps=3,
                        assets=tmp_path / "assets", machine="ci")
    campaign.prepare_assets(WORKLOADS["0.5b"]).join(timeout=60)
    assert campaign.workload_assets(WORKLOADS["1.5b"])["shape"] == "qwen2.5-1.5b"
    assert apart == [("0.5b", "qwen2.5-0.5b", "cpu"), ("1.5b", "qwen2.5-1.5b", "cuda")]


def test_plain_overrides_replace_keys_instead_of_repeating_them():
    from bench.gpu.campaign import plain_overrides

    out = plain_overrides(["trainer.logger=[console]", "trainer.total_training_steps=60", "+critic.x=1", "a.b=2"], steps=7)
    keys = [o.split("=", 1)[0].lstrip("+") for o in out]
    assert len(keys) == len(set(keys))
    assert "trainer.total_training_steps=7" in out and "trainer.logger=[console,file]" in out and "a.b=2" in out


def test_overhead_figures_leave_gen_out_and_keep_every_step():
    """Real rows on both sides (the h200-proof recording's segment 2; plain verl's run B of 2026-11-30): the
    function's arithmetic, not an overhead figure (the plans differ)."""
    from pathlib import Path

    from bench.gpu.analysis import per_step, segment_steps
    from bench.gpu.campaign import overhead_figures
    from workbench.store import Store

    root = Path(__file__).parents[1]
    store = Store(root / "workbench" / "assets" / "recordings" / "h200-proof", readonly=True)
    tuned = segment_steps(per_step(store.frame("steps"), store.frame("samples")), 2)
    store.close()
    plain = [json.loads(x)["data"] for x in (root / "tests" / "data" / "h200_2026-11-30" / "B_metrics.jsonl").read_text().splitlines()][1:]
    fig = overhead_figures(tuned, plain)
    sess_rest = sorted(tuned["step_s"] - tuned["gen_s"])
    plain_rest = sorted(r["timing_s/step"] - r["timing_s/gen"] for r in plain)
    import statistics

    assert fig["ratio"] == pytest.approx(statistics.median(sess_rest) / statistics.median(plain_rest))
    assert fig["details"]["ran"] == {"session": len(tuned), "plain": len(plain)}
    assert len(fig["repetitions"]) == len(tuned) + len(plain)


def test_gpu_campaign_refuses_an_unknown_workload_in_words(tmp_path):
    from bench.gpu.campaign import Campaign

    with pytest.raises(ValueError, match=r"workloads \['7b'\]: choose from 1.5b, 0.5b"):
        Campaign(tmp_path, replay=True, budget_s=60, steps_before=2, plain_steps=3, assets=tmp_path, machine="x",
                 workloads=("0.5b", "7b"))
    assert not (tmp_path / "progress.log").exists()  # refused before anything was written


def test_gpu_campaign_refuses_unknown_parts_in_words(tmp_path):
    from bench.gpu.campaign import Campaign

    with pytest.raises(ValueError, match=r"parts 'hot': choose from all, restart, probe, overhead"):
        Campaign(tmp_path, replay=True, budget_s=60, steps_before=2, plain_steps=3, assets=tmp_path, machine="x",
                 parts="hot")


def test_probe_figures_time_each_rebuild_from_its_boundary_to_its_first_step():
    """SYNTHETIC stamps in inplace_probe.json's format (bench/gpu/inplace_probe.py): the arithmetic of the figures,
    including a rebuild that failed (no ratio for it) and the phases between stamps."""
    from bench.gpu.campaign import probe_figures

    t0 = 1000.0
    stamps = [["TaskRunner up", t0 + 20], ["TransferQueue ready", t0 + 40], ["trainer 1 ready", t0 + 150],
              ["agent loops ready", t0 + 170], ["trainer 1 done", t0 + 230],
              ["rebuild 2 (keep all: {}): checkpoint", t0 + 231], ["teardown (keep all)", t0 + 245],
              ["teardown done (1 actors killed, 1 GPU processes left)", t0 + 250],
              ["rebuild 2 (keep all: {}): trainer init", t0 + 250], ["rebuild 2 (keep all: {}): trainer ready", t0 + 280],
              ["rebuild 2 (keep all: {}): done", t0 + 330],
              ["rebuild 3 (keep none: {}): checkpoint", t0 + 331], ["failed: RuntimeError('x')", t0 + 340]]
    steps = [{"step": 1, "t": t0 + 200, "timing_s/step": 30.0}, {"step": 2, "t": t0 + 215, "timing_s/step": 15.0},
             {"step": 3, "t": t0 + 230, "timing_s/step": 15.0}, {"step": 4, "t": t0 + 300, "timing_s/step": 20.0},
             {"step": 5, "t": t0 + 315, "timing_s/step": 15.0}]
    data = {"process_start": t0, "stamps": stamps, "steps": steps, "error": "RuntimeError('x')",
            "rebuilds": [{"keep": "all", "change": {"a": 1}, "ok": True}, {"keep": "none", "change": {"b": 2}, "ok": False}]}
    fig = probe_figures(data)
    assert fig["cold_start_s"] == 200.0
    kept, failed = fig["rebuilds"]
    assert kept["boundary_to_first_step_s"] == 69.0 and kept["value"] == pytest.approx(69.0 / 200.0)
    assert kept["phases_s"] == {"rebuild 2 (keep all: {}): checkpoint ->": 14.0, "teardown (keep all) ->": 5.0,
                                "teardown done (1 actors killed, 1 GPU processes left) ->": 0.0,
                                "rebuild 2 (keep all: {}): trainer init ->": 30.0,
                                "rebuild 2 (keep all: {}): trainer ready ->": 20.0}
    assert kept["steps_after_s"] == [20.0, 15.0]
    assert "value" not in failed and fig["best_ratio"] == round(69.0 / 200.0, 3)
    assert fig["cold_phases_s"]["TransferQueue ready ->"] == 110.0


def test_overhead_ab_pools_the_alternating_runs_and_keeps_each_runs_medians():
    """SYNTHETIC rows in the shapes the campaign reads (a session's per-step frame, plain verl's file-logger data):
    the arithmetic of the alternating comparison."""
    import pandas as pd

    from bench.gpu.campaign import overhead_ab_figures

    def session(steps):
        return pd.DataFrame({"step": range(2, 2 + len(steps)), "step_s": [s for s, _ in steps],
                             "gen_s": [g for _, g in steps]})

    def plain(steps):
        return [{"training/global_step": i, "timing_s/step": s, "timing_s/gen": g}
                for i, (s, g) in enumerate(steps, start=2)]

    fig = overhead_ab_figures([session([(14.0, 6.0), (14.4, 6.0)]), session([(13.8, 5.6), (14.2, 6.0)])],
                              [plain([(16.0, 8.0), (16.2, 8.0)]), plain([(15.9, 8.1)])])
    assert fig["ratio"] == pytest.approx(8.2 / 8.0)  # medians of 8.0, 8.4, 8.2, 8.2 and of 8.0, 8.2, 7.8
    assert [(r["side"], r["steps"]) for r in fig["details"]["runs"]] == [
        ("session", 2), ("plain", 2), ("session", 2), ("plain", 1)]
    assert fig["details"]["runs"][1]["median_step_minus_gen_s"] == pytest.approx(8.1)
