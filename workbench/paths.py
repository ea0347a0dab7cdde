"""Where sessions live: `$VERL_WORKBENCH_HOME/sessions/<id>/` (default ~/.verl-workbench).

Session directories are the owner's alone (0700, and the directories the workbench makes above them): a store,
its logs and checkpoints hold what a run did, and the operator token lies beside them.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .bounds import quoted
from .store import STORE_FILE, StoreError

HOME_ENV = "VERL_WORKBENCH_HOME"
PRIVATE_DIR_MODE = 0o700
# What new_session_id makes (time, name, random part): what a page URL may name, never a path.
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


class WorkbenchHomeError(RuntimeError):
    """The place sessions go can't hold them (a file in the way, no permission, a read-only or full disk)."""


class PageSessionError(LookupError):
    """A dashboard page's URL names no session of this server (said to the page in one line, without paths)."""


def home() -> Path:
    value = os.environ.get(HOME_ENV)
    if value is None:
        return Path.home() / ".verl-workbench"
    if not value.strip():
        raise WorkbenchHomeError(f"{HOME_ENV} is set but empty: point it at a directory you can write, or unset it "
                                 "(the default is ~/.verl-workbench)")
    return Path(value).expanduser()


def sessions_root() -> Path:
    return home() / "sessions"


def resolve_session_dir(path_or_id: str | os.PathLike | None = None) -> Path:
    """A session directory from a path, an id under sessions_root(), or None for the newest session."""
    try:
        found = _find_session_dir(path_or_id)
    except PermissionError as error:
        raise WorkbenchHomeError(f"cannot read {error.filename or sessions_root()}: permission denied "
                                 f"(check {HOME_ENV} and its permissions)") from None
    except OSError as error:  # e.g. a name too long to be a path
        raise FileNotFoundError(f"{quoted(str(path_or_id))}: not a session ({error.strerror})") from None
    if found is None and path_or_id is None:
        raise FileNotFoundError(f"no sessions under {sessions_root()}; start one or pass a session directory")
    if found is None:
        raise FileNotFoundError(f"{quoted(str(path_or_id))}: not a session directory (no {STORE_FILE}) nor a session "
                                f"id under {sessions_root()}")
    return found


def session_stores(root: Path | None = None) -> list[Path]:
    """The store of every session under `root` (default sessions_root()), by path; WorkbenchHomeError (one line)
    where the folder can't be read."""
    root = root or sessions_root()
    try:
        return sorted(root.glob(f"*/{STORE_FILE}"))
    except PermissionError as error:
        raise WorkbenchHomeError(f"cannot read {error.filename or root}: permission denied "
                                 f"(check {HOME_ENV} and its permissions)") from None


@contextmanager
def made_session_dir(name: str | None = None, root: Path | None = None) -> Iterator[Path]:
    """A new session directory (new_session_dir) for the block to fill: removed again when the block fails, so a
    full disk or a missing permission leaves no half-made session (a folder holding a 0-byte token), and an OSError
    or a store that can't be written is said in one line (WorkbenchHomeError)."""
    directory = new_session_dir(name, root)
    try:
        yield directory
    except BaseException as error:
        shutil.rmtree(directory, ignore_errors=True)
        if isinstance(error, (OSError, StoreError)):
            reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            raise WorkbenchHomeError(_cannot(directory.parent, None if root else HOME_ENV, reason)) from None
        raise


def _find_session_dir(path_or_id: str | os.PathLike | None) -> Path | None:
    if path_or_id is None:
        candidates = sorted(session_stores(), key=lambda p: p.stat().st_mtime)
        return candidates[-1].parent if candidates else None
    for candidate in (Path(path_or_id).expanduser(), sessions_root() / str(path_or_id)):
        if (candidate / STORE_FILE).exists():
            return candidate
    return None


def page_session_dir(session_id: str | None) -> Path:
    """The session a dashboard page names (`?session=ID`): the id of a session under this server's sessions_root(),
    never a path (no '/', no '..', no symbolic link out); None or '' is the newest such session. PageSessionError
    (one line, naming no server path) otherwise."""
    if not session_id:
        try:
            stores = sorted(session_stores(), key=lambda p: p.stat().st_mtime, reverse=True)
        except (OSError, WorkbenchHomeError):
            stores = []
        for store in stores:
            if _inside_sessions_root(store.parent):
                return store.parent
        raise PageSessionError("no session on this server yet: start one (verl-workbench up)")
    if not SESSION_ID.fullmatch(session_id):
        raise PageSessionError(f"session={quoted(session_id, 80)} is not a session id (letters, digits, '.', '-', "
                               "'_'): use the URL `verl-workbench up` printed")
    directory = sessions_root() / session_id
    if not _inside_sessions_root(directory):
        raise PageSessionError(f"no session {session_id!r} on this server: use the URL `verl-workbench up` printed")
    return directory


def _inside_sessions_root(directory: Path) -> bool:
    """A session directory itself under sessions_root() (a symbolic link out of it is not), holding a store."""
    try:
        return (directory.resolve(strict=True).parent == sessions_root().resolve()
                and (directory / STORE_FILE).is_file())
    except OSError:
        return False


def private_dir(path: Path, what: str | None = None) -> Path:
    """Make `path` and its missing parents as directories only their owner can enter (0700); `what` names the
    setting that chose the place, for the one-line WorkbenchHomeError when it can't be made."""
    missing = []
    try:
        for directory in (path, *path.parents):
            if directory.is_dir():
                break
            missing.append(directory)
    except PermissionError as error:
        raise WorkbenchHomeError(_cannot(path, what, f"cannot enter {error.filename}: permission denied")) from None
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            if not directory.is_dir():
                raise WorkbenchHomeError(_cannot(path, what, f"{directory} is not a directory")) from None
        except OSError as error:
            reason = (f"{_first_file(directory)} is not a directory" if error.errno == errno.ENOTDIR
                      else f"cannot create {directory}: {error.strerror}")
            raise WorkbenchHomeError(_cannot(path, what, reason)) from None
        os.chmod(directory, PRIVATE_DIR_MODE)  # mkdir's mode is filtered by the umask
    return path


def _first_file(path: Path) -> Path:
    for directory in reversed((path, *path.parents)):
        if directory.exists() and not directory.is_dir():
            return directory
    return path


def _cannot(path: Path, what: str | None, reason: str) -> str:
    where = f"{what}={os.environ.get(what)!r}: " if what and what in os.environ else ""
    return f"{where}no session can be made under {path}: {reason}"


def new_session_id(name: str | None = None) -> str:
    """Time, name and a random part: two sessions made in one second (two replays of one recording) differ."""
    return "-".join(part for part in (time.strftime("%Y%m%d-%H%M%S"), name, secrets.token_hex(3)) if part)


def new_session_dir(name: str | None = None, root: Path | None = None) -> Path:
    """A new, empty, owner-only session directory under `root` (default sessions_root()), named by time and `name`."""
    parent = private_dir(root or sessions_root(), None if root else HOME_ENV)
    for _ in range(10):
        path = parent / new_session_id(name)
        try:
            path.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # the random part met its twin: draw again
        except OSError as error:
            raise WorkbenchHomeError(_cannot(parent, None if root else HOME_ENV, error.strerror)) from None
        os.chmod(path, PRIVATE_DIR_MODE)
        return path
    raise WorkbenchHomeError(_cannot(parent, None, "ten new session ids were all taken"))
