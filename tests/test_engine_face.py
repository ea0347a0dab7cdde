"""The engine's face for views (API.md): preview, the apply handle, poll, samples in SQL, knob table, placement,
segments with their diffs, read-only attach.

Store-level tests write SYNTHETIC rows (made up here, said so where they are written) into a session directory that
no supervisor runs; the apply-path tests replay the assembled recording (tests/replay_fixture.py) under a real
supervisor process.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.replay_fixture import HOT_NEIGHBOUR_BUDGET, TUNED_CHANGES
from workbench import ApplyResult, Plan, PlanError, Session
from workbench import control as c
from workbench.knobs import KNOB_TABLE_COLUMNS
from workbench.handles import NO_CHANGE, ReadOnlySession, judge_change
from workbench.lifecycle import SessionKind
from workbench.store import SAMPLE_COLUMNS, Store

TIMEOUT = 90.0
SLOW = 50  # recorded seconds per second: about a second between replayed steps


def make_session_dir(directory: Path, plan: Plan, *, state: str = c.RUNNING, gpu_count: int = 1) -> Store:
    """A session directory as Session.start leaves it, with no supervisor behind it (a writer store returned)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / c.TOKEN_FILE).write_text("operator-token-of-a-test")
    store = Store(directory)
    store.set_meta(created=time.time(), initial_plan=plan.to_json(), state=state, kind="live", gpu_count=gpu_count)
    store.begin_segment(plan.to_json(), reason="start")
    return store


@pytest.fixture
def quiet(tmp_path, recorded_plans):
    """(operator Session, writer Store) on plan A of the recording, no supervisor."""
    store = make_session_dir(tmp_path / "quiet", recorded_plans["A"])
    yield Session(tmp_path / "quiet"), store
    store.close()


# ------------------------------------------------------------------------------------------------ preview
BAD_CHANGES = [  # (changes, the knob the problem is filed under)
    ({"actor_token_budget": 0}, "actor_token_budget"),
    ({"no_such_knob": 1}, "no_such_knob"),
    ({"use_dynamic_bsz": True, "actor_token_budget": 100}, "actor_token_budget"),
    ({"rollout_gpu_memory": 1.5}, "rollout_gpu_memory"),
    ({"trainer_mode": "fast"}, "trainer_mode"),
    ({"gpus": [0, 0]}, "gpus"),
    ({"gpus": [5]}, "gpus"),
    ({"train_batch_size": 100}, "train_batch_size"),
    ({"critic_gpus": 1}, "critic_gpus"),
    ({"rollout_tp": 2}, "rollout_tp"),
    ({"hybrid_switch": True}, "hybrid_switch"),
    ({"actor_micro_batch": "four"}, "actor_micro_batch"),
    ({"nccl_env": {"PATH": "/tmp"}}, "nccl_env"),
    (None, "plan"),
    ({}, "plan"),
]


def test_preview_files_each_problem_under_its_knob_and_queues_nothing(quiet):
    session, store = quiet
    assert len(BAD_CHANGES) >= 10
    for changes, knob in BAD_CHANGES:
        preview = session.preview(changes)
        assert not preview.ok and preview.mode is None and preview.diff == [], changes
        assert knob in preview.problems, (changes, preview.problems)
        with pytest.raises(PlanError) as caught:
            session.apply(changes, wait=False)
        assert knob in caught.value.problems, (changes, caught.value.problems)
    assert store.max_id("commands") == 0


def test_preview_says_hot_or_restart_and_the_diff_against_the_plan_in_force(quiet, recorded_plans):
    session, store = quiet
    before = recorded_plans["A"].knob_values()["actor_token_budget"]
    hot = session.preview({"actor_token_budget": HOT_NEIGHBOUR_BUDGET})
    assert hot.ok and hot.mode == "hot" and hot.problems == {}
    assert hot.diff[0] == {"knob": "actor_token_budget", "before": before, "after": HOT_NEIGHBOUR_BUDGET, "apply": "hot"}
    # verl's log-prob budgets follow the actor's through interpolations: the diff says what changes in effect.
    assert all(d["apply"] == "hot" and d["after"] == HOT_NEIGHBOUR_BUDGET for d in hot.diff)
    restart = session.preview(TUNED_CHANGES)
    assert restart.ok and restart.mode == "restart" and {d["knob"] for d in restart.diff} >= set(TUNED_CHANGES)
    same = session.preview({"actor_token_budget": before})
    assert not same.ok and same.problems == {"plan": NO_CHANGE}
    # The plan in force is the newest segment's: a change is judged against it, not against the first plan.
    store.begin_segment(recorded_plans["A_hot"].to_json(), reason="hot apply")
    assert not session.preview({"actor_token_budget": HOT_NEIGHBOUR_BUDGET}).ok
    assert store.max_id("commands") == 0


def test_an_ended_session_previews_no_change(tmp_path, recorded_plans):
    store = make_session_dir(tmp_path / "ended", recorded_plans["A"], state=c.FINISHED)
    preview = Session(tmp_path / "ended").preview({"actor_token_budget": HOT_NEIGHBOUR_BUDGET})
    assert not preview.ok and "finished" in preview.problems["plan"]
    store.close()


def test_apply_returns_a_queued_handle_at_once(quiet):
    session, store = quiet
    handle = session.apply({"actor_token_budget": HOT_NEIGHBOUR_BUDGET}, wait=False)
    assert isinstance(handle, ApplyResult)
    assert (handle.state, handle.mode, handle.changes, handle.step) == (
        "queued", "hot", {"actor_token_budget": HOT_NEIGHBOUR_BUDGET}, None)
    assert not handle.refresh().done and store.command(handle.command_id)["kind"] == c.APPLY
    # The supervisor's answers, as the handle reads them.
    store.finish_command(handle.command_id, c.ACCEPTED, {"mode": "hot", "changes": handle.changes}, final=False)
    assert handle.refresh().state == "accepted" and "next step boundary" in handle.message
    store.finish_command(handle.command_id, c.APPLIED, {"mode": "hot", "changes": handle.changes, "step": 7})
    assert handle.refresh().state == "applied" and handle.step == 7 and handle.done and "from step 7" in handle.message


# ------------------------------------------------------------------------------------------------ poll
def test_poll_is_one_query_and_names_what_changed(quiet):
    session, store = quiet
    viewer = Session(session.dir, read_only=True)
    first = viewer.poll()
    assert first.changed >= {"steps", "samples", "procs", "events", "segments", "commands", "meta"}
    assert first.state == c.RUNNING and first.last_step is None and first.since["steps"] == 0

    statements = []
    viewer._store._db.set_trace_callback(statements.append)
    quiet_poll = viewer.poll(first.cursor)
    viewer._store._db.set_trace_callback(None)
    assert len(statements) == 1 and quiet_poll.changed == frozenset() and quiet_poll.cursor == first.cursor

    step_id = store.add_step(1, 1, {"timing_s/step": 10.0})
    news = viewer.poll(quiet_poll.cursor)
    assert news.changed == {"steps"} and news.last_step == 1 and news.since["steps"] == 0
    assert viewer.steps(since_id=news.since["steps"])["id"].tolist() == [step_id]
    # SYNTHETIC sample and process rows.
    store.add_samples([{"t": time.time(), "node": "n", "gpu": 0, "util": 50.0}])
    store.add_procs([{"t": time.time(), "node": "n", "gpu": 0, "pid": 1, "role": "rollout", "mem_used": 1.0}])
    news = viewer.poll(news.cursor)
    assert news.changed == {"samples", "procs"} and news.since["steps"] == step_id
    store.set_meta(state=c.PAUSED)
    news = viewer.poll(news.cursor)
    assert news.changed == {"meta"} and news.state == c.PAUSED
    store.end_segment(1, "done")
    assert viewer.poll(news.cursor).changed == {"segments"}
    news = viewer.poll(news.cursor)
    command = store.put_command(c.PAUSE, {})
    news = viewer.poll(news.cursor)
    assert news.changed == {"commands"}
    store.finish_command(command, c.DONE)
    assert viewer.poll(news.cursor).changed == {"commands"}
    store.add_event(c.EV_TELEMETRY, "sampler on")
    assert viewer.poll(viewer.poll(news.cursor).cursor).changed == frozenset()
    viewer.close()


# ------------------------------------------------------------------------------------------------ samples
def write_synthetic_samples(store: Store, t0: float) -> None:
    """SYNTHETIC: two GPUs at 10 Hz for 10 s; GPU g's utilization is 50·g + (tenth of the second), power unset."""
    rows = [{"t": t0 + i / 10, "node": "n", "gpu": gpu, "util": 50.0 * gpu + i % 10, "mem_used": 1000.0 + i,
             "mem_total": 80000.0} for i in range(100) for gpu in (0, 1)]
    store.add_samples(rows)


def test_samples_are_aggregated_in_sql_per_bucket_and_gpu(quiet):
    session, store = quiet
    t0 = 1_000_000.0  # a whole number of seconds: buckets start at the whole seconds
    write_synthetic_samples(store, t0)
    buckets = session.samples(every_s=1.0)
    assert list(buckets.columns[:4]) == ["t", "node", "gpu", "n"]
    assert all(f"{m}_min" in buckets and f"{m}_max" in buckets for m in SAMPLE_COLUMNS[3:])
    assert len(buckets) == 20 and set(buckets["n"]) == {10}
    first = buckets[(buckets["gpu"] == 1) & (buckets["t"] == t0)].iloc[0]
    assert (first["util"], first["util_min"], first["util_max"]) == (54.5, 50.0, 59.0)
    assert first["mem_used_max"] == 1009.0 and math.isnan(first["power_w"])
    window = session.samples(window_s=3.0, every_s=1.0, gpus=[0])
    assert set(window["gpu"]) == {0} and window["t"].min() >= t0 + 6 and window["t"].max() == t0 + 9
    only = session.samples(every_s=2.0, metrics=["util"])
    assert list(only.columns) == ["t", "node", "gpu", "n", "util", "util_min", "util_max"] and set(only["n"]) == {20}
    with pytest.raises(ValueError, match="unknown sample metrics"):
        session.samples(every_s=1.0, metrics=["utilisation"])
    assert len(session.samples(window_s=3.0, gpus=[1])) == 30  # raw rows of the window
    assert len(session.samples()) == 200
    latest = session.latest_samples()
    assert latest["gpu"].tolist() == [0, 1] and set(latest["t"]) == {t0 + 9.9}


# ------------------------------------------------------------------------------------------------ knob table
def test_knob_table_says_which_knobs_mean_something_in_this_plan(tmp_path, recorded_plans):
    tables = {}
    for name in ("A", "B"):
        store = make_session_dir(tmp_path / name, recorded_plans[name])
        tables[name] = Session(tmp_path / name, read_only=True).knob_table().set_index("name")
        store.close()
    a, b = tables["A"], tables["B"]
    assert list(a.reset_index().columns) == list(KNOB_TABLE_COLUMNS)
    # Plan A runs without dynamic batching: token budgets do nothing there, micro batch sizes do.
    assert not a.loc["actor_token_budget", "relevant"] and "use_dynamic_bsz" in a.loc["actor_token_budget", "why_irrelevant"]
    assert a.loc["actor_micro_batch", "relevant"] and a.loc["actor_micro_batch", "value"] == 4
    assert b.loc["actor_token_budget", "relevant"] and not b.loc["actor_micro_batch", "relevant"]
    assert b.loc["actor_token_budget", "value"] == TUNED_CHANGES["actor_token_budget"] and b.loc["actor_token_budget", "changed"]
    assert not a.loc["critic_lora_alpha", "relevant"]  # no LoRA critic
    assert not a.loc["ref_token_budget", "relevant"] and "reference policy" in a.loc["ref_token_budget", "why_irrelevant"]
    assert a.loc["rollout_gpu_memory", "max"] == 0.95 and a.loc["trainer_mode", "choices"] == [
        "sync", "colocate_async", "separate_async"]
    assert a.loc["actor_token_budget", "apply"] == "hot" and a.loc["gpus", "apply"] == "restart"


# ------------------------------------------------------------------------------------------------ placement
def test_placement_compares_planned_and_actual_roles_per_gpu(tmp_path, recorded_plans):
    plan = recorded_plans["A"].with_changes({"gpus": [0, 1], "critic_gpus": 1})
    store = make_session_dir(tmp_path / "placed", plan, gpu_count=2)
    now = time.time()
    # SYNTHETIC process rows: the actor pool's worker and rollout on GPU 0, but an actor worker on the critic's GPU 1.
    store.add_procs([
        {"t": now, "node": "n", "gpu": 0, "pid": 10, "role": "actor_rollout_ref", "mem_used": 30000.0},
        {"t": now, "node": "n", "gpu": 0, "pid": 11, "role": "rollout", "mem_used": 20000.0},
        {"t": now, "node": "n", "gpu": 1, "pid": 12, "role": "actor_rollout_ref", "mem_used": 5000.0},
    ])
    placement = Session(tmp_path / "placed", read_only=True).placement().set_index("gpu")
    assert placement.loc[0, "planned"] == ["actor_rollout_ref", "rollout"]
    assert placement.loc[0, "actual"] == ["actor_rollout_ref", "rollout"] and not placement.loc[0, "mismatch"]
    assert placement.loc[0, "mem_used"] == 50000.0
    assert placement.loc[1, "planned"] == ["critic"] and placement.loc[1, "mismatch"]
    assert "actor_rollout_ref" in placement.loc[1, "message"] and "critic" in placement.loc[1, "message"]
    store.close()


# ------------------------------------------------------------------------------------------------ segments
def test_segments_say_what_changed_from_the_previous_one_and_what_they_measured(tmp_path, recorded_plans):
    store = make_session_dir(tmp_path / "segs", recorded_plans["A"])
    store.begin_segment(recorded_plans["A_hot"].to_json(), reason="hot apply")
    store.begin_segment(recorded_plans["B"].to_json(), reason="restart-class change")
    t = time.time()
    # SYNTHETIC steps: segment 1 at 10 s/step, segment 3 at 4 s/step; segment 2 ran none.
    for step, (segment, seconds) in enumerate([(1, 10.0), (1, 12.0), (3, 4.0), (3, 4.0)], start=1):
        store.add_step(segment, step, {"timing_s/step": seconds, "perf/throughput": 100.0 * step}, t=t + step)
    segments = Session(tmp_path / "segs", read_only=True).segments().set_index("id")
    budget = recorded_plans["A"].knob_values()["actor_token_budget"]
    assert segments.loc[1, "diff"] == [] and segments.loc[1, "diff_text"] == ""
    assert segments.loc[2, "diff"][0] == {"knob": "actor_token_budget", "before": budget, "after": HOT_NEIGHBOUR_BUDGET}
    assert segments.loc[2, "diff_text"].startswith(f"actor_token_budget: {budget} → {HOT_NEIGHBOUR_BUDGET}")
    assert segments.loc[2, "diff"] == [{"knob": d["knob"], "before": d["old"], "after": d["new"]}
                                       for d in recorded_plans["A"].diff(recorded_plans["A_hot"]) if d["knob"]]
    changed = {d["knob"]: (d["before"], d["after"]) for d in segments.loc[3, "diff"]}
    assert set(changed) >= set(TUNED_CHANGES) and changed["actor_token_budget"] == (HOT_NEIGHBOUR_BUDGET, 24576)
    assert (segments.loc[1, "steps"], segments.loc[1, "step_time_s"], segments.loc[1, "throughput"]) == (2, 11.0, 150.0)
    assert segments.loc[2, "steps"] == 0 and math.isnan(segments.loc[2, "step_time_s"])
    assert segments.loc[3, "step_time_s"] == 4.0
    newer = Session(tmp_path / "segs", read_only=True).segments(since_id=2)
    assert newer["id"].tolist() == [3] and newer["diff"].iloc[0] == segments.loc[3, "diff"]
    store.close()


def test_advice_is_judged_against_the_plan_of_the_segment_measured(tmp_path, recorded_plans, monkeypatch):
    from workbench import advisor

    store = make_session_dir(tmp_path / "advice", recorded_plans["A"])
    t = time.time()
    for step in range(1, 5):  # SYNTHETIC steps of segment 1
        store.add_step(1, step, {"timing_s/step": 10.0}, t=t + step)
    store.begin_segment(recorded_plans["B"].to_json(), reason="restart-class change")  # no step yet
    judged = []
    monkeypatch.setattr(advisor, "advise", lambda steps, samples, knobs, **kw: judged.append((knobs, kw)) or [])
    Session(tmp_path / "advice", read_only=True).advice_findings()
    knobs, kw = judged[0]
    assert kw["segment_id"] == 1 and knobs == recorded_plans["A"].knob_values()
    store.close()


# ------------------------------------------------------------------------------------------------ read-only attach
def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_viewer_reads_without_writing(tmp_path, recorded_plans):
    store = make_session_dir(tmp_path / "ro", recorded_plans["A"], state=c.FINISHED)
    write_synthetic_samples(store, 1_000_000.0)
    store.close()  # the last writer checkpoints the WAL into the file and removes -wal and -shm
    database = tmp_path / "ro" / "session.sqlite"
    assert not (tmp_path / "ro" / "session.sqlite-wal").exists()
    before = _digest(database)
    viewer = Session(tmp_path / "ro", read_only=True)
    assert not viewer.is_operator and viewer.poll().state == c.FINISHED
    assert len(viewer.samples(every_s=1.0)) == 20 and len(viewer.steps()) == 0 and viewer.meta["kind"] == "live"
    with pytest.raises(Exception, match="read-only|readonly"):
        viewer._store.set_meta(state=c.RUNNING)
    viewer.close()
    assert _digest(database) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any directory: the case exists for other users")
def test_a_finished_session_in_a_directory_the_viewer_cannot_write_is_readable(tmp_path, recorded_plans):
    directory = tmp_path / "theirs"
    store = make_session_dir(directory, recorded_plans["A"], state=c.FINISHED)
    store.add_step(1, 1, {"timing_s/step": 1.0})
    store.close()
    directory.chmod(0o555)
    try:
        viewer = Session(directory, read_only=True)
        assert viewer.steps()["step"].tolist() == [1] and viewer.state == c.FINISHED
        viewer.close()
    finally:
        directory.chmod(0o755)


# ------------------------------------------------------------------------------------------------ through a supervisor
def _supervisor(session: Session) -> int:
    return int(session.meta["supervisor_pid"])


def _wait(session: Session, predicate, timeout: float = TIMEOUT) -> None:
    session.wait_until(predicate, timeout=timeout, poll=0.05)


@pytest.mark.slow
def test_apply_returns_before_the_supervisor_answers(recording, home):
    session = Session.replay(recording, speed=SLOW, follow=False)
    try:
        session.pause()  # a stopped supervisor lets the replay's clock run on: hold it at a boundary meanwhile
        _wait(session, lambda s: s.state == c.PAUSED)
        pid = _supervisor(session)
        os.kill(pid, signal.SIGSTOP)  # the supervisor (and the replay inside it) can't answer
        try:
            handle = session.apply({"actor_token_budget": HOT_NEIGHBOUR_BUDGET}, wait=False)
            time.sleep(0.5)
            assert handle.refresh().state == "queued" and handle.mode == "hot" and not handle.done
        finally:
            os.kill(pid, signal.SIGCONT)
        handle.wait(timeout=TIMEOUT)
        assert handle.state == "applied" and handle.step == session.last_step() + 1, handle
        applied = [e for e in session.events().to_dict("records") if e["kind"] == c.EV_APPLIED][-1]
        assert applied["data"]["command"] == handle.command_id and applied["data"]["from_step"] == handle.step
    finally:
        session.stop(now=True)


@pytest.mark.slow
def test_a_hot_change_queued_mid_step_applies_from_the_next_step(recording, home):
    # ~3 s between replayed steps (the recorded H200 steps took 60 s): the supervisor takes the change within
    # POLL_S and checks it in well under a second; the run takes it at the boundary of the step under way.
    session = Session.replay(recording, speed=20, follow=False)
    try:
        session.preview({"actor_token_budget": HOT_NEIGHBOUR_BUDGET})  # this test process's own first checks
        _wait(session, lambda s: s.last_step() is not None)
        # Right after a step lands, the next one is under way: the change must make that step's boundary.
        done = session.last_step()
        handle = session.apply({"actor_token_budget": HOT_NEIGHBOUR_BUDGET}, wait=False)
        handle.wait(timeout=TIMEOUT)
        assert handle.state == "applied" and handle.step == done + 2, (done, handle)
        applied = [e for e in session.events().to_dict("records") if e["kind"] == c.EV_APPLIED][-1]
        assert f"from step {done + 2}" in applied["text"]
        session.wait_for_step(done + 2, timeout=TIMEOUT)
        steps = session.steps()
        assert steps.loc[steps["step"] == done + 2, "segment_id"].iloc[0] == 2  # the new plan measured separately
    finally:
        session.stop(now=True)


@pytest.mark.slow
def test_the_supervisor_refuses_with_problems_keyed_by_knob(recording, home):
    session = Session.replay(recording, speed=SLOW, follow=False)
    try:
        _wait(session, lambda s: s.state == c.RUNNING)
        # A command that skipped the session's checks (another client): the supervisor checks it all again.
        command = session._put(c.APPLY, {"changes": {"actor_token_budget": 0, "trainer_mode": "fast"}})
        refused = ApplyResult(session, command, None, {}).wait(timeout=TIMEOUT)
        assert refused.state == "refused" and set(refused.problems) == {"actor_token_budget", "trainer_mode"}
        assert "actor_token_budget" in refused.problems["actor_token_budget"]
        # A valid plan the recording never ran, sent past the session's own check: refused by the run, filed under
        # the plan (Session.apply refuses it before it is queued: tests/test_replay_steering.py).
        command = session._put(c.APPLY, {"changes": {"rollout_gpu_memory": 0.5}})
        refused = ApplyResult(session, command, None, {}).wait(timeout=TIMEOUT)
        assert refused.state == "refused" and set(refused.problems) == {"plan"}
        assert "needs a GPU" in refused.problems["plan"]
        assert len(session.segments()) == 1
    finally:
        session.stop(now=True)


@pytest.mark.slow
def test_a_change_the_run_never_took_ends_not_applied(recording, home):
    session = Session.replay(recording, speed=SLOW, follow=False)
    try:
        _wait(session, lambda s: s.state == c.RUNNING)
        handle = session.apply(TUNED_CHANGES, wait=True)
        assert handle.state == "restarting" and handle.mode == "restart"
        session.stop(now=True)
        assert handle.refresh().state == "not_applied" and "stopped" in handle.message, handle
        assert handle.done
    finally:
        session.stop(now=True)


@pytest.mark.slow
def test_a_restart_class_change_resumes_at_a_step(recording, home):
    # At SLOW the first segment's 4 steps take ~4 s: room for the command on a loaded machine (at 4x SLOW, ~1 s,
    # the recording could end before the supervisor read it: "not applied: the supervisor is gone").
    session = Session.replay(recording, speed=SLOW, follow=False)
    try:
        _wait(session, lambda s: s.state == c.RUNNING)
        handle = session.apply(TUNED_CHANGES, wait=False)
        handle.wait(timeout=TIMEOUT, until=("resumed", "not_applied", "refused"))
        assert handle.state == "resumed" and handle.step is not None, handle
        started = [e for e in session.events().to_dict("records") if e["kind"] == c.EV_STARTED][-1]
        assert started["data"]["first_step"] == handle.step and session.plan.knob_values()["use_dynamic_bsz"]
    finally:
        session.stop(now=True)


# ------------------------------------------------------------------------------------------------ export
def test_export_says_what_this_machine_needed_that_plain_verl_does_not_do(tmp_path, recorded_plans):
    store = make_session_dir(tmp_path / "export", recorded_plans["A"])
    session = Session(tmp_path / "export", read_only=True)
    assert not session.export("command").startswith("#") and session.export("overrides") == recorded_plans["A"].to_overrides()
    # The runner's note where flash-attn is missing (runner/runtime.py writes it into every run's events).
    store.add_event(c.EV_RUNTIME, "flash-attn is not installed: actor/ref/critic use sdpa attention without remove-padding")
    for format in ("command", "yaml"):
        header = [line for line in session.export(format).splitlines() if line.startswith("# ")]
        assert any("sdpa" in line for line in header) and any("critic loader" in line for line in header), header
    assert session.export("yaml").split("\n", 2)[2].startswith(recorded_plans["A"].to_yaml().split("\n", 1)[0])
    with pytest.raises(ValueError, match="unknown export format"):
        session.export("toml")
    store.close()


# ------------------------------------------------------------------------------------------------ authority, kind
def test_the_operator_token_is_checked_by_the_engine(tmp_path, recorded_plans):
    store = make_session_dir(tmp_path / "token", recorded_plans["A"])
    viewer = Session(tmp_path / "token", read_only=True)
    for wrong in ("not-the-token", "", "  "):
        with pytest.raises(ReadOnlySession, match="not this session's operator token"):
            viewer.as_operator(wrong)
    assert not viewer.is_operator
    operator = viewer.as_operator(" operator-token-of-a-test\n")
    assert operator.is_operator and operator.id == viewer.id
    store.close()


def test_a_viewer_cannot_start_one_like_it_and_an_operator_not_beside_a_running_one(quiet, home):
    session, store = quiet
    viewer = Session(session.dir, read_only=True)
    with pytest.raises(ReadOnlySession):
        viewer.start_like()
    with pytest.raises(RuntimeError, match="one verl run at a time"):
        session.start_like()  # it runs (no supervisor pid yet: still starting)
    assert Session.list().empty  # nothing was started


def test_the_session_kind_is_typed(quiet):
    session, store = quiet
    assert session.kind == SessionKind("live") and not session.kind.is_replay
    store.set_meta(kind="replay", recording="/recordings/h200-proof", speed=20, follow=False, recorded_at=1.5e9,
                   gpu_name="NVIDIA H200", startup_speed=400)
    kind = session.kind
    assert kind.is_replay and (kind.recording, kind.speed, kind.follow) == ("/recordings/h200-proof", 20.0, False)
    assert kind.startup_speed == 400 and kind.time_scale == 20.0
    assert (kind.recorded_at, kind.gpu_name) == (1.5e9, "NVIDIA H200")


def test_one_rule_judges_a_change_for_preview_and_supervisor(quiet, recorded_plans):
    session, store = quiet
    plan = recorded_plans["A"]
    judged = judge_change(plan, {"actor_token_budget": HOT_NEIGHBOUR_BUDGET}, gpu_count=1, with_verl=False)
    # (verl's log-prob budgets follow the actor's by interpolation: they change with it)
    assert judged.mode == "hot" and judged.changes["actor_token_budget"] == HOT_NEIGHBOUR_BUDGET
    assert judged.new.knob_values()["actor_token_budget"] == HOT_NEIGHBOUR_BUDGET
    preview = session.preview({"actor_token_budget": HOT_NEIGHBOUR_BUDGET})
    assert (preview.mode, preview.diff) == (judged.mode, judged.diff)
    with pytest.raises(PlanError) as caught:
        judge_change(plan, {"actor_token_budget": plan.knob_values()["actor_token_budget"]}, gpu_count=1,
                     with_verl=False)
    assert caught.value.messages == [NO_CHANGE] == session.preview(
        {"actor_token_budget": plan.knob_values()["actor_token_budget"]}).messages
    with pytest.raises(PlanError) as caught:
        judge_change(plan, {"actor_token_budget": 0}, gpu_count=1, with_verl=False)
    assert "actor_token_budget" in caught.value.problems


def test_a_segment_row_is_one_call_away(quiet):
    session, store = quiet
    assert session.segment()["id"] == 1 == session.segment(1)["id"] and session.segment(7) is None
    assert session.segment()["reason"] == "start"
