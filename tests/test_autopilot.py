"""The autopilot against replays of SYNTHETIC recordings (tests/autopilot_recordings.py) whose segments are the
plans the advisor proposes: a faster change is kept, a slower one rolled back, a change slower than its predicted
band stops it; a crashed change is rolled back and never offered again, and the safer variant the advisor offers
after the crash is tried next. Every round is a segment, and the story is one table."""

from __future__ import annotations

import json
import threading
import time

import pandas as pd
import pytest

from tests import autopilot_recordings as recordings
from workbench.autopilot import STORY_COLUMNS, Autopilot
from workbench.knobs import KNOBS
from workbench.session import ReadOnlySession, Session

SPEED = 30  # recorded seconds per second: the quickstart's 60 s steps take 2 s
OPTIONS = dict(steps_per_round=2, budget_s=900, timeout_s=180)


@pytest.fixture(scope="module")
def keep_rollback_stop(tmp_path_factory, tiny_model):
    directory = tmp_path_factory.mktemp("autopilot") / "keep-rollback-stop"
    return directory, recordings.keep_rollback_stop(directory, tiny_model)


@pytest.fixture(scope="module")
def crash_then_safer(tmp_path_factory, tiny_model):
    directory = tmp_path_factory.mktemp("autopilot") / "crash-then-safer"
    return directory, recordings.crash_then_safer(directory, tiny_model)


def apply_class(change: dict) -> str:
    return "hot" if all(KNOBS[name].apply == "hot" for name in change) else "restart"


def end(session: Session) -> None:
    if session.state not in ("stopped", "finished", "failed", "lost"):
        session.stop(now=True)


def applied_changes(session: Session) -> list[dict]:
    return [json.loads(c["payload"]) if isinstance(c["payload"], str) else c["payload"]
            for c in session._store.rows("commands") if c["kind"] == "apply"]


def test_a_read_only_handle_cannot_start_the_autopilot(keep_rollback_stop):
    directory, _ = keep_rollback_stop
    with pytest.raises(ReadOnlySession):
        Session(directory, read_only=True).autopilot()


@pytest.mark.slow
def test_keeps_the_faster_change_rolls_back_the_slower_and_stops(keep_rollback_stop, home):
    directory, plan = keep_rollback_stop
    session = Session.replay(directory, speed=SPEED, follow=False)
    try:
        result = session.autopilot(max_rounds=4, **OPTIONS)
        story = result.story
        assert list(story.columns) == list(STORY_COLUMNS)
        assert list(story["outcome"]) == ["kept", "rolled back"], story[["outcome", "why"]]
        assert story.loc[0, "change"] == plan["lever"] and story.loc[1, "change"] == plan["overlap"]
        # Hot or restart-class as the knob table says (the fused lever is hot since issue 17): the autopilot takes both.
        assert story.loc[0, "rule"] == "logprob-loop" and story.loc[0, "mode"] == apply_class(plan["lever"])
        assert story.loc[1, "mode"] == apply_class(plan["overlap"]) == "restart"
        # Each round ran in a segment of its own; the kept one is the new baseline of the next round.
        assert story.loc[1, "segment_id"] > story.loc[0, "segment_id"] > result.before.segment_id
        assert story.loc[0, "measured_step_s"] == pytest.approx(20)
        assert story.loc[1, "baseline_step_s"] == pytest.approx(story.loc[0, "measured_step_s"])
        assert story.loc[1, "measured_step_s"] == pytest.approx(26)
        assert story.loc[1, "measured_step_s"] > story.loc[1, "predicted_high_s"]
        assert "slower than predicted" in result.ended_because and "model is off" in result.ended_because
        assert result.crashes == 0 and result.speedup == pytest.approx(3.0, rel=0.01)
        # The slower change was put back: the plan in force is round 1's.
        knobs = session.plan.knob_values()
        assert all(knobs[k] == v for k, v in plan["lever"].items())
        assert all(knobs[k] != v for k, v in plan["overlap"].items() if k == "trainer_mode")
    finally:
        end(session)


@pytest.mark.slow
def test_a_crashed_change_is_rolled_back_and_never_offered_again(crash_then_safer, home):
    directory, plan = crash_then_safer
    session = Session.replay(directory, speed=SPEED, follow=False)
    try:
        result = session.autopilot(max_rounds=2, **OPTIONS)
        story = result.story
        assert list(story["outcome"]) == ["crashed, rolled back", "kept"], story[["outcome", "why"]]
        assert story.loc[0, "change"] == plan["lever"] and "ran out of GPU memory" in story.loc[0, "why"]
        assert story.loc[1, "rule"] == "crash" and story.loc[1, "change"] == plan["safer"]
        assert result.crashes == 1 and result.ended_because == "the round budget (2) is spent"
        assert [c["changes"] for c in applied_changes(session)].count(plan["lever"]) == 1
        # After it: the crashed plan is still never offered, and the safer one is in force.
        for finding in session.advice_findings():
            assert finding.change != plan["lever"], finding.rule
        knobs = session.plan.knob_values()
        assert all(knobs[k] == v for k, v in plan["safer"].items())
    finally:
        end(session)


@pytest.mark.slow
def test_stop_ends_the_autopilot_and_the_story_says_so(keep_rollback_stop, home):
    directory, _ = keep_rollback_stop
    session = Session.replay(directory, speed=SPEED, follow=False)
    stop = threading.Event()
    rounds = []
    try:
        def on_round(story):
            rounds.append(len(story))
            stop.set()  # the operator presses Stop once round 1 is in the story

        result = session.autopilot(max_rounds=4, stop=stop, on_round=on_round, **OPTIONS)
        assert result.ended_because == "stopped by the operator" and rounds == [1] and result.rounds == 1
    finally:
        end(session)


@pytest.mark.slow
def test_the_gpu_script_dry_runs_against_a_replay(keep_rollback_stop, home, tmp_path):
    """bench/gpu/autopilot.py's `run`, as the campaign driver calls it, against a replay on the CPU: the result
    JSON (bench/common.py format) names the autopilot, its speedup, crashes, rounds, wall time, story and the memory
    model's predicted vs measured peaks per segment."""
    from bench.common import result, write
    from bench.gpu import autopilot as gpu

    directory, _ = keep_rollback_stop
    session = Session.replay(directory, speed=SPEED, follow=False)
    lines: list[str] = []
    try:
        session.wait_until(lambda s: gpu.first_measurement(s) is not None, timeout=180)
        report = gpu.run(session, max_rounds=3, deadline=time.time() + 600, log=lines.append, workload="synthetic",
                         save=lambda measure, **fields: write(result(measure, **fields), tmp_path))
    finally:
        end(session)
    saved = json.loads((tmp_path / "autopilot_synthetic.json").read_text())
    assert "autopilot" in saved["measure"] and saved["goal"] == ">= 5"
    assert saved["value"] == pytest.approx(3.0, rel=0.01) == report["speedup"]
    details = saved["details"]
    assert details["crashes"] == 0 and details["rounds"] == 2 and details["wall_s"] > 0
    assert [r["outcome"] for r in details["story"]] == ["kept", "rolled back"]
    assert details["before"]["step_s"] == pytest.approx(60) and details["after"]["step_s"] == pytest.approx(20)
    memory = {row["segment"].split("#")[1]: row for row in details["memory"]}
    assert memory and all("predicted_gpu_peak_gib" in row for row in memory.values())
    assert any("round 1: logprob-loop" in line and "kept" in line for line in lines)


# ------------------------------------------------------------------------------------------------ stop conditions
# A stand-in for Session's public API (the autopilot uses nothing else): one measured segment, findings as given,
# applies answered as given. SYNTHETIC: no run behind it.
class FakeHandle:
    def __init__(self, state: str, message: str = "", mode: str = "hot"):
        self.state, self.message, self.mode = state, message, mode

    def refresh(self):
        return self

    @property
    def done(self) -> bool:
        return True


class FakeSession:
    is_operator, id, failure = True, "fake", None

    def __init__(self, findings, apply_state: str = "refused", steps: int = 3, step_s: float = 10.0):
        import pandas as pd

        self.findings, self.apply_state, self.state = findings, apply_state, "running"
        self.applied: list[dict] = []
        self._steps = pd.DataFrame({"segment_id": 1, "step": range(1, steps + 1), "timing_s/step": step_s,
                                    "perf/throughput": 10_000.0 / step_s})
        self.plan = type("P", (), {"knob_values": staticmethod(lambda: {"fused_kernels": False})})()

    def steps(self):
        return self._steps

    def segments(self):
        import pandas as pd

        return pd.DataFrame({"id": [1]})

    def advice_findings(self, segment_id=None):
        return self.findings

    def preview(self, change):
        return type("Preview", (), {"ok": True, "problems": {}})()

    def predict(self, change):
        return None

    def apply(self, change):
        self.applied.append(change)
        return FakeHandle(self.apply_state, "not applied: no recorded segment")


def finding(rule: str, change: dict):
    from workbench.advisor import Finding

    return Finding(rule, rule, {}, "", change, "", "high")


def test_it_stops_when_nothing_applicable_is_left():
    result = Autopilot(FakeSession([finding("gen-on-poll-grid", {})]), budget_s=30).run()
    assert result.rounds == 0 and result.ended_because == "nothing applicable is left"
    assert result.before.step_s == 10.0 and result.speedup == 1.0  # nothing changed


def test_algorithm_changes_are_never_applied():
    session = FakeSession([finding("bypass", {"rollout_logprob_bypass": True})])
    result = Autopilot(session, budget_s=30).run()
    assert session.applied == [] and "bypass: changes the algorithm" in result.ended_because


def test_a_refused_change_is_a_round_and_is_not_tried_again():
    session = FakeSession([finding("logprob-loop", {"fused_kernels": True})])
    result = Autopilot(session, budget_s=30).run()
    assert session.applied == [{"fused_kernels": True}]  # once
    assert list(result.story["outcome"]) == ["refused"] and "no recorded segment" in result.story.loc[0, "why"]
    assert result.ended_because == "nothing applicable is left (logprob-loop: tried in this run)"


def test_the_time_budget_ends_the_wait_for_a_first_measurement():
    result = Autopilot(FakeSession([], steps=1), budget_s=0.5).run()
    assert result.before is None and result.ended_because.startswith("the time budget ran out while waiting")


class ScriptedSession(FakeSession):
    """SYNTHETIC, shaped like the H200's 1.5B round of 2026-12-01 (bench/results/h200_2026-12-01_lease3): each
    applied change opens a segment whose steps take the seconds the script gives (one value for all three steps, or
    the warm-up step's and the measured ones'); the prediction is as given (one for every round, or one per round)."""

    def __init__(self, findings, script: list, predicted: tuple[float, float] | list[tuple[float, float]],
                 step_s: float = 10.0):
        super().__init__(findings, apply_state="applied", step_s=step_s)
        self.script, self.predicted = list(script), predicted
        self._segments = [1]

    def segments(self):
        import pandas as pd

        return pd.DataFrame({"id": self._segments})

    def predict(self, change):
        step_s, high_s = self.predicted.pop(0) if isinstance(self.predicted, list) else self.predicted
        return type("Prediction", (), {"step_s": step_s, "step_range_s": (step_s - (high_s - step_s), high_s)})()

    def apply(self, change):
        import pandas as pd

        self.applied.append(change)
        segment, first = self._segments[-1] + 1, int(self._steps["step"].max()) + 1
        self._segments.append(segment)
        step_s = self.script.pop(0)
        step_s = pd.Series(step_s if isinstance(step_s, tuple) else (step_s,) * 3, dtype=float)
        self._steps = pd.concat([self._steps, pd.DataFrame({
            "segment_id": segment, "step": range(first, first + len(step_s)), "timing_s/step": step_s,
            "perf/throughput": 10_000.0 / step_s})], ignore_index=True)
        return FakeHandle("applied", f"hot: {change}")


def test_a_kept_change_slower_than_its_band_ends_the_run_and_counts_in_the_speedup():
    """On the H200 (1.5B) round 1 ran 57.3 -> 25.2 s a step, above its predicted band (22.4, at most 24.0): kept,
    and the autopilot stopped as it should; but its report said 1.00x, the plan of before the round, as if the kept
    change were not in force."""
    session = ScriptedSession([finding("logprob-loop", {"fused_kernels": True})], script=[4.4],
                              predicted=(3.9, 4.2))
    result = Autopilot(session, budget_s=30).run()
    assert list(result.story["outcome"]) == ["kept"] and "slower than predicted" in result.ended_because
    assert result.after.segment_id == 2 and result.after.step_s == pytest.approx(4.4)
    assert result.speedup == pytest.approx((10_000.0 / 4.4) / 1000.0)  # the kept segment's over the first's


# ------------------------------------------------------------------------------- the band against the step noise
# On the H200 (2026-12-02, bench/results/h200_2026-12-02) round 1 measured 14.41 and 14.56 s (mean 14.48 s) against
# a band up to 14.44 s: 0.3 % past its top, far inside a 2-step mean's own noise, and the autopilot stopped there.
TWO_FINDINGS = [finding("logprob-loop", {"fused_kernels": True}), finding("rollout-bound",
                                                                        {"trainer_mode": "colocate_async"})]
H200_ROUND_1 = (12.74, 14.44)  # predicted step and the band's top (autopilot_0.5b.json)


def test_step_noise_is_the_mean_s_standard_error_or_the_recorded_floor():
    from workbench.autopilot import STEP_NOISE_FLOOR, step_noise_s

    # Two close steps say less about the noise than the H200 recordings do: the floor holds.
    assert step_noise_s([14.41, 14.56]) == pytest.approx(STEP_NOISE_FLOOR * 14.485)
    assert 0.3 < step_noise_s([14.41, 14.56]) < 0.5
    # Two far-apart steps (the 1.5B round of 2026-12-01: 27.43 and 22.98 s) carry their own: |a - b| / 2.
    assert step_noise_s([27.43, 22.98]) == pytest.approx(2.225)
    # More steps, a smaller standard error (the floor shrinks as 1/sqrt(n) too).
    assert step_noise_s([14.5] * 4) == pytest.approx(STEP_NOISE_FLOOR * 14.5 * (2 / 4) ** 0.5)


def test_a_colocate_async_pair_is_one_sample_of_the_step_noise():
    """colocate_async alternates long and short steps by design (H200, 2026-12-02: 8.42 / 18.64 s): that difference
    is the plan's pattern, not noise; read as noise it would be ±5.1 s and no model error could show past it."""
    from workbench.autopilot import STEP_NOISE_FLOOR, step_noise_s

    pair = pd.Series([8.42, 18.64], index=[7, 8])
    assert step_noise_s(pair) == pytest.approx(abs(18.64 - 8.42) / 2)
    assert step_noise_s(pair, alternating=True) == pytest.approx(STEP_NOISE_FLOOR * 13.53)
    # Two pairs: the spread of their means (13.53 and 13.55 s here sits under the floor for four steps).
    assert step_noise_s([8.42, 18.64, 8.5, 18.6], alternating=True) == pytest.approx(
        STEP_NOISE_FLOOR * 13.54 * (2 / 4) ** 0.5)
    # Pair means 13.0 and 16.0 s: their standard deviation (2.12 s) over sqrt(2).
    assert step_noise_s([8.0, 18.0, 10.0, 22.0], alternating=True) == pytest.approx(1.5)


def test_a_colocate_async_round_is_judged_by_its_pair_mean_against_the_band():
    """The H200's colocate_async round (2026-12-02): 8.42 / 18.64 s, a pair mean of 13.53 s. Against the band the
    model of before gave it (11.0 s, at most 12.4 s) it is past the band by far more than a pair's noise: the run
    stops as the model being off; against today's (13.4 s, at most 15.3 s) it goes on."""
    rollout = [finding("rollout-bound", {"trainer_mode": "colocate_async"}), finding("memory-headroom",
                                                                                   {"actor_token_budget": 65536})]
    before = ScriptedSession(rollout, script=[(20.62, 8.42, 18.64)], predicted=[(11.0, 12.4)], step_s=14.0)
    result = Autopilot(before, max_rounds=2, budget_s=30).run()
    assert "slower than predicted" in result.ended_because, result.ended_because
    assert "13.5 s against at most 12.4 s + 0.4 s of step noise" in result.ended_because
    now = ScriptedSession(rollout, script=[(20.62, 8.42, 18.64), (13.0, 12.9, 13.1)],
                          predicted=[(13.4, 15.3), (12.9, 14.0)], step_s=14.0)
    result = Autopilot(now, max_rounds=2, budget_s=30).run()
    assert list(result.story["outcome"]) == ["kept", "kept"], result.ended_because


def test_a_round_past_its_band_by_less_than_its_step_noise_goes_on():
    session = ScriptedSession(TWO_FINDINGS, script=[(15.37, 14.41, 14.56), (12.0, 10.0, 10.2)],
                              predicted=[H200_ROUND_1, (9.0, 11.0)], step_s=42.6)
    result = Autopilot(session, max_rounds=2, budget_s=30).run()
    assert list(result.story["outcome"]) == ["kept", "kept"], result.ended_because
    assert result.ended_because == "the round budget (2) is spent"
    first = result.story.loc[0]
    assert first["measured_step_s"] > first["predicted_high_s"] and 0.3 < first["step_noise_s"] < 0.5
    assert "14.5 s against at most 14.4 s + 0.4 s of step noise" in first["why"], first["why"]
    assert session.applied == [{"fused_kernels": True}, {"trainer_mode": "colocate_async"}]


def test_a_round_whose_own_steps_spread_widely_is_judged_by_that_spread():
    """Shaped like the 1.5B round of 2026-12-01: 27.43 and 22.98 s (mean 25.2 s) against a band up to 24.0 s."""
    session = ScriptedSession(TWO_FINDINGS, script=[(25.82, 27.43, 22.98), (20.0, 18.0, 18.0)],
                              predicted=[(22.4, 24.0), (17.0, 19.0)], step_s=57.3)
    result = Autopilot(session, max_rounds=2, budget_s=30).run()
    assert list(result.story["outcome"]) == ["kept", "kept"], result.ended_because
    assert "25.2 s against at most 24.0 s + 2.2 s of step noise" in result.story.loc[0, "why"]


def test_a_round_far_outside_its_band_still_ends_the_run():
    session = ScriptedSession(TWO_FINDINGS, script=[(18.0, 16.9, 17.1)], predicted=[H200_ROUND_1], step_s=42.6)
    result = Autopilot(session, max_rounds=2, budget_s=30).run()
    assert list(result.story["outcome"]) == ["kept"] and len(session.applied) == 1
    assert "slower than predicted" in result.ended_because and "model is off" in result.ended_because
    assert "17.0 s against at most 14.4 s + 0.5 s of step noise" in result.ended_because, result.ended_because
    assert result.after.step_s == pytest.approx(17.0)  # the kept change is in force


def test_a_part_of_a_change_measured_slower_is_not_tried_next():
    """After colocate_async with batched tokens ran slower and was rolled back (a restart each way on the GPU), the
    gpu-idle finding's colocate_async alone is part of that change: not another restart on what was measured."""
    both = {"trainer_mode": "colocate_async", "rollout_max_batched_tokens": 16384}
    session = ScriptedSession([finding("rollout-bound", both), finding("gpu-idle", {"trainer_mode": "colocate_async"}),
                               finding("memory-headroom", {"actor_token_budget": 65536})],
                              script=[(20.0, 14.9, 15.1), (15.0, 14.5, 14.6), (14.0, 13.0, 13.2)],
                              predicted=[(13.5, 15.5), (13.7, 15.3)], step_s=14.7)
    in_force = {"fused_kernels": True, "trainer_mode": "sync", "rollout_max_batched_tokens": None,
                "actor_token_budget": 16384}
    session.plan = type("P", (), {"knob_values": staticmethod(lambda: dict(in_force))})()
    result = Autopilot(session, max_rounds=3, budget_s=30).run()
    assert list(result.story["rule"]) == ["rollout-bound", "memory-headroom"], result.story[["rule", "why"]]
    assert list(result.story["outcome"]) == ["rolled back", "kept"]
    assert "gpu-idle: part of round 1's change, measured slower" in result.ended_because, result.ended_because
    assert session.applied == [both, {"trainer_mode": "sync", "rollout_max_batched_tokens": None},
                               {"actor_token_budget": 65536}]
