"""A session's checkpoints on disk: keep what a restart and a rollback need, and no more.

verl writes each checkpoint to `<session>/checkpoints/global_step_<N>/` (actor and critic FSDP shards with optimizer
states, the actor's HF export, the dataloader's position; ≈36 GB for a 1.5B actor + critic) and, once it is
complete, names it in `latest_checkpointed_iteration.txt`; it deletes none of them. The workbench only ever resumes
from that newest complete checkpoint: a restart-class change resumes from the one written at its step boundary, a
rollback after a crash from the one the last good plan left (the same one: the failed run wrote none, or its
half-written one is not named in the marker). So:

- `prune(session_dir)`, at every launch: only the checkpoint the run resumes from stays; older ones and any a crash
  left half-written go.
- `make_room(session_dir)`, before a run saves: where the disk can't hold a second checkpoint beside the newest, the
  newest goes first (a save that would fill the disk loses it anyway, and the run still holds the weights).

Where they are kept: a restart waits for its checkpoint to be written and read back, and on the H200 both were bound
by the disk (≈ 0.55 GB/s written: 65.7 s for the 1.5B checkpoint). So a session's checkpoints live in host memory
(/dev/shm, a tmpfs) when it holds one beside what Ray's object store may take there, decided once at the session's
first launch (`place`): `<session>/checkpoints` is then a link into it. They go when the supervisor ends
(`release`); a checkpoint is only ever read by the session that wrote it. `WORKBENCH_CHECKPOINTS_IN_MEMORY=0` keeps
them on disk. The actor's HF export (`hf_export_needed`) is only written where a restart can change the actor's GPU
count: on a one-GPU machine it can't.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from . import control as c
from .memory import ModelShape

STEP_DIR = re.compile(r"^global_step_(\d+)$")
ROOM_FACTOR = 1.1  # a new checkpoint is about as big as the last one; keep a margin


def checkpoint_dirs(session_dir: str | Path) -> dict[int, Path]:
    """step -> its checkpoint directory, for every one on disk (complete or not)."""
    root = Path(session_dir) / c.CHECKPOINT_DIR
    if not root.is_dir():
        return {}
    found = {}
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir():
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def size_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def prune(session_dir: str | Path) -> list[Path]:
    """Delete every checkpoint but the newest complete one (what the next run resumes from); returns what went."""
    keep = c.latest_checkpoint_step(Path(session_dir))
    removed = []
    for step, path in checkpoint_dirs(session_dir).items():
        if step != keep:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make_room(session_dir: str | Path) -> list[Path]:
    """Before a save: when the disk has no room for a checkpoint as big as the newest beside it, delete the
    checkpoints on disk first; returns what went (nothing when there is room)."""
    existing = checkpoint_dirs(session_dir)
    if not existing:
        return []
    newest = existing[max(existing)]
    needed = ROOM_FACTOR * size_bytes(newest)
    if shutil.disk_usage(newest).free >= needed:
        return []
    for path in existing.values():
        shutil.rmtree(path, ignore_errors=True)
    # Nothing to resume from until the save completes (verl writes the marker last).
    (Path(session_dir) / c.CHECKPOINT_MARKER).unlink(missing_ok=True)
    return list(existing.values())


def words(removed: list[Path]) -> str:
    """What a prune or make_room did, for an event ("" when nothing went)."""
    if not removed:
        return ""
    steps = ", ".join(path.name.split("_")[-1] for path in removed)
    return f"deleted checkpoint{'s' if len(removed) > 1 else ''} of step {steps}"


# ------------------------------------------------------------------ where they are kept, and what they hold
IN_MEMORY_ENV = "WORKBENCH_CHECKPOINTS_IN_MEMORY"
HOST_MEMORY_ROOT = Path("/dev/shm")
MEMORY_DIR = "verl-workbench"
# Ray's object store takes up to this share of host memory, in /dev/shm too (Ray's default object_store_memory).
OBJECT_STORE_SHARE = 0.3
# What verl's FSDP checkpoint holds per trained parameter: fp32 weights and Adam's two moments; the actor's HF export
# adds its fp32 weights.
CHECKPOINT_BYTES_PER_PARAM = 12
HF_EXPORT_BYTES_PER_PARAM = 4


def hf_export_needed(machine_gpus: int | None) -> bool:
    """Whether checkpoints must carry the actor's HF export: only a restart onto another actor GPU count reads it
    (runs.restart_environment), and on a one-GPU machine none can come. Unknown: keep it."""
    return machine_gpus is None or machine_gpus > 1


def expected_bytes(actor: ModelShape | None, critic: ModelShape | None, *, hf_export: bool) -> int | None:
    """A checkpoint's size from the models' dimensions (None when the actor's are unknown)."""
    if actor is None:
        return None
    params = actor.policy_params + (critic.value_params if critic is not None else 0)
    return CHECKPOINT_BYTES_PER_PARAM * params + (HF_EXPORT_BYTES_PER_PARAM * actor.policy_params if hf_export else 0)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def placed(session_dir: str | Path) -> bool:
    """Whether the session's checkpoints already have their place (on disk or in host memory): decided once."""
    link = Path(session_dir) / c.CHECKPOINT_DIR
    return link.exists() or link.is_symlink()


def place(session_dir: str | Path, expected_bytes: int | None, memory_root: Path = HOST_MEMORY_ROOT) -> str:
    """At a session's first launch: keep its checkpoints in host memory when a checkpoint of `expected_bytes` fits
    there beside Ray's object store; returns words for the launch event ("" when they stay on disk)."""
    link = Path(session_dir) / c.CHECKPOINT_DIR
    if os.environ.get(IN_MEMORY_ENV, "auto") == "0" or expected_bytes is None or placed(session_dir):
        return ""
    try:
        free = shutil.disk_usage(memory_root).free
    except OSError:
        return ""
    if free < ROOM_FACTOR * expected_bytes + OBJECT_STORE_SHARE * host_memory_bytes():
        return ""
    session = Path(session_dir).resolve()  # one folder per session directory, even where two share a name
    owner = f"{session.name}-{hashlib.sha1(str(session).encode()).hexdigest()[:8]}"
    target = memory_root / MEMORY_DIR / owner / c.CHECKPOINT_DIR
    target.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    return (f"checkpoints kept in host memory ({target}; ≈ {expected_bytes / 1e9:.0f} GB each, "
            f"{free / 1e9:.0f} GB free there): they go when the session ends")


def release(session_dir: str | Path) -> Path | None:
    """Free the host memory a session's checkpoints held (nothing for checkpoints on disk); returns what went."""
    link = Path(session_dir) / c.CHECKPOINT_DIR
    if not link.is_symlink():
        return None
    target = link.resolve()
    shutil.rmtree(target.parent if target.parent.parent.name == MEMORY_DIR else target, ignore_errors=True)
    link.unlink()
    return target
