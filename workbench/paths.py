"""Where sessions live: `$VERL_WORKBENCH_HOME/sessions/<id>/` (default ~/.verl-workbench)."""

from __future__ import annotations

import os
from pathlib import Path

from .store import STORE_FILE


def home() -> Path:
    return Path(os.environ.get("VERL_WORKBENCH_HOME", Path.home() / ".verl-workbench"))


def sessions_root() -> Path:
    return home() / "sessions"


def resolve_session_dir(path_or_id: str | os.PathLike | None = None) -> Path:
    """A session directory from a path, an id under sessions_root(), or None for the newest session."""
    if path_or_id is None:
        candidates = sorted(sessions_root().glob(f"*/{STORE_FILE}"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise FileNotFoundError(f"no sessions under {sessions_root()}; start one or pass a session directory")
        return candidates[-1].parent
    p = Path(path_or_id).expanduser()
    for candidate in (p, sessions_root() / str(path_or_id)):
        if (candidate / STORE_FILE).exists():
            return candidate
    raise FileNotFoundError(f"{path_or_id}: not a session directory (no {STORE_FILE}) nor a session id under {sessions_root()}")
