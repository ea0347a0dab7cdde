"""What a Session hands out: the preview of a change (and the one rule that judges a change), the handle of a change
on its way, the poll cursor, and the errors a handle raises.

`judge_change` validates, diffs and classifies a change once; Session.preview and the supervisor's apply both call
it (the supervisor with verl's own config check on top, for a live run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from omegaconf import OmegaConf

from . import control as c
from . import redact
from .knob import RELAUNCH, least_kept, restart_steps
from .knobs import KNOBS
from .plan import PLAN_PROBLEM, Plan, PlanError
from .recordings import no_segment_words
from .store import APPEND_TABLES, POLL_FIELDS

NO_CHANGE = "no change: give knob values that differ from the plan in force"


class ReadOnlySession(PermissionError):
    """A control asked of a handle without the operator token (or with a wrong one)."""


class ApplyRefused(PlanError, RuntimeError):
    """The supervisor refused a change (`.problems` keyed by knob, as PlanError's); nothing changed."""


# ------------------------------------------------------------------------------------------------ the preview rule
@dataclass(frozen=True)
class Preview:
    """What applying `changes` would do, judged against the plan in force; nothing was queued.

    mode: "hot" | "restart" | None (no change, or invalid); diff: one {"knob", "before", "after", "apply"} per
    changed knob; keeps: a restart's, what of the running verl it leaves alone (knob.REBUILD_KEEPS: a live run
    rebuilds verl in place keeping it, "relaunch" relaunches it); problems / warnings: knob name (or "plan") →
    message; offers: on a replay that can't play the change, the changes it can (recordings.py)."""

    changes: dict[str, Any]
    mode: str | None
    diff: list[dict[str, Any]]
    problems: dict[str, str]
    warnings: dict[str, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    prediction: Any = None  # workbench.predict.Prediction of the new plan, when a segment measured enough steps
    offers: list[dict[str, Any]] = field(default_factory=list)
    keeps: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        if not self.ok:
            return "; ".join(self.problems.values())
        return f"{self.mode}: " + ", ".join(f"{d['knob']} {d['before']!r} → {d['after']!r}" for d in self.diff)


@dataclass(frozen=True)
class JudgedChange:
    """A change that passed the checks: the new plan, the knobs it changes and how it applies."""

    new: Plan
    diff: list[dict[str, Any]]  # {"knob", "before", "after", "apply"} per changed knob
    mode: str  # "hot" | "restart"
    keeps: str = ""  # a restart's: what of the running verl it leaves alone (knob.REBUILD_KEEPS)

    @property
    def changes(self) -> dict[str, Any]:
        return {d["knob"]: d["after"] for d in self.diff}


def judge_change(current: Plan, changes: dict[str, Any], *, gpu_count: int | None,
                 with_verl: bool, in_place: bool = True) -> JudgedChange:
    """Validate `changes` on top of `current`, diff and classify them; PlanError (problems keyed by knob) for a
    bad change or one that changes nothing. with_verl: also run verl's own config check (seconds: the supervisor
    does it once, for a live run). in_place: whether the run rebuilds verl in place where a restart allows it (a
    replay plays the recorded relaunch); a restart's `keeps` is RELAUNCH where it doesn't."""
    new = current.with_changes(changes)
    new.validate(gpu_count=gpu_count, with_verl=with_verl)
    entries = current.diff(new)
    diff = [{"knob": d["knob"], "before": d["old"], "after": d["new"], "apply": d["apply"]}
            for d in entries if d["knob"] is not None]
    if not diff:
        raise PlanError([NO_CHANGE])
    mode = "restart" if any(entry["apply"] == "restart" for entry in entries) else "hot"
    if mode == "hot":
        return JudgedChange(new, diff, mode)
    keeps = restart_keeps(current, new, entries) if in_place and in_place_allowed() else RELAUNCH
    return JudgedChange(new, diff, mode, keeps)


IN_PLACE_ENV = "WORKBENCH_IN_PLACE"


def in_place_allowed() -> bool:
    """Restart-class changes rebuild verl in place where they allow it, unless WORKBENCH_IN_PLACE=0 (every one is
    then relaunched: to compare, or should a verl release break the rebuild)."""
    return os.environ.get(IN_PLACE_ENV, "1") != "0"


def restart_keeps(current: Plan, new: Plan, entries: list[dict[str, Any]]) -> str:
    """What a restart-class change leaves of the running verl (knob.REBUILD_KEEPS): the least any of its knobs keeps.
    A relaunch for a verl key no knob owns; for a plan holding credentials (the TaskRunner, which rebuilds, is not
    handed them); from a trainer mode other than sync, whose rollout generates through the
    step boundary (partial rollouts in flight: a relaunch's resume re-issues them, as verl designed); and to
    separate_async (standalone rollout replicas on GPUs of their own). The in-place rebuild was proven from sync, on
    one GPU's colocated replicas (bench/gpu/inplace_probe.py)."""
    if any(entry["knob"] is None and entry["apply"] == "restart" for entry in entries):
        return RELAUNCH
    if current.knob_values()["trainer_mode"] != "sync" or new.knob_values()["trainer_mode"] == "separate_async":
        return RELAUNCH
    if redact.placeholders(OmegaConf.to_container(new.config, resolve=False)):
        return RELAUNCH  # credentials travel to the runner process only (redact.py), not to its TaskRunner
    return least_kept(*(KNOBS[entry["knob"]].runner.keeps for entry in entries
                        if entry["knob"] is not None and entry["apply"] == "restart"))


def preview_change(current: Plan, changes: Any, *, gpu_count: int | None, session_words: str | None,
                   restart_pending: bool, in_place: bool = True) -> tuple[Preview, Plan | None]:
    """The preview rule: what applying `changes` would do (and the new plan), with the fast checks only.
    session_words: why no run takes changes (e.g. "session x is stopped: no run takes changes"), None while one
    does. in_place: as judge_change's."""
    changes = dict(changes) if isinstance(changes, dict) else changes
    if not isinstance(changes, dict) or not changes:
        return refusal(changes if isinstance(changes, dict) else {}, NO_CHANGE if not changes else
                       "changes must be a dict of knob name → value"), None
    if session_words:
        return refusal(changes, session_words), None
    if restart_pending:
        return refusal(changes, "a restart-class change is on its way; wait until it has resumed"), None
    try:
        judged = judge_change(current, changes, gpu_count=gpu_count, with_verl=False, in_place=in_place)
    except PlanError as error:
        return Preview(changes, None, [], error.problems, messages=error.messages), None
    return Preview(changes, judged.mode, judged.diff, {}, keeps=judged.keeps), judged.new


def unplayable(preview: Preview, offers: list[dict[str, Any]]) -> Preview:
    """A replay's refusal of a change no recorded segment ran: refused at once (never "accepted" first), its mode
    and diff kept (what it would do where it could be played), with the changes the replay can take (`offers`)."""
    words = no_segment_words(offers)
    return dataclasses.replace(preview, problems={PLAN_PROBLEM: words}, messages=[words], offers=offers)


def with_prediction(preview: Preview, prediction: Any) -> Preview:
    """The preview with the what-if prediction of its new plan (None: nothing measured enough yet) and its
    warnings (e.g. a predicted out-of-memory)."""
    if prediction is None:
        return preview
    return dataclasses.replace(preview, prediction=prediction, warnings={**preview.warnings, **prediction.warnings})


def refusal(changes: dict[str, Any], message: str) -> Preview:
    return Preview(changes, None, [], {PLAN_PROBLEM: message}, messages=[message])


# ------------------------------------------------------------------------------------------------ a change on its way
class CommandSource(Protocol):
    """What a handle reads its command through: the Session that queued it."""

    id: str
    state: str
    failure: str | None

    def command(self, command_id: int) -> dict[str, Any]: ...

    def supervisor_alive(self) -> bool: ...


_HANDLE_STATE = {
    c.QUEUED: "queued", c.TAKEN_BY_SUPERVISOR: "queued", c.ACCEPTED: "accepted", c.RESTARTING: "restarting",
    c.APPLIED: "applied", c.RESUMED: "resumed", c.REFUSED: "refused", c.FAILED_COMMAND: "refused",
    c.NOT_APPLIED: "not_applied",
}
HANDLE_FINAL = ("applied", "resumed", "refused", "not_applied")


class ApplyResult:
    """A change on its way: `state` goes queued → accepted → applied (hot, at `step`), or queued → restarting →
    resumed (restart, at `step`; `keeps`: what of the running verl it kept, knob.REBUILD_KEEPS: "relaunch" when
    verl was relaunched); or ends refused (`problems` keyed by knob) or not_applied (the run ended, crashed or was
    stopped first; `message` says which). `refresh()` reads the newest state; `wait()` until done."""

    def __init__(self, session: CommandSource, command_id: int, mode: str | None, changes: dict[str, Any]):
        self._session = session
        self.command_id = command_id
        self.mode = mode
        self.changes = changes
        self.state = "queued"
        self.step: int | None = None
        self.keeps = ""
        self.problems: dict[str, str] = {}
        self.message = "queued: waiting for the supervisor"

    @property
    def done(self) -> bool:
        return self.state in HANDLE_FINAL

    def refresh(self) -> "ApplyResult":
        command = self._session.command(self.command_id)
        self._read(command["state"], json.loads(command["result"]) if command["result"] else None)
        if not self.done and not self._session.supervisor_alive():
            # Nobody is left to carry it out (the supervisor failed where its store could not say so, or is gone
            # and no operator handle has marked it yet): it was not applied, whatever the store still says.
            session = self._session
            why = session.failure or f"session {session.id} is {session.state}"
            self._read(c.NOT_APPLIED, {"message": f"the supervisor is gone: {why}"})
        return self

    def _read(self, state: str, result: Any) -> None:
        self.state = _HANDLE_STATE.get(state, state)
        result = result if isinstance(result, dict) else {"message": str(result)} if result else {}
        self.mode = result.get("mode", self.mode)
        self.step = result.get("step", self.step)
        self.keeps = result.get("keeps", self.keeps)
        what = ", ".join(f"{k}={v!r}" for k, v in self.changes.items())
        if self.state in ("refused", "not_applied"):
            self.problems = dict(result.get("problems") or {PLAN_PROBLEM: result.get("message", "refused")})
            reason = result.get("message") or "; ".join(self.problems.values())
            self.message = f"{'refused' if self.state == 'refused' else 'not applied'}: {reason}"
        elif self.state == "accepted":
            self.message = f"accepted: {what} applies at the next step boundary"
        elif self.state == "restarting":
            self.message = f"restarting: {restart_steps(self.keeps)} with {what}"
        elif self.state == "applied":
            self.message = f"applied hot: {what} from step {self.step}"
        elif self.state == "resumed":
            self.message = f"resumed at step {self.step} with {what}"
        else:
            self.message = "queued: waiting for the supervisor"

    def wait(self, timeout: float = 600.0, poll: float = 0.1, until: Iterable[str] = HANDLE_FINAL) -> "ApplyResult":
        """Refresh until the state is one of `until` (default: done); TimeoutError after `timeout` seconds."""
        until = tuple(until)
        deadline = time.time() + timeout
        while self.refresh().state not in until:
            if time.time() > deadline:
                raise TimeoutError(f"apply {self.command_id}: still {self.state} after {timeout:.0f} s")
            time.sleep(poll)
        return self

    def __repr__(self) -> str:
        return f"<ApplyResult {self.command_id} {self.mode} {self.state}: {self.message}>"


def wait_for_answer(source: CommandSource, command_id: int, kind: str, timeout_s: float,
                    no_supervisor: Callable[[str], str]) -> Any:
    """Wait for the supervisor's answer to a control command and return its result; RuntimeError if it failed,
    was refused or nobody is left to answer (no_supervisor(kind) says why), TimeoutError after timeout_s."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        alive = source.supervisor_alive()  # before reading the command: it may answer, then exit
        cmd = source.command(command_id)
        if cmd["state"] in c.ANSWERED:
            result = json.loads(cmd["result"]) if cmd["result"] else None
            if cmd["state"] != c.DONE:
                raise RuntimeError(f"{kind} {cmd['state']}: {result}")
            return result
        if not alive:
            raise RuntimeError(no_supervisor(kind))
        time.sleep(0.05)
    raise TimeoutError(f"{kind}: the supervisor did not answer within {timeout_s:.0f} s")


# ------------------------------------------------------------------------------------------------ poll
@dataclass(frozen=True)
class PollCursor:
    """What a poll saw: the raw poll row (largest ids, revisions, raw state) and the state decoded from it."""

    row: tuple
    state: str


@dataclass(frozen=True)
class Poll:
    cursor: PollCursor
    changed: frozenset[str]  # "steps", "samples", "procs", "workers", "events", "segments", "commands", "meta"
    since: dict[str, int]  # table -> last row id the previous cursor had seen (read only newer rows)
    state: str
    last_step: int | None


_ID_FIELDS = (*APPEND_TABLES, "segments", "commands")
_FIELD = {name: index for index, name in enumerate(POLL_FIELDS)}
_CHANGED_BY = {"rev:meta": "meta", "rev:segments": "segments", "rev:commands": "commands", "state": "meta",
               "supervisor_pid": "meta", "last_step": "steps"}


def poll_since(row: tuple, cursor: PollCursor | None, state_of: Callable[[dict[str, Any]], str]) -> Poll:
    """What changed between `cursor` and the store's poll row `row`; state_of turns the row's raw state and
    supervisor pid into the session's state (read only when something changed, or while it is active)."""
    last_step = row[_FIELD["last_step"]]
    if cursor is not None and row == cursor.row:
        # Nothing was written; only a supervisor that died says nothing: look again while the state is active.
        state = _state(row, state_of) if cursor.state in c.ACTIVE_STATES else cursor.state
        return Poll(PollCursor(row, state), frozenset(), {t: row[_FIELD[t]] for t in _ID_FIELDS}, state, last_step)
    state = _state(row, state_of)
    if cursor is None:
        changed = frozenset({*_ID_FIELDS, "meta"})
        since = dict.fromkeys(_ID_FIELDS, 0)
    else:
        changed = frozenset(_CHANGED_BY.get(name, name) for name, i in _FIELD.items() if row[i] != cursor.row[i])
        since = {t: cursor.row[_FIELD[t]] for t in _ID_FIELDS}
    return Poll(PollCursor(row, state), changed, since, state, last_step)


def _state(row: tuple, state_of: Callable[[dict[str, Any]], str]) -> str:
    state, pid = (row[_FIELD[name]] for name in ("state", "supervisor_pid"))
    return state_of({"state": json.loads(state) if state else c.STARTING,
                     "supervisor_pid": json.loads(pid) if pid else None})
