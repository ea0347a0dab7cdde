"""Checkpoint retention (workbench/checkpoints.py): a session keeps the checkpoint a restart or a rollback resumes
from, and no other. The checkpoint directories are synthetic (a few bytes each, verl's layout)."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

from tests.plan_fixtures import runnable_plan, tiny_model  # noqa: F401 (fixtures)
from workbench import checkpoints
from workbench import control as c

Usage = namedtuple("Usage", "total used free")


def write_checkpoint(session: Path, step: int, complete: bool = True, size: int = 1000) -> Path:
    """verl's layout: global_step_N/{actor,critic,data.pt}; the marker names it once it is complete."""
    path = session / c.CHECKPOINT_DIR / f"global_step_{step}"
    for part in ("actor/model_world_size_1_rank_0.pt", "critic/model_world_size_1_rank_0.pt", "data.pt"):
        (path / part).parent.mkdir(parents=True, exist_ok=True)
        (path / part).write_bytes(b"x" * size)
    if complete:
        c.write_checkpoint_marker(session, step)
    return path


def test_only_the_checkpoint_the_next_run_resumes_from_stays(tmp_path):
    write_checkpoint(tmp_path, 4)   # left by a restart-class change
    write_checkpoint(tmp_path, 9)   # left by the next one: the newest complete checkpoint
    write_checkpoint(tmp_path, 12, complete=False)  # half-written when the run crashed
    removed = checkpoints.prune(tmp_path)
    assert sorted(p.name for p in removed) == ["global_step_12", "global_step_4"]
    assert list(checkpoints.checkpoint_dirs(tmp_path)) == [9] == [c.latest_checkpoint_step(tmp_path)]
    assert checkpoints.words(removed) == "deleted checkpoints of step 4, 12"
    assert checkpoints.prune(tmp_path) == []  # idempotent


def test_a_session_without_checkpoints_has_nothing_to_prune(tmp_path):
    assert checkpoints.prune(tmp_path) == [] and checkpoints.make_room(tmp_path) == []


def test_a_save_gets_room_only_when_the_disk_cannot_hold_two(tmp_path, monkeypatch):
    newest = write_checkpoint(tmp_path, 4, size=1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 0, 10**6))
    assert checkpoints.make_room(tmp_path) == [] and newest.exists()

    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 0, 3000))  # < 1.1 x 3 000 bytes
    assert checkpoints.make_room(tmp_path) == [newest]
    assert not newest.exists() and c.latest_checkpoint_step(tmp_path) is None  # nothing to resume until the save


class StubRun:
    """A run that never ends: the launch is what is tested."""

    log_path = None

    def poll(self):
        return None

    def kill(self):
        pass


def test_every_launch_prunes_what_no_run_resumes_from(tmp_path, runnable_plan):
    from workbench.store import Store
    from workbench.supervisor import Supervisor

    (tmp_path / c.TOKEN_FILE).write_text("token")
    Store(tmp_path).begin_segment(runnable_plan.to_json(), reason="start")
    write_checkpoint(tmp_path, 4)
    write_checkpoint(tmp_path, 9)
    supervisor = Supervisor(tmp_path, run_factory=lambda segment, plan, env: StubRun())
    supervisor.launch(runnable_plan, reason="restart-class change")
    assert list(checkpoints.checkpoint_dirs(tmp_path)) == [9]
    launched = [e for e in supervisor.store.rows("events") if e["kind"] == c.EV_LAUNCHED][-1]
    assert "deleted checkpoint of step 4" in launched["text"]
