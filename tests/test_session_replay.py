"""The session engine end to end on CPU: Session → supervisor process → replayed run → store → Session.

The sessions here replay the assembled recording (tests/replay_fixture.py) at 50–200× real time, or the real H200
recording h200-proof (bundled) at 50×, under a private VERL_WORKBENCH_HOME. Waits poll for conditions with
generous timeouts (a loaded 2-core CI machine).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from tests.replay_fixture import HOT_NEIGHBOUR_BUDGET, TUNED_CHANGES
from workbench.plan import PlanError
from workbench.plan import Plan
from workbench.recorded_operator import TOOK_CONTROL
from workbench.replay import NO_RECORDED_SEGMENT, TICK_S, Recording, replay_factory
from workbench.procs import process_alive
from workbench.session import ReadOnlySession, Session, resolve_recording
from workbench.store import Store

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 90.0  # for one condition; generous for a loaded machine
FAST = 200  # recorded seconds per second: the recorded run (~400 s) in ~2 s
SLOW = 50  # ~1 s between steps: room to act between two steps
PROOF = "h200-proof"  # the real recording: 5 segments over ~950 s, its steps ~8 s at PROOF_SPEED
PROOF_SPEED = 50
PROOF_STARTUP_SPEED = 500  # verl's recorded start-ups (~150 s each, four of them) in ~0.3 s each
GPM_COLUMNS = ["sm_active", "sm_occupancy", "tensor_active", "dram_active"]


def wait(session: Session, predicate, timeout: float = TIMEOUT) -> Session:
    return session.wait_until(predicate, timeout=timeout, poll=0.1)


def kinds(session: Session) -> list[str]:
    return list(session.events()["kind"])


def event(session: Session, kind: str) -> dict:
    rows = session.events().to_dict("records")
    return [r for r in rows if r["kind"] == kind][-1]


def recorded(recording: Path) -> Store:
    return Store(recording, readonly=True)


def recorded_steps(recording: Path, segment: int) -> list[dict]:
    store = recorded(recording)
    try:
        return [r for r in store.rows("steps") if r["segment_id"] == segment]
    finally:
        store.close()


def recorded_texts(recording: Path, kind: str) -> list[str]:
    store = recorded(recording)
    try:
        return [r["text"] for r in store.rows("events") if r["kind"] == kind]
    finally:
        store.close()


def supervisor_gone(session: Session) -> bool:
    return not process_alive(int(session.meta["supervisor_pid"]))


def run_python(code: str, *args: str) -> str:
    """Run `code` in a fresh interpreter (another process, like a second kernel) and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
def test_a_replay_outlives_its_starter_and_any_process_sees_its_rows(recording, home):
    started = run_python(
        "import sys\nfrom workbench.session import Session\n"
        "print(Session.replay(sys.argv[1], speed=float(sys.argv[2])).dir)",
        str(recording), str(FAST),
    )
    directory = Path(started.strip())
    assert directory.parent == home / "sessions"
    # The process that started the session has exited; the supervisor and the replay go on.
    session = wait(Session.attach(directory.name), lambda s: s.state == "finished")
    assert session.is_operator

    meta = session.meta
    assert (meta["kind"], meta["recording"], meta["speed"]) == ("replay", str(recording), FAST)

    steps = session.steps()
    source = recorded_steps(recording, 1)
    assert list(steps["step"]) == [1, 2, 3, 4] and set(steps["segment_id"]) == {1}
    for (_, row), original in zip(steps.iterrows(), source):
        assert row["timing_s/step"] == original["metrics"]["timing_s/step"]
        assert row["perf/throughput"] == original["metrics"]["perf/throughput"]
    # Re-timed to now at the recorded pace / speed. A step is never early; one may land up to a tick late
    # (TICK_S), and a late one does not delay the next.
    span, recorded_span = steps["t"].iloc[-1] - steps["t"].iloc[0], (source[-1]["t"] - source[0]["t"]) / FAST
    assert recorded_span - TICK_S - 0.05 <= span <= recorded_span + 10, (span, recorded_span)
    assert abs(steps["t"].iloc[-1] - time.time()) < 600

    source_store = recorded(recording)
    segment = source_store.segment(1)
    in_window = [r for r in source_store.rows("samples") if segment["started_at"] < r["t"] <= source[-1]["t"]]
    source_store.close()
    samples = session.samples()
    assert len(samples) == len(in_window)
    assert samples["t"].is_monotonic_increasing and samples["t"].iloc[0] > meta["created"]
    assert samples["power_w"].tolist() == [r["power_w"] for r in in_window]
    assert len(session.workers()) == 6 and set(session.workers()["segment_id"]) == {1}

    events = session.events()
    copied = events[events["kind"] == "telemetry"]
    assert len(copied) == 1 and copied["text"].iloc[0].startswith("NVML at 5 Hz by the reference sampler")
    assert "replay" in event(session, "started")["text"] and "replay" in event(session, "exiting")["text"]
    assert kinds(session).count("launched") == 1  # the recording's own control events are not copied
    assert kinds(session)[-1] == "finished"
    wait(session, supervisor_gone)

    # A second handle in this process and a handle in another process read the same rows.
    other = Session.attach(directory)
    assert other.steps().drop(columns="id").equals(steps.drop(columns="id"))
    seen = json.loads(run_python(
        "import json, sys\nfrom workbench.session import Session\n"
        "s = Session.attach(sys.argv[1], read_only=True)\n"
        "print(json.dumps({'steps': s.steps()['step'].tolist(), 't': s.steps()['t'].tolist(), "
        "'samples': len(s.samples()), 'state': s.state, 'operator': s.is_operator}))",
        str(directory),
    ))
    assert seen == {"steps": [1, 2, 3, 4], "t": steps["t"].tolist(), "samples": len(samples), "state": "finished",
                    "operator": False}

    listed = Session.list()
    row = listed[listed["id"] == directory.name].iloc[0]
    assert (row["kind"], row["state"], row["steps"]) == ("replay", "finished", 4)


@pytest.mark.slow
def test_read_only_attach_refuses_control(recording, home):
    session = Session.replay(recording, speed=SLOW)
    try:
        viewers = [Session.attach(session.id, read_only=True), Session(session.dir, token=None, read_only=True)]
        if os.geteuid() != 0:  # root reads any file: the unreadable-token case only exists for other users
            (session.dir / "operator.token").chmod(0)
            viewers.append(Session.attach(session.id))
        queued = len(session.commands())
        for viewer in viewers:
            assert not viewer.is_operator and "read-only" in repr(viewer)
            for control in (viewer.pause, viewer.resume, viewer.rollback, lambda: viewer.stop(wait=False),
                            lambda: viewer.apply({"actor_token_budget": HOT_NEIGHBOUR_BUDGET})):
                with pytest.raises(ReadOnlySession, match="read-only"):
                    control()
            assert viewer.meta["kind"] == "replay"
        assert len(session.commands()) == queued
    finally:
        (session.dir / "operator.token").chmod(0o600)
        session.stop(now=True)
    assert session.state == "stopped"


@pytest.mark.slow
def test_pause_holds_the_steps_resume_continues_stop_ends(recording, home):
    session = Session.replay(recording, speed=SLOW)
    session.pause()  # accepted while verl "starts"; takes effect at the first step boundary, like the live trainer
    wait(session, lambda s: s.state == "paused")
    assert session.steps()["step"].tolist() == [1]
    assert event(session, "paused")["data"]["step"] == 1

    # Twice the recorded time to the next step (at this speed): a run that was not paused would have written it.
    next_gap = (recorded_steps(recording, 1)[1]["t"] - recorded_steps(recording, 1)[0]["t"]) / SLOW
    time.sleep(2 * next_gap)
    assert session.steps()["step"].tolist() == [1] and session.state == "paused"

    session.resume()
    session.wait_for_step(2, timeout=TIMEOUT)
    assert session.state == "running" and "resumed" in kinds(session)

    session.stop(timeout=TIMEOUT)  # at the next step boundary
    assert session.state == "stopped"
    assert session.segments()["status"].tolist() == ["done"]
    assert {"exiting", "stopped"} <= set(kinds(session))
    wait(session, supervisor_gone)


@pytest.mark.slow
def test_apply_hot_then_restart_then_crash_and_rollback(recording, recorded_plans, home):
    """One session through every change path. Each change is made while paused, so each lands at a known step."""
    session = Session.replay(recording, speed=SLOW, crash_at_step=3)
    session.pause()
    wait(session, lambda s: s.state == "paused")
    assert session.plan.knob_values() == recorded_plans["A"].knob_values()

    # Invalid changes: PlanError, and nothing reaches the supervisor.
    queued = len(session.commands())
    for bad in ({"actor_token_budget": 0}, {"no_such_knob": 1}, {"use_dynamic_bsz": True, "actor_token_budget": 100}):
        with pytest.raises(PlanError):
            session.apply(bad)
    assert len(session.commands()) == queued

    # A valid plan the recording never ran: refused at once with the reason (the preview), nothing queued.
    with pytest.raises(PlanError, match="needs a GPU"):
        session.apply({"rollout_gpu_memory": 0.5}, wait=True)
    assert len(session.commands()) == queued  # so the run never saw it: no refused event, no segment, no apply
    assert len(session.segments()) == 1 and not {"applied", "refused"} & set(kinds(session))
    assert session.plan.knob_values() == recorded_plans["A"].knob_values()

    # Hot: a recorded neighbour differing in a hot knob; the same run opens a new segment at the step boundary.
    result = session.apply({"actor_token_budget": HOT_NEIGHBOUR_BUDGET}, wait=True)
    assert result.mode == "hot"
    wait(session, lambda s: "applied" in kinds(s))
    applied = event(session, "applied")
    assert applied["data"]["from_step"] == 2 and applied["data"]["mode"] == "hot" and "replay" in applied["text"]
    segments = session.segments()
    assert segments["reason"].tolist() == ["hot apply after step 1", "hot apply"]
    assert segments["status"].tolist() == ["done", "running"] and segments["resumed_from_step"].tolist()[1] == 1
    assert session.plan.knob_values() == recorded_plans["A_hot"].knob_values()
    assert kinds(session).count("launched") == 1  # same run
    assert session.state == "paused"  # a hot apply does not end a pause

    # Restart: checkpoint at the boundary, the run exits, a new run resumes in the recorded tuned segment.
    result = session.apply(TUNED_CHANGES, wait=True)
    assert result.mode == "restart"
    session.pause()  # sent during the restart: the relaunched run takes it at its first step boundary
    wait(session, lambda s: s.state == "paused" and (s.steps()["segment_id"] == 3).any())
    assert event(session, "checkpoint")["data"]["step"] == 1
    assert event(session, "launched")["data"] == {"segment": 3, "resume_step": 1}
    segments = session.segments()
    assert segments["status"].tolist() == ["done", "done", "running"]
    assert segments["resumed_from_step"].tolist()[2] == 1
    assert session.plan.knob_values() == recorded_plans["B"].knob_values()
    steps = session.steps()
    assert steps["step"].tolist() == [1, 2] and steps["segment_id"].tolist() == [1, 3]
    assert steps["timing_s/step"].iloc[1] == recorded_steps(recording, 2)[1]["metrics"]["timing_s/step"]

    # Crash (injected at step 3): traceback tail, segment failed, state failed.
    session.resume()
    wait(session, lambda s: s.state == "failed")
    crash = event(session, "crash")
    tail = crash["data"]["traceback_tail"]
    assert "Traceback (most recent call last)" in tail and "InjectedReplayFault: injected replay fault at step 3" in tail
    assert crash["data"]["exit_code"] == 1 and "rollback" in crash["text"]
    assert session.segments()["status"].tolist() == ["done", "done", "failed"]
    assert session.steps()["step"].tolist() == [1, 2]

    # Rollback: the newest plan that ran good steps (A; the hot segment ran none), resumed from the checkpoint.
    assert session.rollback() == 4
    session.wait_for_step(2, timeout=TIMEOUT)
    wait(session, lambda s: (s.steps()["segment_id"] == 4).any())
    assert session.plan.knob_values() == recorded_plans["A"].knob_values()
    assert "rollback" in event(session, "launched")["text"] and event(session, "launched")["data"]["resume_step"] == 1
    assert session.steps().query("segment_id == 4")["step"].iloc[0] == 2

    session.stop(now=True)
    assert session.state == "stopped"
    wait(session, supervisor_gone)
    session.stop()  # an ended session: nothing to do, no error
    with pytest.raises(RuntimeError, match="supervisor has exited"):
        session.resume()


@pytest.mark.slow
def test_a_crash_of_the_first_plan_leaves_nothing_to_roll_back_to(recording, home):
    session = Session.replay(recording, speed=FAST, crash_at_step=2)
    wait(session, lambda s: s.state == "failed")
    assert "injected replay fault at step 2" in event(session, "crash")["data"]["traceback_tail"]
    assert session.segments()["status"].tolist() == ["failed"] and session.steps()["step"].tolist() == [1]
    # The supervisor waits for a decision: the only plan crashed, so rollback has nothing to offer.
    with pytest.raises(RuntimeError, match="no good plan"):
        session.rollback()
    session.stop()
    assert session.state == "stopped"
    wait(session, supervisor_gone)


def test_a_replay_run_copies_its_window_and_leaves_out_recorded_control(recording, recorded_plans, tmp_path):
    """The factory in-process: every table of the recorded window arrives re-timed; recorded control does not."""
    source = shutil.copytree(recording, tmp_path / "recording")
    store = Store(source)
    ready = recorded_steps(source, 1)[0]["t"] - 60.0
    store.add_procs([{"t": ready + i, "node": "h200-reference", "gpu": 0, "pid": 2508, "role": "actor_rollout_ref",
                      "mem_used": 20000.0} for i in range(3)])
    store.add_event("paused", "paused after step 0", t=ready)
    store.add_event("advice", "a recorded finding", t=ready)
    store.close()

    session = Store(tmp_path / "session")
    (tmp_path / "session" / "operator.token").write_text("token")  # the run checks its directives' signatures
    segment = session.begin_segment(recorded_plans["A"].to_json())
    factory = replay_factory(tmp_path / "session", source, speed=2000, follow=False)
    started = time.time()
    run = factory(segment, recorded_plans["A"], {})
    assert run.cannot_apply(recorded_plans["A_hot"]) is None and run.cannot_apply(recorded_plans["B"]) is None
    assert run.cannot_apply(recorded_plans["A"].with_changes({"rollout_gpu_memory": 0.5})).startswith(NO_RECORDED_SEGMENT)
    deadline = time.time() + TIMEOUT
    while run.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert run.poll() == 0
    assert session.meta()["state"] == "running"

    procs = session.frame("procs")
    assert procs["pid"].tolist() == [2508] * 3 and procs["mem_used"].tolist() == [20000.0] * 3
    assert procs["t"].between(started, time.time()).all() and procs["t"].diff().dropna().between(0, 0.01).all()
    copied = session.frame("events")
    assert not {"advice", "paused", "launched"} & set(copied["kind"])
    assert set(recorded_texts(source, "telemetry")) <= set(copied["text"])
    assert (session.frame("samples")["t"] >= started).all()  # re-timed: nothing keeps its recorded time
    assert run.log_path.read_text().count("step ") >= 4


def test_a_replay_can_play_the_recorded_start_up_faster_than_its_steps(recording, recorded_plans, tmp_path):
    """startup_speed: verl's recorded start-up (minutes) goes by at its own pace; the steps keep `speed`'s."""
    session = Store(tmp_path / "session")
    (tmp_path / "session" / "operator.token").write_text("token")
    segment = session.begin_segment(recorded_plans["A"].to_json())
    steps = recorded_steps(recording, 1)
    startup_s = steps[0]["t"] - Store(recording, readonly=True).rows("segments")[0]["started_at"]
    gap_s = steps[1]["t"] - steps[0]["t"]
    speed = gap_s / 2  # a step every ~2 s; at this pace the start-up alone would take startup_s / speed
    assert startup_s / speed > 8
    factory = replay_factory(tmp_path / "session", recording, speed=speed, follow=False, startup_speed=100 * speed)
    run = factory(segment, recorded_plans["A"], {})
    deadline = time.time() + TIMEOUT
    while (session.last_step() or 0) < 3 and time.time() < deadline:
        time.sleep(0.01)
    run.kill()
    times = session.frame("steps")["t"]
    # From the first re-timed row (the start-up's first sample) to the first step: the start-up took next to
    # nothing, the first step's work its paced time.
    first = times.iloc[0] - session.frame("samples")["t"].min()
    assert first < startup_s / speed / 2, first
    assert times.diff().dropna().between(0.5 * gap_s / speed, 2 * gap_s / speed).all(), times.diff().tolist()
    with pytest.raises(ValueError, match="positive"):
        replay_factory(tmp_path / "session", recording, speed=1, startup_speed=0)


# ------------------------------------------------------------------------------------------------ the real recording
def proof_store() -> Store:
    return recorded(resolve_recording(PROOF))


def sample_values(samples: pd.DataFrame) -> set[tuple]:
    """Sample rows without their id and time, comparable across sessions (NaN as None)."""
    values = samples.drop(columns=["id", "t"]).astype(object)
    return set(values.where(values.notna(), None).itertuples(index=False))


def test_the_proof_recording_keeps_its_crashed_segment_and_its_operators_commands():
    recording = Recording(resolve_recording(PROOF))
    assert [s.id for s in recording.segments] == [1, 2, 3, 4, 5]
    crashed = recording.segments[3]
    assert crashed.steps == () and crashed.crash.oom and crashed.crash.exit_code == 1
    assert crashed.ready_at == crashed.ended_at  # it never got past verl's startup
    assert "Engine core initialization failed" in crashed.crash.traceback_tail
    assert [s.crash is None for s in recording.segments] == [True, True, True, False, True]

    commands = [(c.kind, c.after_step) for c in recording.operator_commands]
    assert commands == [("telemetry", 2), ("telemetry", 5), ("apply", 8), ("apply", 12), ("apply", 17),
                        ("rollback", 18), ("stop", 20)]
    assert not any({"token", "nonce", "signature"} & set(c.payload) for c in recording.operator_commands)
    assert recording.operator_commands[3].payload["changes"]["critic_lora_rank"] == 8

    # The plan of segment 3 ran again in segment 5 (the rollback): a resume after step 18 continues there.
    plan_3, plan_4 = (Plan.from_json(recording.segments[i].plan_json) for i in (2, 3))
    assert recording.segment_for(plan_3, after_step=13).id == 3
    assert recording.segment_for(plan_3, after_step=18).id == 5
    assert recording.segment_for(plan_4, after_step=18).id == 4


@pytest.mark.slow
def test_a_replay_follows_the_recorded_operator_through_the_whole_recording(home):
    """h200-proof end to end at 50×: a hot apply, two restarts, a recorded OOM crash, the rollback, the stop."""
    session = Session.replay(PROOF, speed=PROOF_SPEED, startup_speed=PROOF_STARTUP_SPEED)  # by name: the bundled recording
    assert session.meta["recording"] == str(resolve_recording(PROOF)) and session.meta["follow"] is True
    wait(session, lambda s: s.state == "stopped", timeout=3 * TIMEOUT)
    source = proof_store()

    # Every recorded step, in its recorded segment, with its recorded metrics.
    steps = session.steps()
    assert steps["step"].tolist() == list(range(1, 22))
    assert steps["segment_id"].tolist() == [1] * 9 + [2] * 4 + [3] * 5 + [5] * 3
    assert steps["timing_s/step"].tolist() == [r["metrics"]["timing_s/step"] for r in source.rows("steps")]

    # The same segments as the recording, with the same throughput.
    segments, recorded_segments = session.segments(), source.frame("segments")
    assert segments["status"].tolist() == ["done", "done", "done", "failed", "done"]
    assert segments["status"].tolist() == recorded_segments["status"].tolist()
    assert segments["resumed_from_step"].tolist()[1:] == [9, 13, 18, 18]
    assert segments["reason"].tolist()[3] == "out of memory"
    recorded_throughput = source.frame("steps").groupby("segment_id")["perf/throughput"].mean()
    assert segments["throughput"].iloc[[0, 1, 2, 4]].tolist() == pytest.approx(recorded_throughput.tolist())
    assert pd.isna(segments["throughput"].iloc[3])
    for segment in (1, 2, 3, 5):
        assert session.knob_values(segment) == Plan.from_json(source.segment(segment)["plan_json"]).knob_values()

    # The supervisor's own control events, in the recorded order.
    control = [k for k in kinds(session) if k in (
        "launched", "started", "applied", "restart_pending", "checkpoint", "exiting", "crash", "stopped")]
    assert control == [
        "launched", "started", "applied", "restart_pending", "checkpoint", "exiting",
        "launched", "started", "restart_pending", "checkpoint", "exiting",
        "launched", "crash",
        "launched", "started", "exiting", "stopped",
    ]
    applied = event(session, "applied")["data"]
    assert (applied["mode"], applied["from_step"], applied["changes"]["actor_token_budget"]) == ("hot", 10, 32768)
    assert [e["data"]["step"] for e in session.events().to_dict("records") if e["kind"] == "checkpoint"] == [13, 18]
    assert "LoRA rank 0 → 8" in event(session, "not_resumed")["text"]
    switches = [e["data"] for e in session.events().to_dict("records") if e["kind"] == "telemetry" and "sampler" in e["data"]]
    assert switches == [{"sampler": False}, {"sampler": True}]  # this supervisor's answers, not the recorded ones

    # The recorded crash, through the supervisor's own crash path: OOM, the recorded tail, then the rollback.
    crash = event(session, "crash")
    recorded_crash = [e for e in source.rows("events") if e["kind"] == "crash"][0]
    assert crash["data"]["oom"] is True and crash["data"]["exit_code"] == 1 and crash["data"]["segment"] == 4
    assert crash["data"]["traceback_tail"] == recorded_crash["data"]["traceback_tail"]
    assert crash["text"] == recorded_crash["text"]  # "verl ran out of GPU memory: roll back …"
    log = (session.dir / "logs" / "segment-4.log").read_text()
    assert "the recorded crash of recorded segment 4 of h200-proof" in log
    rollback = event(session, "launched")
    assert "rollback" in rollback["text"] and rollback["data"] == {"segment": 5, "resume_step": 18}

    # The recorded operator's commands, signed afresh and answered.
    commands = session.commands()
    commands = commands[~commands["kind"].str.startswith("runner.")].reset_index(drop=True)  # the supervisor's own
    assert commands["kind"].tolist() == ["telemetry", "telemetry", "apply", "apply", "apply", "rollback", "stop"]
    # The third change's relaunch ran out of memory before its first step: it never took effect.
    assert commands["state"].tolist() == ["done", "done", "applied", "resumed", "not_applied", "done", "done"]
    assert "crashed (out of memory)" in json.loads(commands["result"][4])["message"]
    assert [json.loads(r)["mode"] for r in commands["result"][2:5]] == ["hot", "restart", "restart"]
    for payload in commands["payload"]:
        assert "signature" in payload and "token" not in payload and "recorded_command" in payload
    assert TOOK_CONTROL not in session.events()["text"].tolist()

    # Every replayed sample is a recorded one, GPU activity (GPM) columns included; only its time is new.
    samples = session.samples()
    assert len(samples) > 5000 and samples[GPM_COLUMNS].notna().mean().min() > 0.99
    assert sample_values(samples) <= sample_values(source.frame("samples"))
    assert samples["t"].is_monotonic_increasing
    source.close()
    wait(session, supervisor_gone)


@pytest.mark.slow
def test_without_following_a_replay_plays_the_first_recorded_segment_only(home):
    session = Session.replay(PROOF, speed=PROOF_SPEED, startup_speed=PROOF_STARTUP_SPEED, follow=False)
    wait(session, lambda s: s.state == "finished")
    assert session.meta["follow"] is False
    assert session.steps()["step"].tolist() == list(range(1, 10)) and len(session.segments()) == 1
    assert session.commands().empty and "replay" not in kinds(session)
    # Nobody answers the recorded sampler switches here: the recorded ones explain the recorded gap in the samples.
    switches = [e["data"] for e in session.events().to_dict("records") if e["kind"] == "telemetry" and "sampler" in e["data"]]
    assert switches == [{"sampler": False, "replayed": True}, {"sampler": True, "replayed": True}]
    # The samples of plan A's window, as recorded: GPU activity (GPM) columns too, NaN where the recording has NaN.
    source = proof_store()
    last_step = source.rows("steps")[8]
    recorded_samples = source.frame("samples").query("@source.segment(1)['started_at'] < t <= @last_step['t']")
    source.close()
    samples = session.samples()
    assert samples[GPM_COLUMNS].reset_index(drop=True).equals(recorded_samples[GPM_COLUMNS].reset_index(drop=True))
    wait(session, supervisor_gone)
