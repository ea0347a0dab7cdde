"""A change sent to a replay near its end gets an answer: applied when it was sent before the replay's last step
boundary (the replay holds each boundary while a command is on its way to the supervisor, as a live run's next
boundary takes what was sent during its step), refused at once with the reason once the replay has ended. It is
never left queued for a supervisor that has exited ("not applied: the supervisor is gone", as CI saw it).

In-process: the supervisor's own methods, called by the test when it chooses (a supervisor busy elsewhere, e.g.
importing verl for its first check), beside the replay's thread playing the assembled recording (tests/replay_fixture.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.polling import wait_until
from tests.replay_fixture import HOT_NEIGHBOUR_BUDGET
from workbench import control as c
from workbench.lifecycle import replay_launch
from workbench.plan import PlanError
from workbench.recordings import REPLAY_ENDED
from workbench.replay import replay_factory
from workbench.session import Session
from workbench.store import SessionClosed, Store
from workbench.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[1]
FAST = 5000  # recorded seconds per second: the recorded segment's steps in a few replay ticks
HOLD_S = 1.5  # far longer than the whole segment takes at FAST
TIMEOUT = 60.0
TOKEN = "token"


def wait_for(predicate, timeout: float = TIMEOUT) -> None:
    wait_until(predicate, timeout, every=0.02, what="timed out")


def started_supervisor(tmp_path, recording, plan) -> tuple[Supervisor, Store]:
    directory = tmp_path / "session"
    store = Store(directory)
    (directory / c.TOKEN_FILE).write_text(TOKEN)
    store.set_meta(initial_plan=plan.to_json(), kind="replay", recording=str(recording), speed=FAST, follow=False)
    factory = replay_factory(directory, recording, speed=FAST, follow=False)
    factory.ready.clear()  # the run waits until the test lets it play
    supervisor = Supervisor(directory, run_factory=factory)
    supervisor.launch(plan, reason="start")
    return supervisor, store, factory.ready


def answer(store: Store, command_id: int) -> tuple[str, dict]:
    row = store.command(command_id)
    return row["state"], json.loads(row["result"]) if row["result"] else {}


def play_to_the_end(supervisor: Supervisor) -> None:
    wait_for(lambda: supervisor.run.poll() is not None)
    supervisor.check_run()


def test_a_change_sent_while_the_replay_plays_is_applied_though_the_supervisor_takes_it_late(
        tmp_path, recording, recorded_plans):
    supervisor, store, play = started_supervisor(tmp_path, recording, recorded_plans["A"])
    command = store.put_command(c.APPLY, c.signed(TOKEN, c.APPLY, {"changes": {
        "actor_token_budget": HOT_NEIGHBOUR_BUDGET}}))
    play.set()  # sent during the first step
    time.sleep(HOLD_S)  # the supervisor does not look meanwhile; unheld, the replay would play on to its end
    assert (store.last_step() or 0) <= 1 and supervisor.run.poll() is None, "the replay went past a change on its way"

    supervisor.handle_commands()
    wait_for(lambda: answer(store, command)[0] == c.APPLIED)
    assert answer(store, command)[1]["step"] == 2
    play_to_the_end(supervisor)
    assert store.meta()["state"] == c.FINISHED
    assert store.last_step() > 1


def test_a_change_sent_as_the_replay_ends_is_refused_with_the_reason_not_left_queued(
        tmp_path, recording, recorded_plans, monkeypatch):
    supervisor, store, play = started_supervisor(tmp_path, recording, recorded_plans["A"])
    play.set()
    wait_for(lambda: supervisor.run.poll() is not None)  # it played its last step; the supervisor has not looked
    queued = store.put_command(c.APPLY, c.signed(TOKEN, c.APPLY, {"changes": {
        "actor_token_budget": HOT_NEIGHBOUR_BUDGET}}))
    assert supervisor.loop() == 0  # sees the end, answers, exits
    assert store.meta()["state"] == c.FINISHED
    state, result = answer(store, queued)
    assert state == c.REFUSED and result["message"] == f"can't apply a change: {REPLAY_ENDED}"

    # Once the state says finished nothing is queued any more: a handle that looked before the replay ended gets
    # the preview's refusal at once, never a command left for a supervisor that is gone.
    session = Session(store.path.parent, TOKEN)
    with pytest.raises(PlanError, match=f"session {session.id} is finished: the replay has ended.*play it again"):
        session.apply({"actor_token_budget": HOT_NEIGHBOUR_BUDGET})
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    store.set_meta(supervisor_pid=gone.pid)  # and its supervisor has exited by the time the handle queues it
    looked_while_running = iter([c.RUNNING])
    monkeypatch.setattr(Session, "state", property(lambda self: next(looked_while_running, c.FINISHED)))
    with pytest.raises(PlanError, match="the replay has ended.*play it again"):
        session.apply({"actor_token_budget": HOT_NEIGHBOUR_BUDGET})
    with pytest.raises(SessionClosed, match="finished"):
        store.put_command(c.PAUSE, {}, unless_state=c.CLOSED_STATES)
    assert len(store.rows("commands")) == 1


def test_a_change_that_comes_in_while_a_stop_is_handled_is_answered_before_the_supervisor_exits(
        tmp_path, recording, recorded_plans):
    supervisor, store, play = started_supervisor(tmp_path, recording, recorded_plans["A"])
    play.set()
    wait_for(lambda: store.last_step() is not None)
    late: list[int] = []
    stop = supervisor.cmd_stop

    def stop_while_a_change_comes_in(payload):
        late.append(store.put_command(c.APPLY, c.signed(TOKEN, c.APPLY, {"changes": {
            "actor_token_budget": HOT_NEIGHBOUR_BUDGET}})))
        return stop(payload)

    supervisor.cmd_stop = stop_while_a_change_comes_in
    store.put_command(c.STOP, c.signed(TOKEN, c.STOP, {"now": True}))
    assert supervisor.loop() == 0
    assert store.meta()["state"] == c.STOPPED
    state, result = answer(store, late[0])
    assert state == c.REFUSED and "stopped" in result["message"], (state, result)


@pytest.mark.slow
def test_a_replays_supervisor_checks_and_applies_a_change_without_importing_verl(tmp_path, recording):
    """verl, and torch with it, costs a process ~11 CPU-seconds to import. A replay checks a change with the fast
    checks only (verl's own check is for a live run), so its supervisor never imports verl, not even for a change:
    the real supervisor, in a fresh interpreter, takes a change to the assembled recording, plays it to the end and
    exits."""
    plan_json, meta, args = replay_launch(recording, speed=FAST, follow=False, crash_at_step=None)
    directory = tmp_path / "session"
    store = Store(directory)
    (directory / c.TOKEN_FILE).write_text(TOKEN)
    (directory / c.LOG_DIR).mkdir()
    store.set_meta(initial_plan=plan_json, state=c.STARTING, **meta)
    change = store.put_command(c.APPLY, c.signed(TOKEN, c.APPLY, {"changes": {
        "actor_token_budget": HOT_NEIGHBOUR_BUDGET}}))
    code = ("import sys; from workbench import supervisor; rc = supervisor.main(sys.argv[1:]); "
            "print(rc, sorted({'verl', 'torch'} & set(sys.modules)))")
    ran = subprocess.run([sys.executable, "-c", code, "--session", str(directory), *args], cwd=REPO,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert answer(store, change)[0] == c.APPLIED, (answer(store, change), ran.stderr[-2000:])
    assert store.meta()["state"] == c.FINISHED
    assert ran.stdout.split("\n")[-2] == "0 []", (ran.stdout[-500:], ran.stderr[-2000:])
