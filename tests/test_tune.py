"""The live tuner against a replay of the recorded quickstart session (tests/replay_fixture.py: segments A, B a
restart away, A_hot a hot change away). A replay can only apply plans it has a recorded segment for, so the tests
tune over those: the hot neighbour (tried live, no restart) and the tuned plan B (a restart); a plan the recording
never ran is refused by the replay and must come back as a failed trial, not an error."""

from __future__ import annotations

import json
import time

import optuna
import pytest

from tests.replay_fixture import HOT_NEIGHBOUR_BUDGET
from workbench import verl_config
from workbench.session import ReadOnlySession, Session
from workbench.tune import STUDY_FILE, grid, tune

TIMEOUT = 120.0
# Recorded seconds per second: A's ~50–60 s steps take ~5 s, room for the supervisor to validate and relay a change
# (~2.5 s on a loaded 2-core machine) before the step it should follow has ended.
SPEED = 10
# verl's recorded start-up (3–5 minutes before a segment's first step) in a second: only the steps' pace matters here.
STARTUP_SPEED = 400


def wait(session: Session, predicate, timeout: float = TIMEOUT) -> None:
    deadline = time.time() + timeout
    while not predicate(session):
        assert time.time() < deadline, f"timed out in state {session.state}"
        time.sleep(0.1)


def end(session: Session) -> None:
    if session.state not in ("stopped", "finished", "failed", "lost"):
        session.stop(now=True)


def test_grid_takes_values_or_derives_them():
    values = {"actor_token_budget": 4096, "fused_kernels": False, "fused_kernel_backend": "torch"}
    assert grid({"actor_token_budget": [8192]}, values) == [{}, {"actor_token_budget": 8192}]
    assert grid(["fused_kernels", "actor_token_budget"], values) == [
        {}, {"actor_token_budget": 2048}, {"actor_token_budget": 8192}, {"fused_kernels": True},
        {"fused_kernels": True, "actor_token_budget": 2048}, {"fused_kernels": True, "actor_token_budget": 8192}]
    with pytest.raises(ValueError, match="unknown knobs: nope"):
        grid({"nope": [1]}, values)


@pytest.mark.slow
def test_hot_trial_runs_live_and_the_best_plan_stays_in_force(recording, recorded_plans, home):
    verl_config.warm()  # this process's plan checks import verl now, not while the replay's steps run
    session = Session.replay(recording, speed=SPEED, follow=False, startup_speed=STARTUP_SPEED)
    try:
        # Two steps a trial: the recorded segments hold four steps each, and each change lands one step boundary
        # after the tuner asks for it (as in a live run), so the put-back of the best plan still finds steps to run.
        result = tune(session, knobs={"actor_token_budget": [HOT_NEIGHBOUR_BUDGET]}, steps_per_trial=2,
                      max_trials=2, timeout_s=TIMEOUT)
        trials = result.trials
        assert list(trials["state"]) == ["COMPLETE", "COMPLETE"], trials[["state", "reason"]]
        assert list(trials["mode"]) == ["baseline", "hot"]
        baseline, hot = trials.iloc[0], trials.iloc[1]
        # The baseline's first step was start-up work: its measured steps are the recording's steps 2 and 3.
        assert baseline["steps"] == [2, 3] and baseline["step_time_s"] == pytest.approx((49.49 + 57.06) / 2, abs=0.01)
        # The hot trial ran in the same process: a new segment whose first step counts (no restart to leave out).
        assert hot["segment_id"] == baseline["segment_id"] + 1 and len(hot["steps"]) == 2
        assert hot["steps"][0] > baseline["steps"][-1]
        assert hot["step_time_s"] > baseline["step_time_s"]
        assert result.best == {"actor_token_budget": recorded_plans["A"].knob_values()["actor_token_budget"]}
        wait(session, lambda s: s.plan.knob_values()["actor_token_budget"] == result.best["actor_token_budget"])

        study = optuna.load_study(study_name=result.study_name, storage=result.storage)
        assert result.storage == f"sqlite:///{session.dir / STUDY_FILE}"
        assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]
        assert study.best_trial.number == 0 and study.trials[1].params == {"actor_token_budget": HOT_NEIGHBOUR_BUDGET}
        assert study.trials[1].user_attrs["mode"] == "hot"
    finally:
        end(session)


PROOF_BUDGETS = ("actor_token_budget", "logprob_token_budget", "ref_token_budget", "critic_token_budget")
PROOF_SPEED = 4  # h200-proof's ~12 s steps take ~3 s; its first segment has 9 steps, ~24 s after the baseline


@pytest.mark.slow
def test_hot_first_then_restarts_and_a_predicted_oom_is_never_run(home):
    """On the bundled h200-proof recording (the workbench's own sampler: GPU memory totals are known). Its first
    segment ran token budgets of 4 096 and its second, a hot change away, 32 768; no segment ran fused kernels."""
    verl_config.warm()  # this process's plan checks import verl now, not while the replay's steps run out
    session = Session.replay("h200-proof", speed=PROOF_SPEED, follow=False, startup_speed=STARTUP_SPEED)
    try:
        session.wait_for_step(1, timeout=TIMEOUT)
        recorded_hot = dict.fromkeys(PROOF_BUDGETS, 32768)
        # The rollout engine's share past what the GPU holds beside the trainer (budgets past a whole mini batch,
        # 32 prompts × 256 + 256 here, would not grow any micro batch).
        huge = {"rollout_gpu_memory": 0.95}
        # Fused kernels are hot since issue 17; with CUDA graphs on (a rollout setting) the change is restart-class.
        fused = {"fused_kernels": True, "rollout_enforce_eager": False}
        # Nothing measured yet: each candidate is predicted when its turn comes, after the baseline's two steps.
        result = tune(session, candidates=[fused, huge, recorded_hot], steps_per_trial=2, max_trials=4,
                      timeout_s=TIMEOUT)
        trials = result.trials.set_index(result.trials["change"].map(lambda c: json.dumps(c, sort_keys=True)))
        assert list(trials["mode"]) == ["baseline", "hot", "restart", "restart"], trials[["mode", "state", "reason"]]
        baseline, oom, hot, restart = (trials.loc[json.dumps(c, sort_keys=True)] for c in ({}, huge, recorded_hot,
                                                                                           fused))
        assert baseline["state"] == "COMPLETE"
        assert oom["state"] == "PRUNED" and "out of memory predicted" in oom["reason"]  # never applied
        assert oom["predicted_gpu_peak_share"] > 0.95 > hot["predicted_gpu_peak_share"]
        assert hot["state"] == "COMPLETE", hot["reason"]
        assert hot["segment_id"] == baseline["segment_id"] + 1
        # The restart-class candidate came last, with a predicted gain; the replay refuses a plan never recorded
        # at once (its preview): never applied.
        assert restart["predicted_step_s"] < baseline["step_time_s"]
        assert restart["state"] == "PRUNED" and "no recorded segment" in restart["reason"]
        assert not any("0.95" in json.dumps(c["payload"]) for c in session._store.rows("commands"))
    finally:
        end(session)


def test_changes_to_the_algorithm_need_consent(recording):
    viewer = Session(recording, read_only=True)  # refused before anything touches the session
    with pytest.raises(ValueError, match="rollout_logprob_bypass change"):
        tune(viewer, knobs={"rollout_logprob_bypass": [True]})


def test_a_read_only_session_cannot_tune(recording):
    with pytest.raises(ReadOnlySession):
        tune(Session(recording, read_only=True), candidates=[{"actor_token_budget": HOT_NEIGHBOUR_BUDGET}])


@pytest.mark.slow
def test_an_ended_session_ends_tuning_at_once(recording, home):
    session = Session.replay(recording, speed=2000, follow=False)  # the recorded run, over in seconds
    wait(session, lambda s: s.state == "finished")
    result = tune(session, candidates=[{"actor_token_budget": HOT_NEIGHBOUR_BUDGET}], timeout_s=TIMEOUT)
    assert result.ended_because == "the session is finished" and result.best is None
    assert list(result.trials["state"]) == ["FAIL", "PRUNED"]  # baseline not run; the change refused by preview
