"""A session's life outside any kernel: its directory and token, the supervisor process that owns its run, what kind
of run it is, and whether that supervisor still lives.

Session (session.py) is the face a notebook holds; this module starts supervisors and reads their life signs.
"""

from __future__ import annotations

import hmac
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from . import control as c
from . import verl_config
from .paths import made_session_dir, session_stores
from .plan import Plan
from .procs import end_process_session, process_alive
from .recordings import REPLAY_ENDED
from .store import STORE_FILE, Store

LIVE, REPLAY = "live", "replay"
RECORDINGS_DIR = Path(__file__).resolve().parent / "assets" / "recordings"


@dataclass(frozen=True)
class SessionKind:
    """What a session runs: a live verl run, or a recording played back (and how it is played)."""

    name: str  # LIVE or REPLAY
    recording: str | None = None  # replay: the recorded session's directory
    speed: float | None = None  # replay: recorded seconds per second
    follow: bool = True  # replay: the recorded operator's commands are re-issued
    startup_speed: float | None = None  # replay: the speed of verl's recorded start-up, where not `speed`
    recorded_at: float | None = None  # replay: when the recording was made (Unix time), where it says
    recorded_date: str = ""  # replay: the recording's own date note, for recordings that carry no time
    gpu_name: str = ""  # the GPU the recorded run used, where the recording says

    @property
    def is_replay(self) -> bool:
        return self.name == REPLAY

    @property
    def time_scale(self) -> float:
        """Recorded seconds per wall-clock second: a replay's speed, 1 for a live run."""
        return self.speed if self.is_replay and self.speed and self.speed > 0 else 1.0

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> "SessionKind":
        """The kind a session's meta records (a session from before kinds were recorded is live)."""
        if meta.get("kind", LIVE) != REPLAY:
            return cls(LIVE, gpu_name=str(meta.get("gpu_name") or ""))
        recorded_at = meta.get("recorded_at")
        startup = meta.get("startup_speed")
        return cls(REPLAY, recording=meta.get("recording"), speed=float(meta.get("speed", 1.0)),
                   follow=bool(meta.get("follow", True)), startup_speed=float(startup) if startup else None,
                   recorded_at=float(recorded_at) if isinstance(recorded_at, (int, float)) else None,
                   recorded_date=str(meta.get("date") or ""), gpu_name=str(meta.get("gpu_name") or ""))


def gpu_count() -> int | None:
    """GPUs NVML sees on this machine, or None without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def resolve_recording(recording: str | os.PathLike) -> Path:
    """A recording by path or by name under workbench/assets/recordings/."""
    path = Path(recording)
    if (path / STORE_FILE).exists():
        return path
    bundled = RECORDINGS_DIR / str(recording)
    if (bundled / STORE_FILE).exists():
        return bundled
    raise FileNotFoundError(f"{recording}: no recorded session there (expected {STORE_FILE})")


def check_replay_speeds(speed: Any, startup_speed: Any = None) -> None:
    """ValueError unless a replay's speed (and its start-up's, where given) are positive numbers."""
    for name, value in (("speed", speed), ("startup_speed", startup_speed)):
        if value is None and name == "startup_speed":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name}={value!r}: a replay's {name} is a positive number (recorded seconds per "
                             "second)")


def replay_launch(recording: Path, *, speed: float, follow: bool, crash_at_step: int | None,
                  startup_speed: float | None = None) -> tuple[str, dict[str, Any], list[str]]:
    """What a replay of `recording` starts with: its first segment's plan, the meta it carries over (what the
    recording says about its machine, gpu_count …, not its life cycle) and the supervisor's arguments."""
    recorded = Store(recording, readonly=True)
    try:
        first_plan = recorded.rows("segments")[0]["plan_json"]
        recorded_meta = recorded.meta()
    finally:
        recorded.close()
    meta = {k: v for k, v in recorded_meta.items() if k not in ("state", "supervisor_pid", "initial_plan", "created")}
    meta.update(kind=REPLAY, recording=str(recording), recorded_at=recorded_meta.get("created"), speed=speed,
                follow=follow, startup_speed=startup_speed)
    args = ["--replay", str(recording), "--speed", str(speed)]
    if startup_speed is not None:
        args += ["--startup-speed", str(startup_speed)]
    if not follow:
        args.append("--no-follow")
    if crash_at_step is not None:
        args += ["--crash-at-step", str(crash_at_step)]
    return first_plan, meta, args


def spawn_supervisor(plan: Plan, *, name: str | None, root: Path | None, meta: dict[str, Any],
                     args: list[str]) -> tuple[Path, str]:
    """A new session directory with its operator token, store and log folder, and its supervisor started in a
    process session of its own; returns (directory, token)."""
    # A failure before the supervisor runs (a full disk, no permission) leaves no half-made session behind.
    with made_session_dir(name, root) as directory:
        token = c.new_token()
        token_path = directory / c.TOKEN_FILE
        token_path.touch(mode=0o600)
        token_path.write_text(token)
        store = Store(directory)
        store.set_meta(created=time.time(), initial_plan=plan.to_json(), state=c.STARTING, **meta)
        (directory / c.LOG_DIR).mkdir(mode=0o700, exist_ok=True)
        # The plan's credentials go to the supervisor (and its runs) by environment, never into the store.
        env = {**os.environ, **plan.secrets_env()}
        package_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        log_fd = os.open(directory / c.LOG_DIR / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(log_fd, "ab") as log:
            # A new process session: the supervisor outlives the kernel (and page reloads) that started it.
            supervisor = subprocess.Popen(
                [sys.executable, "-m", "workbench.supervisor", "--session", str(directory), *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )
    # Known from the start: a supervisor that dies before it writes a word is seen gone, not "starting" for ever.
    store.set_meta(supervisor_pid=supervisor.pid)
    store.close()
    return directory, token


def read_token(directory: Path) -> str | None:
    """The session's operator token, where this process may read it (the user who started the session)."""
    try:
        return (directory / c.TOKEN_FILE).read_text().strip()
    except (PermissionError, FileNotFoundError):
        return None


def token_matches(directory: Path, token: str) -> bool:
    """Whether `token` is the session's operator token. Where this process cannot read the token file it cannot
    tell, and says yes: the supervisor still refuses every command a wrong token signed."""
    expected = read_token(directory)
    return bool(token) and (expected is None or hmac.compare_digest(expected.encode(), token.encode()))


def effective_state(meta: Mapping[str, Any], directory: Path) -> str:
    """The recorded state; "failed" when the supervisor left a failure note (its store could not take the state);
    "lost" when it says active but its supervisor process is gone."""
    state = meta.get("state", c.STARTING)
    if state in c.ACTIVE_STATES and c.read_failure_note(directory):
        return c.FAILED
    pid = meta.get("supervisor_pid")
    if state in c.ACTIVE_STATES and pid is not None and not process_alive(int(pid)):
        return c.LOST
    return state


def mark_lost(store: Store, meta: Mapping[str, Any], directory: Path) -> None:
    """The watchdog: the session says it runs but its supervisor is gone (killed, or the machine rebooted). Say so
    in the store (state lost, why, changes in flight not applied) and end what is left of its run: a live run's
    processes share the run's process session, which the supervisor no longer ends. An operator handle does it
    (a viewer can't write)."""
    reason = gone_reason(meta, directory)
    if meta.get("run_pid"):
        end_process_session(int(meta["run_pid"]))
    for command in store.commands_in([c.QUEUED, c.TAKEN_BY_SUPERVISOR, c.ACCEPTED, c.RESTARTING],
                                     kinds=c.USER_COMMANDS):
        final = c.NOT_APPLIED if command["kind"] == c.APPLY else c.FAILED_COMMAND
        store.finish_command(command["id"], final, {"message": reason} if final == c.NOT_APPLIED else reason)
    store.set_meta(state=c.LOST)
    store.add_event(c.EV_LOST, reason, {"supervisor_pid": meta.get("supervisor_pid")})


def list_sessions(root: Path | None = None) -> pd.DataFrame:
    """The sessions under `root` (default: the workbench home's): id, path, kind, state, created, segments, steps."""
    rows = []
    for store_path in session_stores(root):
        store = Store(store_path, readonly=True)
        meta = store.meta()
        rows.append(dict(id=store_path.parent.name, path=str(store_path.parent), kind=meta.get("kind"),
                         state=effective_state(meta, store_path.parent),
                         created=pd.to_datetime(meta.get("created"), unit="s"),
                         segments=store.max_id("segments"), steps=store.max_id("steps")))
        store.close()
    return pd.DataFrame(rows, columns=["id", "path", "kind", "state", "created", "segments", "steps"])


def failure_words(store: Store, state: str, directory: Path) -> str | None:
    """Why a failed or lost session ended, in words (its last failure, crash or lost event); None in other
    states."""
    if state not in (c.FAILED, c.LOST):
        return None
    for event in reversed(store.rows("events")):
        if event["kind"] in (c.EV_FAILED, c.EV_CRASH, c.EV_LOST):
            return event["text"]
    return gone_reason(store.meta(), directory)


def status_words(session_id: str, state: str, failure: str | None) -> str:
    return f"session {session_id} is {state}" + (f": {failure}" if failure else "")


def closed_words(session_id: str, state: str, kind: SessionKind) -> str:
    """Why an ended session takes no change; a replay that played to its end says to play it again."""
    if state == c.FINISHED and kind.is_replay:
        return f"session {session_id} is finished: {REPLAY_ENDED}"
    return f"session {session_id} is {state}: no run takes changes"


def no_supervisor_words(kind: str, session_id: str, state: str, failure: str | None) -> str:
    """Why a control command finds nobody to carry it out."""
    why = f": {failure}" if failure else ""
    if state == c.LOST:
        return f"{kind}: the supervisor of session {session_id} is gone{why}"
    return f"{kind}: session {session_id} is {state} and its supervisor has exited: nothing runs to control{why}"


def wait_until(session: Any, predicate: Callable[[Any], bool], timeout: float, poll: float) -> Any:
    """Poll `predicate(session)` until it holds; TimeoutError after `timeout` seconds (Session.wait_until)."""
    deadline = time.time() + timeout
    while not predicate(session):
        if time.time() > deadline:
            raise TimeoutError(f"session {session.id}: condition not met within {timeout:.0f} s (state {session.state})")
        time.sleep(poll)
    return session


def step_reached(step: int) -> Callable[[Any], bool]:
    """Whether a session (read through Session's face) ran `step`; RuntimeError once it ended before it."""
    def reached(session: Any) -> bool:
        state = session.state  # before the step: a session that ends right after the step has reached it all the same
        last = session.last_step()
        if last is not None and last >= step:
            return True
        if state in c.ENDED_STATES:
            failure = session.failure
            raise RuntimeError(f"session {session.id} is {state} before step {step}"
                               + (f": {failure}" if failure else ""))
        return False

    return reached


def gone_reason(meta: Mapping[str, Any], directory: Path) -> str:
    """Why a supervisor that left no word is gone, as far as its log tells."""
    try:
        last = (directory / c.LOG_DIR / "supervisor.log").read_text(errors="replace").strip().splitlines()[-1:]
    except OSError:
        last = []
    return (f"the supervisor (pid {meta.get('supervisor_pid')}) is gone without a word (killed?)"
            + (f"; its log ends: {last[0].strip()}" if last else ""))


_warming = threading.Lock()
_warmed = False


def warm_plan_checks() -> None:
    """Compose verl's config in the background, once per process, so an operator's first preview does not wait
    for it. Previews run the fast checks only: verl itself (torch with it: a minute on a loaded 2-core machine, in
    every operator page kernel) is imported where its own check runs (the supervisor; a live Start)."""
    global _warmed
    with _warming:
        if _warmed:
            return
        _warmed = True
    threading.Thread(target=verl_config.warm, kwargs={"with_verl": False}, name="warm-plan-checks",
                     daemon=True).start()
