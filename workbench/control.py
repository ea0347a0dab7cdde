"""The control vocabulary every part of a session speaks: session states, command kinds and states, runner
directives, event kinds, the operator token and its signatures, the checkpoint marker, the budget metric prefix.

Views (through Session) write user commands; the supervisor answers them and turns them into runner directives; the
runner inside verl (or a replay) executes directives at its step boundary. All of them name things from here, so no
part imports another's module for a word of the protocol.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------------------------------------ session states
STARTING, RUNNING, PAUSED, RESTARTING, STOPPING = "starting", "running", "paused", "restarting", "stopping"
STOPPED, FINISHED, FAILED = "stopped", "finished", "failed"
# The state says active but the supervisor process is gone: said by every reader, written by the next operator
# handle (the watchdog in session.py, which also ends what is left of the run).
LOST = "lost"
ACTIVE_STATES = (STARTING, RUNNING, PAUSED, RESTARTING, STOPPING)
ENDED_STATES = (STOPPED, FINISHED, FAILED, LOST)
# The supervisor exits in these (a failed session's waits for a rollback): it answers what was queued before the state
# was written, and no apply is queued once it is (Session.apply: Store.put_command's unless_state), so no change is left
# unanswered; other commands wait for their answer and say so when the supervisor has exited.
CLOSED_STATES = (STOPPED, FINISHED)

# ------------------------------------------------------------------------------------------------ user commands
APPLY, PAUSE, RESUME, STOP, ROLLBACK, TELEMETRY = "apply", "pause", "resume", "stop", "rollback", "telemetry"
USER_COMMANDS = (APPLY, PAUSE, RESUME, STOP, ROLLBACK, TELEMETRY)

# ------------------------------------------------------------------------------------------------ runner directives
# Executed by the runner (runner/trainer.py) or a replay (replay.py) at the next step boundary.
RUNNER_PAUSE = "runner.pause"
RUNNER_RESUME = "runner.resume"
RUNNER_HOT_APPLY = "runner.hot_apply"
RUNNER_CHECKPOINT_EXIT = "runner.checkpoint_exit"
RUNNER_STOP = "runner.stop"
RUNNER_REBUILD = "runner.rebuild"  # rebuild verl, or its rollout, in place under the new plan (runner/rebuild.py)
RUNNER_DIRECTIVES = (RUNNER_PAUSE, RUNNER_RESUME, RUNNER_HOT_APPLY, RUNNER_CHECKPOINT_EXIT, RUNNER_STOP, RUNNER_REBUILD)

# ------------------------------------------------------------------------------------------------ command states
QUEUED = "queued"
TAKEN_BY_SUPERVISOR, TAKEN_BY_RUNNER = "supervisor", "runner"
DONE, FAILED_COMMAND, REFUSED = "done", "failed", "refused"
# An apply goes on: accepted (a hot directive is queued) → applied; or restarting → resumed; or not_applied when
# the run ended, crashed or was stopped before the change took effect.
ACCEPTED, APPLIED, RESUMED, NOT_APPLIED = "accepted", "applied", "resumed", "not_applied"
DROPPED = "dropped"  # a runner directive no run took (the run ended first)
ANSWERED = (DONE, FAILED_COMMAND, REFUSED, ACCEPTED, RESTARTING, APPLIED, RESUMED, NOT_APPLIED, DROPPED)
FINAL = (DONE, FAILED_COMMAND, REFUSED, APPLIED, RESUMED, NOT_APPLIED, DROPPED)
CARRIED_OUT = (DONE, ACCEPTED, RESTARTING, APPLIED, RESUMED)  # what a recording's operator got done

# ------------------------------------------------------------------------------------------------ event kinds
EV_LAUNCHED, EV_STARTED, EV_RUNTIME = "launched", "started", "runtime"
EV_PAUSED, EV_RESUMED = "paused", "resumed"
EV_APPLIED, EV_RESTART_PENDING, EV_CHECKPOINT, EV_EXITING = "applied", "restart_pending", "checkpoint", "exiting"
EV_NOT_RESUMED, EV_NOT_APPLIED, EV_REFUSED, EV_ERROR, EV_CRASH = (
    "not_resumed", "not_applied", "refused", "error", "crash")
EV_STOPPED, EV_FINISHED = STOPPED, FINISHED
EV_ADVICE, EV_TELEMETRY, EV_PROMETHEUS, EV_REPLAY = "advice", "telemetry", "prometheus", "replay"
EV_FAILED, EV_LOST = FAILED, LOST  # the supervisor could not go on (start-up, store); the supervisor is gone
EV_REBUILD_FAILED = "rebuild_failed"  # an in-place rebuild failed before verl was ready: the supervisor relaunches
# Events about a session's own control and life cycle (a replay writes its own, not the recording's).
CONTROL_EVENT_KINDS = frozenset({
    EV_LAUNCHED, EV_STARTED, EV_PAUSED, EV_RESUMED, EV_APPLIED, EV_RESTART_PENDING, EV_CHECKPOINT, EV_EXITING,
    EV_NOT_RESUMED, EV_NOT_APPLIED, EV_REFUSED, EV_ERROR, EV_CRASH, EV_STOPPED, EV_FINISHED, EV_ADVICE,
    EV_REBUILD_FAILED,
})

# ------------------------------------------------------------------------------------------------ files
STORE_FILE = "session.sqlite"  # a session directory's store (store.py)
TOKEN_FILE = "operator.token"
LOG_DIR = "logs"
CHECKPOINT_DIR = "checkpoints"
# Why the supervisor failed, where the store could not take it (unwritable, disk full): the session handle reads it.
# The supervisor reserves the file's space when it starts, so that a full disk can still take the reason.
FAILURE_FILE = "supervisor.failure"
FAILURE_NOTE_BYTES = 4096
# verl's checkpoint marker: which step the newest checkpoint holds (a relaunch resumes from it).
CHECKPOINT_MARKER = Path(CHECKPOINT_DIR) / "latest_checkpointed_iteration.txt"
# The composed verl config of each segment, written by whoever launches the run (the runner reads no plan).
CONFIG_DIR = "configs"


def segment_config_path(session_dir: Path, segment_id: int) -> Path:
    return Path(session_dir) / CONFIG_DIR / f"segment-{segment_id}.yaml"

# ------------------------------------------------------------------------------------------------ a run's environment
# How the supervisor tells a run (and, through Ray's runtime env, the trainer inside it) what to do.
SESSION_ENV = "WORKBENCH_SESSION_DIR"
SEGMENT_ENV = "WORKBENCH_SEGMENT_ID"
CRITIC_GPUS_ENV = "WORKBENCH_CRITIC_GPUS"
SKIP_CRITIC_RESUME_ENV = "WORKBENCH_SKIP_CRITIC_RESUME"  # the critic's architecture changed: start it afresh
ACTOR_HF_ENV = "WORKBENCH_ACTOR_HF"  # the GPU count changed: start from these exported actor weights
ACTOR_HF_EXPORT_ENV = "WORKBENCH_ACTOR_HF_EXPORT"  # "0": checkpoints need no HF export (checkpoints.hf_export_needed)
STEP_OFFSET_ENV = "WORKBENCH_STEP_OFFSET"  # steps already trained before a restart from HF weights
SUPERVISOR_PID_ENV = "WORKBENCH_SUPERVISOR_PID"  # the supervisor that started the run: the run dies with it
# How often the runner polls verl's V1 replay buffer for finished rollouts (verl's own: 2 s; runner/replay_buffer.py
# says why), and the variable that sets another interval. The advisor quotes it.
REPLAY_POLL_S = 0.05
REPLAY_POLL_ENV = "VERL_WORKBENCH_REPLAY_POLL_S"

# ------------------------------------------------------------------------------------------------ metrics
# The runner adds the token budgets in force to every step's metrics under this prefix.
BUDGET_METRIC_PREFIX = "workbench/budget/"


def latest_checkpoint_step(session_dir: Path) -> int | None:
    marker = Path(session_dir) / CHECKPOINT_MARKER
    return int(marker.read_text().strip()) if marker.exists() else None


def reserve_failure_note(session_dir: Path) -> None:
    """Set aside the space for a failure note (blank until written)."""
    path = Path(session_dir) / FAILURE_FILE
    if not path.exists():
        path.write_bytes(b" " * FAILURE_NOTE_BYTES)


def write_failure_note(session_dir: Path, reason: str) -> None:
    """Write the reason in the reserved space (in place: a full disk takes it), then trim the rest."""
    data = reason.encode()[:FAILURE_NOTE_BYTES - 1] + b"\n"
    fd = os.open(Path(session_dir) / FAILURE_FILE, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def read_failure_note(session_dir: Path) -> str | None:
    try:
        return (Path(session_dir) / FAILURE_FILE).read_text(errors="replace").strip() or None
    except OSError:
        return None


def write_checkpoint_marker(session_dir: Path, step: int) -> None:
    marker = Path(session_dir) / CHECKPOINT_MARKER
    marker.parent.mkdir(exist_ok=True)
    marker.write_text(str(step))


# ------------------------------------------------------------------------------------------------ operator signing
# Each operator command carries an HMAC over a fresh nonce, the kind and the payload, made with the session's operator
# token. The token never enters the store (every viewer can read it), and a copied signature can't be used twice.
SIGNATURE_FIELDS = ("nonce", "signature")


def signature(token: str, kind: str, nonce: str, payload: dict[str, Any]) -> str:
    message = json.dumps([nonce, kind, payload], sort_keys=True, default=str).encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def signed(token: str, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """The payload of an operator command, signed with the operator token."""
    nonce = secrets.token_hex(12)
    return {**payload, "nonce": nonce, "signature": signature(token, kind, nonce, payload)}


def new_token() -> str:
    return secrets.token_hex(16)


class SignatureCheck:
    """Checks operator signatures for one session; each nonce is good once."""

    def __init__(self, token: str):
        self._token = token
        self._used: set[str] = set()

    def verify(self, kind: str, payload: dict[str, Any]) -> bool:
        """Whether the command came from the operator; takes the signature fields out of `payload`."""
        return self.refusal(kind, payload) is None

    def refusal(self, kind: Any, payload: Any) -> str | None:
        """Why a command row is refused (None: the operator signed it): checked in this order, each before
        anything reads the row further — its shape (a known kind, a JSON object as payload), then its signature.
        Takes the signature fields out of a well-shaped `payload`."""
        if not isinstance(kind, str) or kind not in USER_COMMANDS + RUNNER_DIRECTIVES:
            return f"malformed command: unknown kind {str(kind)[:40]!r}"
        if not isinstance(payload, dict):
            return "malformed command: its payload is not a JSON object"
        nonce, sig = (payload.pop(field, None) for field in SIGNATURE_FIELDS)
        if not isinstance(nonce, str) or not isinstance(sig, str) or nonce in self._used:
            return "not signed: attach with the operator token to control"
        try:
            expected = signature(self._token, kind, nonce, payload)
            signed_by_operator = hmac.compare_digest(sig.encode(), expected.encode())
        except (TypeError, ValueError, RecursionError):  # a payload json can't write again
            return "malformed command: its payload can't be signed"
        if not signed_by_operator:
            return "not the operator: attach with the operator token to control"
        self._used.add(nonce)
        return None
