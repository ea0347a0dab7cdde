"""Read-only is read-only (issue 10, item 5).

- a read-only attach holds a read-only SQLite connection: it can't set meta, take or hold a command, and its reads
  leave a finished session's store byte for byte as it was;
- another Unix user with read permission can read a finished session (a copy in a directory they can't write): run
  as `nobody` through setpriv, skipped with the reason where that is impossible;
- the runner executes only directives the supervisor signed: an unsigned or forged `runner.*` row is refused.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from workbench import control as c
from workbench.boundary import HotChange, StepBoundary
from workbench.session import ReadOnlySession, Session
from workbench.store import STORE_FILE, Store

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 90.0


def _finished(home: Path) -> Session:
    """A session that ran to its end: the bundled 8-step recording, replayed fast, following its recorded stop."""
    session = Session.replay("h200-lora-critic-sync", speed=400)
    session.wait_until(lambda s: s.state in c.ENDED_STATES, timeout=TIMEOUT, poll=0.1)
    session.wait_until(lambda s: not s.supervisor_alive(), timeout=TIMEOUT, poll=0.1)
    assert session.state in (c.STOPPED, c.FINISHED), session.events()[["kind", "text"]].to_string()
    return session


def _digest(directory: Path) -> dict[str, str]:
    """Every file's bytes, but SQLite's shared-memory index (-shm), which a reader of a WAL store may make."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())
            if p.is_file() and not p.name.endswith("-shm") and not (p.name.endswith("-wal") and not p.stat().st_size)}


@pytest.mark.slow
def test_a_read_only_attach_cannot_write(home):
    operator = Session.replay("h200-proof", speed=50, follow=False)
    operator.wait_for_step(1, timeout=TIMEOUT)
    viewer = Session.attach(operator.dir, read_only=True)
    assert not viewer.is_operator
    with pytest.raises(Exception):
        viewer._store.set_meta(state="lost")
    with pytest.raises(Exception):
        viewer._store.take_commands()
    with pytest.raises(sqlite3.OperationalError, match="readonly"):  # SQLite itself says no, not only the Python side
        viewer._store._db.execute("UPDATE commands SET state='queued'")
    for control in (lambda: viewer.apply({"actor_token_budget": 8192}), viewer.pause, viewer.stop, viewer.rollback):
        with pytest.raises(ReadOnlySession):
            control()
    assert operator.meta["state"] in c.ACTIVE_STATES
    operator.stop(now=True)


@pytest.mark.slow
def test_reading_a_finished_session_changes_nothing_in_it(home):
    session = _finished(home)
    session.close()
    before = _digest(session.dir)
    viewer = Session.attach(session.dir, read_only=True)
    viewer.steps(), viewer.events(), viewer.segments(), viewer.poll(), viewer.meta, viewer.state
    viewer.close()
    assert _digest(session.dir) == before


def _as_nobody() -> list[str]:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("reading as another user needs root and setpriv (util-linux) to become nobody")
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@pytest.mark.slow
def test_another_user_can_read_a_finished_session(home):
    """The owner shares a finished session: a copy, readable by all, in a directory only the owner can write. The
    store is in WAL mode and there is no -shm file, which the reader can't create."""
    prefix = _as_nobody()
    session = _finished(home)
    state_seen, steps_seen, events_seen = session.state, len(session.steps()), len(session.events())
    session.close()
    shared = Path(tempfile.mkdtemp(prefix="wb-shared-"))
    try:
        copy = shared / session.id
        copy.mkdir()
        # SQLite's backup: the store with whatever its WAL file still holds (a plain file copy may miss that).
        source, target = sqlite3.connect(session.dir / STORE_FILE), sqlite3.connect(copy / STORE_FILE)
        source.backup(target)
        source.close(), target.close()
        for path, mode in ((shared, 0o755), (copy, 0o755), (copy / STORE_FILE, 0o644)):
            os.chmod(path, mode)
        code = (
            "import sys; from workbench.session import Session\n"
            "s = Session.attach(sys.argv[1])\n"
            "print(s.is_operator, s.state, len(s.steps()), len(s.events()), s.last_step())\n"
        )
        env = {"PATH": os.environ["PATH"], "HOME": str(shared), "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONPATH": str(REPO)}
        probe = subprocess.run([*prefix, sys.executable, "-c", "import workbench"], cwd=shared, env=env,
                               capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"nobody can't run this Python: {probe.stderr.strip().splitlines()[-1:]}")
        done = subprocess.run([*prefix, sys.executable, "-c", code, str(copy)], cwd=shared, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        is_operator, state, steps, events, last = done.stdout.split()
        assert (is_operator, state) == ("False", state_seen)
        assert int(steps) == steps_seen > 0 and int(events) == events_seen
        assert sorted(p.name for p in copy.iterdir()) == [STORE_FILE]  # the reader wrote nothing beside it
    finally:
        shutil.rmtree(shared, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ signed directives
class _Run:
    """What a run gives the step boundary, recording what it was asked to do."""

    def __init__(self):
        self.ended = False

    def hot_apply(self, changes, plan_json, step):
        return HotChange(before={})

    def checkpoint(self, step):
        return ""

    def end_run(self):
        self.ended = True


def _boundary(tmp_path: Path, token: str | None) -> tuple[Store, StepBoundary, _Run]:
    store = Store(tmp_path)
    segment = store.begin_segment("{}", reason="test")
    run = _Run()
    boundary = StepBoundary(store, segment, hot_apply=run.hot_apply, checkpoint=run.checkpoint, end_run=run.end_run,
                            token=token)
    return store, boundary, run


@pytest.mark.parametrize("payload", [
    {"checkpoint": False},  # unsigned
    {"checkpoint": False, "nonce": "n", "signature": "0" * 64},  # forged
    "signed with another token",
])
def test_the_runner_refuses_directives_the_supervisor_did_not_sign(tmp_path, payload):
    token = c.new_token()
    store, boundary, run = _boundary(tmp_path, token)
    if payload == "signed with another token":
        payload = c.signed(c.new_token(), c.RUNNER_STOP, {"checkpoint": False})
    command = store.put_command(c.RUNNER_STOP, payload)
    assert boundary(1) is False and not run.ended
    assert store.command(command)["state"] == c.REFUSED
    assert "not signed" in store.command(command)["result"]


def test_the_runner_executes_a_signed_directive_once(tmp_path):
    token = c.new_token()
    store, boundary, run = _boundary(tmp_path, token)
    payload = c.signed(token, c.RUNNER_STOP, {"checkpoint": False})
    first = store.put_command(c.RUNNER_STOP, payload)
    assert boundary(1) is True and run.ended
    assert store.command(first)["state"] == c.DONE
    replayed = store.put_command(c.RUNNER_STOP, payload)  # a copied row: its nonce was used
    run.ended = False
    assert boundary(2) is False and not run.ended
    assert store.command(replayed)["state"] == c.REFUSED
