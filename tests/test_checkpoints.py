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


# ------------------------------------------------------------------ in host memory; the HF export only where needed
GIB = 2**30


def memory_root(tmp_path: Path) -> Path:
    """A stand-in for /dev/shm (a directory of the test's own; its free space is what disk_usage is made to say)."""
    root = tmp_path / "shm"
    root.mkdir()
    return root


def test_checkpoints_go_to_host_memory_when_it_holds_one_beside_the_reserve(tmp_path, monkeypatch):
    session, root = tmp_path / "session", memory_root(tmp_path)
    session.mkdir()
    monkeypatch.setattr(checkpoints, "host_memory_bytes", lambda: 128 * GIB)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(64 * GIB, 0, 64 * GIB))
    words = checkpoints.place(session, expected_bytes=14 * 10**9, memory_root=root)  # 1.1 x 14 + 0.3 x 137 < 68
    assert "host memory" in words and "14 GB each" in words
    target = (session / c.CHECKPOINT_DIR).resolve()
    assert (session / c.CHECKPOINT_DIR).is_symlink() and target.is_relative_to(root.resolve())
    write_checkpoint(session, 4)  # verl writes through the link; retention works as on disk
    write_checkpoint(session, 9)
    assert [p.name for p in checkpoints.prune(session)] == ["global_step_4"]
    assert (target / "global_step_9").is_dir()
    assert checkpoints.place(session, expected_bytes=14 * GIB, memory_root=root) == ""  # decided once per session

    assert checkpoints.release(session) == target
    assert not target.exists() and not (session / c.CHECKPOINT_DIR).exists()
    assert checkpoints.release(session) is None  # nothing left to release


def test_checkpoints_stay_on_disk_when_memory_is_short_unknown_or_turned_off(tmp_path, monkeypatch):
    root = memory_root(tmp_path)
    monkeypatch.setattr(checkpoints, "host_memory_bytes", lambda: 128 * GIB)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(64 * GIB, 0, 64 * GIB))
    for i, (expected, env) in enumerate([(37 * GIB, None),   # a 1.5B actor + critic: 1.1 x 37 + 38.4 > 64
                                         (None, None),       # the model's size is unknown
                                         (1 * GIB, "0")]):   # WORKBENCH_CHECKPOINTS_IN_MEMORY=0
        session = tmp_path / f"session{i}"
        session.mkdir()
        if env is not None:
            monkeypatch.setenv(checkpoints.IN_MEMORY_ENV, env)
        assert checkpoints.place(session, expected_bytes=expected, memory_root=root) == ""
        assert not (session / c.CHECKPOINT_DIR).exists() and checkpoints.release(session) is None
    assert checkpoints.place(tmp_path / "session0", expected_bytes=GIB, memory_root=tmp_path / "no-such") == ""


def test_a_session_with_checkpoints_on_disk_keeps_them_there(tmp_path, monkeypatch):
    root = memory_root(tmp_path)
    monkeypatch.setattr(checkpoints, "host_memory_bytes", lambda: 128 * GIB)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(64 * GIB, 0, 64 * GIB))
    write_checkpoint(tmp_path, 4)
    assert checkpoints.place(tmp_path, expected_bytes=GIB, memory_root=root) == ""
    assert not (tmp_path / c.CHECKPOINT_DIR).is_symlink() and list(checkpoints.checkpoint_dirs(tmp_path)) == [4]


def test_checkpoint_size_follows_the_models(tiny_model):
    from workbench.memory import KNOWN_SHAPES

    shape = KNOWN_SHAPES["qwen2.5-1.5b"]
    both = checkpoints.expected_bytes(shape, shape, hf_export=False)
    assert both == 12 * (shape.policy_params + shape.value_params)  # fp32 weights + Adam's two moments, each model
    assert 35e9 < both < 38e9  # ≈ 36 GB for a 1.5B actor + critic, as measured on the H200
    assert checkpoints.expected_bytes(shape, None, hf_export=True) == 16 * shape.policy_params
    assert checkpoints.expected_bytes(None, shape, hf_export=False) is None


def test_the_actor_hf_export_is_written_only_where_the_gpu_count_can_change():
    assert checkpoints.hf_export_needed(machine_gpus=1) is False  # one GPU: the actor's world size can't change
    assert checkpoints.hf_export_needed(machine_gpus=8) is True
    assert checkpoints.hf_export_needed(machine_gpus=None) is True  # unknown: keep it, a restart may need it


def test_a_live_run_places_checkpoints_before_it_starts_and_the_supervisor_releases_them_at_its_end(
        tmp_path, runnable_plan, monkeypatch):
    from workbench import runs, supervisor as supervisor_module
    from workbench.supervisor import Supervisor

    placed, released = [], []
    monkeypatch.setattr(checkpoints, "place", lambda session, expected: placed.append(expected) or
                        "checkpoints kept in host memory")
    monkeypatch.setattr(checkpoints, "release", lambda session: released.append(session))
    monkeypatch.setattr(supervisor_module, "LiveRun", type("StubLiveRun", (StubRun,), {  # no verl process
        "__init__": lambda self, *args, **kwargs: None, "proc": type("Proc", (), {"pid": 0})}))
    monkeypatch.setenv("WORKBENCH_NO_SAMPLER", "1")
    monkeypatch.setattr(runs, "gpu_count", lambda: 1)
    (tmp_path / c.TOKEN_FILE).write_text("token")
    supervisor = Supervisor(tmp_path)
    supervisor.launch(runnable_plan, reason="start")
    # The tests' tiny model, with its critic, no HF export (one GPU).
    assert placed == [runs.checkpoint_bytes(runnable_plan)] and placed[0] > 0
    assert "checkpoints kept in host memory" in supervisor.store.rows("events")[-1]["text"]
    supervisor.run = None
    supervisor.set_state(c.STOPPED)
    assert supervisor.loop() == 0 and released == [tmp_path]
