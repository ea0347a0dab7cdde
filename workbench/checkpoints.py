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
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from . import control as c

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
