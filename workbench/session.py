"""Session: what a notebook holds. A handle on a session directory whose supervisor process owns the run.

    s = Session.start(Plan.from_verl(overrides=[...]))   # live verl run on this machine's GPUs
    s = Session.replay("h200-proof", speed=20)            # a recorded H200 session played back (no GPU needed)
    s = Session.attach(path_or_id)                         # from any kernel; read-only without the operator token
    s.preview({"actor_token_budget": 8192})                # what Apply would do; nothing queued
    h = s.apply({"actor_token_budget": 8192}, wait=False)  # at once: a handle (queued → accepted → applied at step N)
    s.poll(cursor)                                         # what changed since the cursor, in one cheap query
    s.steps(), s.samples(window_s=600, every_s=1), s.events(), s.segments(), s.knob_table(), s.placement()

The handle itself holds no run: kernels can come and go, the supervisor and the verl run go on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sqlite3
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from . import control as c
from . import verl_config
from .advisor import Finding, advise, findings_frame, segment_costs
from .knobs import KNOB_TABLE_COLUMNS, KNOBS, irrelevant_knobs, knob_defaults, knob_rows
from .paths import new_session_dir, resolve_session_dir, sessions_root
from .plan import PLAN_PROBLEM, Plan, PlanError
from .predict import Prediction, closest_cost
from .predict import predict as predict_plan
from .procs import end_process_session, process_alive
from .store import APPEND_TABLES, POLL_FIELDS, STORE_FILE, Store, StoreError

COMMAND_TIMEOUT_S = 30.0
NO_CHANGE = "no change: give knob values that differ from the plan in force"


class ReadOnlySession(PermissionError):
    pass


class ApplyRefused(PlanError, RuntimeError):
    """The supervisor refused a change (`.problems` keyed by knob, as PlanError's); nothing changed."""


# ------------------------------------------------------------------------------------------------ preview and apply
@dataclass(frozen=True)
class Preview:
    """What applying `changes` would do, judged against the plan in force; nothing was queued.

    mode: "hot" | "restart" | None (no change, or invalid); diff: one {"knob", "before", "after", "apply"} per
    changed knob; problems / warnings: knob name (or "plan") → message."""

    changes: dict[str, Any]
    mode: str | None
    diff: list[dict[str, Any]]
    problems: dict[str, str]
    warnings: dict[str, str] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    prediction: Any = None  # workbench.predict.Prediction of the new plan, when a segment measured enough steps

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        if not self.ok:
            return "; ".join(self.problems.values())
        return f"{self.mode}: " + ", ".join(f"{d['knob']} {d['before']!r} → {d['after']!r}" for d in self.diff)


_HANDLE_STATE = {
    c.QUEUED: "queued", c.TAKEN_BY_SUPERVISOR: "queued", c.ACCEPTED: "accepted", c.RESTARTING: "restarting",
    c.APPLIED: "applied", c.RESUMED: "resumed", c.REFUSED: "refused", c.FAILED_COMMAND: "refused",
    c.NOT_APPLIED: "not_applied",
}
HANDLE_FINAL = ("applied", "resumed", "refused", "not_applied")


class ApplyResult:
    """A change on its way: `state` goes queued → accepted → applied (hot, at `step`), or queued → restarting →
    resumed (restart, at `step`); or ends refused (`problems` keyed by knob) or not_applied (the run ended, crashed
    or was stopped first; `message` says which). `refresh()` reads the newest state; `wait()` until done."""

    def __init__(self, session: "Session", command_id: int, mode: str | None, changes: dict[str, Any]):
        self._session = session
        self.command_id = command_id
        self.mode = mode
        self.changes = changes
        self.state = "queued"
        self.step: int | None = None
        self.problems: dict[str, str] = {}
        self.message = "queued: waiting for the supervisor"

    @property
    def done(self) -> bool:
        return self.state in HANDLE_FINAL

    def refresh(self) -> "ApplyResult":
        command = self._session._store.command(self.command_id)
        self._read(command["state"], json.loads(command["result"]) if command["result"] else None)
        if not self.done and not self._session._supervisor_alive():
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
        what = ", ".join(f"{k}={v!r}" for k, v in self.changes.items())
        if self.state in ("refused", "not_applied"):
            self.problems = dict(result.get("problems") or {PLAN_PROBLEM: result.get("message", "refused")})
            reason = result.get("message") or "; ".join(self.problems.values())
            self.message = f"{'refused' if self.state == 'refused' else 'not applied'}: {reason}"
        elif self.state == "accepted":
            self.message = f"accepted: {what} applies at the next step boundary"
        elif self.state == "restarting":
            self.message = f"restarting: checkpoint at the next step boundary, then relaunch with {what}"
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


class Session:
    def __init__(self, directory: str | os.PathLike, token: str | None = None, *, read_only: bool = False):
        self.dir = Path(directory)
        if read_only:
            token = None
        elif token is None:
            try:
                token = (self.dir / c.TOKEN_FILE).read_text().strip()
            except (PermissionError, FileNotFoundError):
                token = None
        self._token = token
        # A viewer opens the store read-only: no writes, no schema script (the session may be another user's).
        self._store = Store(self.dir, readonly=token is None, create=False)
        self._knobs_by_plan: dict[str, dict[str, Any]] = {}
        if token is not None:
            _warm_plan_checks()

    # ----------------------------------------------------------------- creating and finding sessions
    @classmethod
    def start(
        cls, plan: Plan, *, name: str | None = None, root: Path | None = None, prometheus_port: int | None = None,
    ) -> "Session":
        """Validate the plan against this machine and start a live verl run under a new supervisor.

        prometheus_port: also serve the session's metrics for Prometheus at http://127.0.0.1:PORT/metrics
        (0 picks a free port; `session.meta["prometheus_url"]` says which)."""
        gpus = gpu_count()
        if not gpus:
            raise RuntimeError(
                "no NVIDIA GPU on this machine: a verl PPO run needs CUDA GPUs. "
                "Use Session.replay(...) to explore a recorded H200 session instead."
            )
        plan.validate(gpu_count=gpus)
        meta = {"kind": "live", "gpu_count": gpus, "prometheus_port": prometheus_port}
        return cls._spawn(plan, name=name, root=root, meta=meta, args=[])

    @classmethod
    def replay(
        cls, recording: str | os.PathLike, *, speed: float = 1.0, follow: bool = True, crash_at_step: int | None = None,
        root: Path | None = None, prometheus_port: int | None = None,
    ) -> "Session":
        """Play a recorded session (a session directory, or the name of a bundled one) as a run: the no-GPU demo
        and the CPU test double.

        follow=True re-issues the recorded operator's commands (changes, telemetry, rollback, stop) where the
        recording gave them, so the replay tells the whole recorded story; any command of yours takes control from
        it for good. follow=False leaves every command to you."""
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            raise ValueError(f"speed={speed!r}: a replay's speed is a positive number (recorded seconds per second)")
        recording = resolve_recording(recording)
        recorded = Store(recording, readonly=True)
        first = recorded.rows("segments")[0]
        recorded_meta = recorded.meta()
        # What the recording says about its machine (gpu_count, …) carries over; its life cycle does not.
        meta = {k: v for k, v in recorded_meta.items() if k not in ("state", "supervisor_pid", "initial_plan", "created")}
        meta.update(
            kind="replay", recording=str(recording), recorded_at=recorded_meta.get("created"), speed=speed, follow=follow,
            prometheus_port=prometheus_port,
        )
        recorded.close()
        args = ["--replay", str(recording), "--speed", str(speed)]
        if not follow:
            args.append("--no-follow")
        if crash_at_step is not None:
            args += ["--crash-at-step", str(crash_at_step)]
        return cls._spawn(Plan.from_json(first["plan_json"]), name=f"replay-{recording.name}", root=root, meta=meta, args=args)

    @classmethod
    def _spawn(cls, plan: Plan, *, name, root, meta: dict[str, Any], args: list[str]) -> "Session":
        directory = new_session_dir(name, root)
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
        return cls(directory, token)

    @classmethod
    def attach(
        cls, path_or_id: str | os.PathLike | None = None, token: str | None = None, *, read_only: bool = False,
    ) -> "Session":
        """Attach to a session by directory or id (newest if None). Without the operator token it is read-only;
        read_only=True makes a view that can't control the session even where the token file is readable."""
        return cls(resolve_session_dir(path_or_id), token, read_only=read_only)

    @classmethod
    def list(cls, root: Path | None = None) -> pd.DataFrame:
        rows = []
        for store_path in sorted((root or sessions_root()).glob(f"*/{STORE_FILE}")):
            store = Store(store_path, readonly=True)
            meta = store.meta()
            rows.append(
                dict(
                    id=store_path.parent.name, path=str(store_path.parent), kind=meta.get("kind"),
                    state=_effective_state(meta, store_path.parent), created=pd.to_datetime(meta.get("created"), unit="s"),
                    segments=store.max_id("segments"), steps=store.max_id("steps"),
                )
            )
            store.close()
        return pd.DataFrame(rows, columns=["id", "path", "kind", "state", "created", "segments", "steps"])

    def close(self) -> None:
        self._store.close()

    # ----------------------------------------------------------------- state
    @property
    def id(self) -> str:
        return self.dir.name

    @property
    def is_operator(self) -> bool:
        return self._token is not None

    @property
    def meta(self) -> dict[str, Any]:
        return self._store.meta()

    @property
    def state(self) -> str:
        meta = self.meta
        state = _effective_state(meta, self.dir)
        if state == c.LOST and meta.get("state") != c.LOST and self.is_operator:
            try:
                self._mark_lost(meta)
            except (StoreError, sqlite3.Error) as error:  # e.g. a full disk: it is lost all the same
                warnings.warn(f"session {self.id} is lost, and its store can't say so: {error}")
        return state

    @property
    def failure(self) -> str | None:
        """Why the session failed or was lost, in words; None while it runs or when it ended well."""
        note = c.read_failure_note(self.dir)
        if note:
            return note
        state = self.state
        if state not in (c.FAILED, c.LOST):
            return None
        for event in reversed(self._store.rows("events")):
            if event["kind"] in (c.EV_FAILED, c.EV_CRASH, c.EV_LOST):
                return event["text"]
        return _gone(self.meta, self.dir)

    def _mark_lost(self, meta: dict[str, Any]) -> None:
        """The watchdog: the session says it runs but its supervisor is gone (killed, or the machine rebooted). Say
        so in the store (state lost, why, changes in flight not applied) and end what is left of its run: a live
        run's processes share the run's process session, which the supervisor no longer ends. The next operator
        handle that looks does it (a viewer can't write)."""
        reason = _gone(meta, self.dir)
        if meta.get("run_pid"):
            end_process_session(int(meta["run_pid"]))
        for command in self._store.commands_in([c.QUEUED, c.TAKEN_BY_SUPERVISOR, c.ACCEPTED, c.RESTARTING],
                                               kinds=c.USER_COMMANDS):
            final = c.NOT_APPLIED if command["kind"] == c.APPLY else c.FAILED_COMMAND
            self._store.finish_command(command["id"], final, {"message": reason} if final == c.NOT_APPLIED else reason)
        self._store.set_meta(state=c.LOST)
        self._store.add_event(c.EV_LOST, reason, {"supervisor_pid": meta.get("supervisor_pid")})

    @property
    def plan(self) -> Plan:
        """The plan in force: the newest segment's (or the initial plan before the first segment)."""
        last = self._store.last_segment()
        return Plan.from_json(last["plan_json"] if last else self.meta["initial_plan"])

    def last_step(self) -> int | None:
        return self._store.last_step()

    def __repr__(self) -> str:
        role = "operator" if self.is_operator else "read-only"
        return f"<Session {self.id} {self.state} ({role}) steps={self._store.max_id('steps')}>"

    # ----------------------------------------------------------------- control
    def _require_operator(self, kind: str) -> None:
        if not self.is_operator:
            raise ReadOnlySession(
                f"session {self.id} is attached read-only: {kind} needs its operator token "
                f"({self.dir / c.TOKEN_FILE}, readable by the user who started it)"
            )

    def _put(self, kind: str, payload: dict[str, Any] | None = None) -> int:
        self._require_operator(kind)
        if not self._supervisor_alive():
            raise RuntimeError(self._no_supervisor(kind))
        return self._store.put_command(kind, c.signed(self._token, kind, payload or {}))

    def _command(self, kind: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Queue a command and wait for the supervisor's answer; RuntimeError if it failed or was refused."""
        command_id = self._put(kind, payload)
        deadline = time.time() + COMMAND_TIMEOUT_S
        while time.time() < deadline:
            alive = self._supervisor_alive()  # before reading the command: it may answer, then exit
            cmd = self._store.command(command_id)
            if cmd["state"] in c.ANSWERED:
                result = json.loads(cmd["result"]) if cmd["result"] else None
                if cmd["state"] != c.DONE:
                    raise RuntimeError(f"{kind} {cmd['state']}: {result}")
                return {"id": command_id, "result": result}
            if not alive:
                raise RuntimeError(self._no_supervisor(kind))
            time.sleep(0.05)
        raise TimeoutError(f"{kind}: the supervisor did not answer within {COMMAND_TIMEOUT_S:.0f} s")

    def _supervisor_alive(self) -> bool:
        pid = self.meta.get("supervisor_pid")
        return pid is None or process_alive(int(pid))  # None: it is still starting

    def _no_supervisor(self, kind: str) -> str:
        state, failure = self.state, self.failure
        why = f": {failure}" if failure else ""
        if state == c.LOST:
            return f"{kind}: the supervisor of session {self.id} is gone{why}"
        return f"{kind}: session {self.id} is {state} and its supervisor has exited: nothing runs to control{why}"

    def preview(self, changes: dict[str, Any] | None) -> Preview:
        """What applying `changes` would do (mode, diff against the plan in force, problems keyed by knob), with
        the fast checks (knob types and ranges, budgets, batch divisibility, placement); nothing is queued and
        nothing raises for bad values. verl's own config check runs once, in the supervisor, when you apply."""
        changes = dict(changes) if isinstance(changes, dict) else changes
        if not isinstance(changes, dict) or not changes:
            return _refusal(changes if isinstance(changes, dict) else {}, NO_CHANGE if not changes else
                            "changes must be a dict of knob name → value")
        state = self.state
        if state in c.ENDED_STATES:
            return _refusal(changes, f"session {self.id} is {state}: no run takes changes")
        if self._store.commands_in([c.RESTARTING], kinds=[c.APPLY]):
            return _refusal(changes, "a restart-class change is on its way; wait until it has resumed")
        current = self.plan
        try:
            new = current.with_changes(changes)
            new.validate(gpu_count=self.meta.get("gpu_count"), with_verl=False)
        except PlanError as error:
            return Preview(changes, None, [], error.problems, messages=error.messages)
        diff = [{"knob": d["knob"], "before": d["old"], "after": d["new"], "apply": d["apply"]}
                for d in current.diff(new) if d["knob"] is not None]
        if not diff:
            return _refusal(changes, NO_CHANGE)
        return self._with_prediction(Preview(changes, current.apply_class(new), diff, {}), new)

    def apply(self, changes: dict[str, Any] | None, wait: bool = False, timeout: float = COMMAND_TIMEOUT_S) -> ApplyResult:
        """Apply a change: returns at once with a handle (see ApplyResult). Bad changes raise PlanError (with
        `.problems` keyed by knob) and nothing is queued. wait=True: return once the supervisor has answered
        (accepted or restarting), raising ApplyRefused if it refused."""
        self._require_operator("apply")
        preview = self.preview(changes)
        if not preview.ok:
            raise PlanError(preview.messages or list(preview.problems.values()))
        command_id = self._put(c.APPLY, {"changes": preview.changes, "gpu_count": self.meta.get("gpu_count")})
        handle = ApplyResult(self, command_id, preview.mode, preview.changes)
        if wait:
            handle.wait(timeout=timeout, until=("accepted", "restarting", *HANDLE_FINAL))
            if handle.state == "refused":
                raise ApplyRefused(handle.problems.values())
        return handle

    def apply_finding(self, finding: Finding, wait: bool = False) -> ApplyResult:
        """Apply a finding's proposed change (checked like any change)."""
        if not finding.change:
            raise ValueError(f"{finding.rule}: this finding proposes no knob change ({finding.expected})")
        return self.apply(finding.change, wait=wait)

    def pause(self) -> None:
        self._command(c.PAUSE)

    def resume(self) -> None:
        self._command(c.RESUME)

    def stop(self, *, now: bool = False, checkpoint: bool = False, wait: bool = True, timeout: float = 180.0) -> str:
        """Stop at the next step boundary (or at once with now=True) and free the GPUs; returns what happened, in
        words. Stopped means stopped in every state: a failed session waiting for a rollback ends too, and one whose
        supervisor is gone (or never started) has what is left of its run ended and says why, at once."""
        self._require_operator(c.STOP)
        if not self._supervisor_alive():
            state, failure = self.state, self.failure  # reading the state runs the watchdog
            return f"session {self.id} is {state}" + (f": {failure}" if failure else "")
        try:
            self._command(c.STOP, {"now": now, "checkpoint": checkpoint})
        except RuntimeError:
            if self._supervisor_alive():
                raise
            wait = False  # it ended meanwhile (e.g. it failed at start-up): nothing runs, as a stop wants
        if wait:
            self.wait_until(lambda s: s.state in c.ENDED_STATES and not s._supervisor_alive(), timeout=timeout)
        state, failure = self.state, self.failure
        return f"session {self.id} is {state}" + (f": {failure}" if failure else "")

    def telemetry(self, on: bool = True) -> None:
        """Turn the NVML sampler off or on (e.g. to measure what it costs)."""
        self._command(c.TELEMETRY, {"on": on})

    def rollback(self) -> int:
        """After a crash: relaunch the last plan that ran good steps, resuming from the newest checkpoint."""
        return self._command(c.ROLLBACK)["result"]["segment"]

    def wait_until(self, predicate: Callable[["Session"], bool], timeout: float = 600.0, poll: float = 0.5) -> "Session":
        deadline = time.time() + timeout
        while not predicate(self):
            if time.time() > deadline:
                raise TimeoutError(f"session {self.id}: condition not met within {timeout:.0f} s (state {self.state})")
            time.sleep(poll)
        return self

    def wait_for_step(self, step: int, timeout: float = 600.0) -> "Session":
        def reached(s: "Session") -> bool:
            state = s.state  # before the step: a session that ends right after the step has reached it all the same
            last = s.last_step()
            if last is not None and last >= step:
                return True
            if state in c.ENDED_STATES:
                failure = s.failure
                raise RuntimeError(f"session {s.id} is {state} before step {step}" + (f": {failure}" if failure else ""))
            return False

        return self.wait_until(reached, timeout=timeout)

    # ----------------------------------------------------------------- cheap reads for many viewers
    def poll(self, cursor: PollCursor | None = None) -> Poll:
        """What changed since `cursor` (None: everything), in one query; nothing is decoded when nothing changed.
        Then read only the rows after `poll.since[table]` (e.g. `steps(since_id=poll.since["steps"])`)."""
        row = self._store.poll_row()
        last_step = row[_FIELD["last_step"]]
        if cursor is not None and row == cursor.row:
            # Nothing was written; only a supervisor that died says nothing: look again while the state is active.
            state = self._poll_state(row) if cursor.state in c.ACTIVE_STATES else cursor.state
            return Poll(PollCursor(row, state), frozenset(), {t: row[_FIELD[t]] for t in _ID_FIELDS}, state, last_step)
        state = self._poll_state(row)
        if cursor is None:
            changed = frozenset({*_ID_FIELDS, "meta"})
            since = dict.fromkeys(_ID_FIELDS, 0)
        else:
            changed = frozenset(
                _CHANGED_BY.get(name, name) for name, i in _FIELD.items() if row[i] != cursor.row[i]
            )
            since = {t: cursor.row[_FIELD[t]] for t in _ID_FIELDS}
        return Poll(PollCursor(row, state), changed, since, state, last_step)

    def _poll_state(self, row: tuple) -> str:
        state, pid = (row[_FIELD[name]] for name in ("state", "supervisor_pid"))
        meta = {"state": json.loads(state) if state else c.STARTING, "supervisor_pid": json.loads(pid) if pid else None}
        return _effective_state(meta, self.dir)

    # ----------------------------------------------------------------- data (pandas, one call away)
    def steps(self, since_id: int = 0) -> pd.DataFrame:
        return self._store.frame("steps", since_id)

    def samples(
        self, since_id: int = 0, *, window_s: float | None = None, every_s: float | None = None,
        gpus: Iterable[int] | None = None, metrics: Iterable[str] | None = None,
    ) -> pd.DataFrame:
        """GPU samples. With every_s: aggregated in SQL per bucket of every_s seconds and GPU (t = bucket start,
        node, gpu, n, and per metric m: m (mean), m_min, m_max; metrics: only these, default all — each costs
        time per row). window_s: only the last that many seconds before the newest sample; gpus: only these GPU
        indices. With neither every_s, window_s nor gpus: every raw row after since_id."""
        if every_s is not None:
            return self._store.sample_buckets(every_s, window_s=window_s, gpus=gpus, metrics=metrics)
        if window_s is not None or gpus is not None:
            return self._store.samples_window(window_s, gpus)
        return self._store.frame("samples", since_id)

    def latest_samples(self) -> pd.DataFrame:
        """The newest sample per (node, gpu)."""
        return self._store.latest_samples()

    def procs(self, since_id: int = 0) -> pd.DataFrame:
        return self._store.frame("procs", since_id)

    def workers(self, since_id: int = 0) -> pd.DataFrame:
        return self._store.frame("workers", since_id)

    def events(self, since_id: int = 0) -> pd.DataFrame:
        return self._store.frame("events", since_id)

    def commands(self, since_id: int = 0) -> pd.DataFrame:
        return self._store.frame("commands", since_id)

    def _knobs_of(self, plan_json: str) -> dict[str, Any]:
        if plan_json not in self._knobs_by_plan:
            self._knobs_by_plan[plan_json] = Plan.from_json(plan_json).knob_values()
        return self._knobs_by_plan[plan_json]

    def segments(self, since_id: int = 0) -> pd.DataFrame:
        """Every plan that ran (segments after since_id) with what changed from the segment before it and what it
        measured: diff (list of {knob, before, after}), diff_text, reason, steps, step_time_s, throughput
        (tokens/s/GPU), util_mean, sm_active_mean and mem_peak_gb of the plan's GPUs while it ran."""
        rows = self._store.rows("segments", since_id=max(0, since_id - 1) if since_id else 0)
        figures = self._store.step_figures(since_segment=since_id).set_index("segment_id")
        out = []
        previous = None
        for seg in rows:
            knobs = self._knobs_of(seg["plan_json"])
            if seg["id"] > since_id:
                before = self._knobs_of(previous["plan_json"]) if previous else {}
                diff = [{"knob": k, "before": before[k], "after": v} for k, v in knobs.items()
                        if previous is not None and before.get(k) != v]
                row = {**seg, "diff": diff, "diff_text": ", ".join(f"{d['knob']}: {d['before']!r} → {d['after']!r}"
                                                                   for d in diff)}
                fig = figures.loc[seg["id"]] if seg["id"] in figures.index else None
                for name in ("steps", "first_step", "last_step", "step_time_s", "throughput"):
                    row[name] = fig[name] if fig is not None else (0 if name == "steps" else math.nan)
                row.update(self._store.sample_figures(seg["started_at"], seg["ended_at"], gpus=knobs["gpus"]))
                out.append(row)
            previous = seg
        columns = ["id", "started_at", "ended_at", "plan_json", "status", "reason", "resumed_from_step", "diff",
                   "diff_text", "steps", "first_step", "last_step", "step_time_s", "throughput", "util_mean",
                   "sm_active_mean", "mem_peak_gb"]
        return pd.DataFrame(out, columns=columns)

    def knob_table(self, segment: int | None = None) -> pd.DataFrame:
        """One row per knob for a segment's plan (default: the plan in force): name, group, kind, value, default,
        changed, apply, min, max, choices, help, relevant, why_irrelevant."""
        plan = self._plan_of(segment)
        irrelevant = irrelevant_knobs(plan.knob_values(), verl_config.roles_in_use(plan.config))
        return pd.DataFrame(knob_rows(plan.knob_values(), knob_defaults(), irrelevant), columns=KNOB_TABLE_COLUMNS)

    def placement(self) -> pd.DataFrame:
        """Per GPU of the plan in force: the roles the plan puts there and the roles whose processes the sampler
        saw there (with their memory), and whether they disagree. Ray picks physical GPUs inside the plan's set,
        so planned roles follow the pools in order (actor pool first, then critic, reward, rollout)."""
        plan = self.plan
        values = plan.knob_values()
        roles = verl_config.roles_in_use(plan.config)
        planned = _planned_roles(values, roles)
        procs = self._store.latest_procs()
        rows = []
        for gpu, want in planned.items():
            here = procs[procs["gpu"] == gpu]
            seen = sorted({atom for role in here["role"] for atom in str(role).split("+")} - _NOT_A_ROLE)
            memory = {f"{r.role} (pid {r.pid})": r.mem_used for r in here.itertuples()}
            unexpected = sorted(set(seen) - set(want))
            mismatch = bool(unexpected)
            message = (f"GPU {gpu}: {', '.join(unexpected)} running here, but the plan puts "
                       f"{', '.join(want) or 'nothing'} here") if mismatch else ""
            rows.append({"gpu": gpu, "planned": want, "actual": seen, "processes": memory,
                         "mem_used": float(here["mem_used"].sum()) if len(here) else math.nan,
                         "mismatch": mismatch, "message": message})
        for gpu in sorted(set(procs["gpu"]) - set(planned)):
            here = procs[procs["gpu"] == gpu]
            seen = sorted({atom for role in here["role"] for atom in str(role).split("+")} - _NOT_A_ROLE)
            if seen:
                rows.append({"gpu": int(gpu), "planned": [], "actual": seen,
                             "processes": {f"{r.role} (pid {r.pid})": r.mem_used for r in here.itertuples()},
                             "mem_used": float(here["mem_used"].sum()), "mismatch": True,
                             "message": f"GPU {gpu} is outside the plan, but {', '.join(seen)} runs there"})
        return pd.DataFrame(rows, columns=["gpu", "planned", "actual", "processes", "mem_used", "mismatch", "message"])

    def _plan_of(self, segment: int | None) -> Plan:
        return Plan.from_json(self._store.segment(segment)["plan_json"]) if segment else self.plan

    def export(self, format: str = "overrides", segment: int | None = None) -> str | list[str]:
        """The plan of a segment (default: the one in force) as Hydra overrides, YAML or a command line. YAML and
        command start with what this machine needed that verl's defaults don't do on their own."""
        plan = self._plan_of(segment)
        if format == "overrides":
            return plan.to_overrides()
        if format not in ("yaml", "command"):
            raise ValueError(f"unknown export format {format!r}: choose one of overrides, yaml, command")
        body = plan.to_yaml() if format == "yaml" else plan.to_command()
        header = self.machine_notes()
        return "".join(f"# {line}\n" for line in header) + body

    def machine_notes(self) -> list[str]:
        """What runs of this session needed that plain verl does not do on this machine (the runner's notes)."""
        notes = [text for text in dict.fromkeys(self._store.frame("events").query("kind == @c.EV_RUNTIME")["text"])]
        if any("flash-attn" in note for note in notes):
            notes.append("verl 0.9.1's critic loader asks for flash_attention_2 whatever the config says: without "
                         "flash-attn, plain verl's critic fails to load (the workbench patches it to sdpa in its "
                         "Ray workers)")
        return notes

    def knob_values(self, segment: int | None = None) -> dict[str, Any]:
        """Every knob's value in a segment's plan (default: the one in force), defaults included."""
        return self._plan_of(segment).knob_values()

    def advice_findings(self, segment_id: int | None = None) -> list[Finding]:
        """The advisor's findings for a segment (default: the newest that ran steps), judged against the plan of
        that segment."""
        steps = self.steps()
        if segment_id is None:
            if steps.empty:
                return []
            segment_id = int(steps["segment_id"].max())
        return advise(steps, self.samples(), self.knob_values(segment_id), segment_id=segment_id, procs=self.procs())

    def advice(self, segment_id: int | None = None) -> pd.DataFrame:
        """advice_findings as a table: one row per finding, most severe first."""
        return findings_frame(self.advice_findings(segment_id))

    def startup_phases(self, segment: int | None = None) -> pd.DataFrame:
        """Where a launch's start-up went: Ray, TaskRunner/dataloader, workers, vLLM (server, engine, compile, KV
        cache, CUDA graphs), first step — read from the segment's log by its own timestamps (workbench/startup.py),
        from the segment's launch to its first step's row. Default: the newest launched segment; a hot-applied
        segment ran in the process its predecessor launched, so that launch is the one shown."""
        from .startup import parse_startup, read_log

        rows = {r["id"]: r for r in self._store.rows("segments")}
        ids = sorted(i for i in rows if (segment is None or i <= segment))
        logs = [i for i in ids if (self.dir / c.LOG_DIR / f"segment-{i}.log").exists()]
        if not logs:
            raise FileNotFoundError(f"session {self.id}: no segment log{'' if segment is None else f' up to segment {segment}'} "
                                    f"in {self.dir / c.LOG_DIR} (recordings carry no logs)")
        launched = logs[-1]
        steps = self.steps()
        first = steps.loc[steps["segment_id"] == launched, "t"] if len(steps) else steps
        return parse_startup(read_log(self.dir / c.LOG_DIR / f"segment-{launched}.log"),
                             launched_at=rows[launched]["started_at"],
                             first_step_end=float(first.min()) if len(first) else None)

    # ----------------------------------------------------------------- what-if and live tuning (predict.py, tune.py)
    def segment_costs(self) -> list:
        """The what-if model's calibration: each segment with enough measured steps (cached until a new step)."""
        newest = self._store.max_id("steps")
        if getattr(self, "_costs", (None,))[0] != newest:
            knobs = {row["id"]: self._knobs_of(row["plan_json"]) for row in self._store.rows("segments")}
            self._costs = (newest, segment_costs(self.steps(), self.samples(), knobs))
        return self._costs[1]

    def predict(self, changes: dict[str, Any]) -> Prediction | None:
        """The plan in force with `changes`: step time per phase and peak GPU memory, with an uncertainty, from
        the measured segment nearest to it (None before any segment measured enough steps). PlanError for bad
        changes. `prediction.frame()` is the per-phase table, `prediction.text` one line."""
        return self._predict(self.plan.with_changes(changes).knob_values())

    def _predict(self, values: dict[str, Any]) -> Prediction | None:
        basis = closest_cost(self.segment_costs(), values)
        return predict_plan(basis, values) if basis is not None else None

    def _with_prediction(self, preview: Preview, new: Plan) -> Preview:
        prediction = self._predict(new.knob_values())
        if prediction is None:
            return preview
        return dataclasses.replace(preview, prediction=prediction, warnings={**preview.warnings,
                                                                             **prediction.warnings})

    def tune(self, knobs: Any = None, **options: Any):
        """Live auto-tune over knob values or candidate changes (see workbench.tune.tune); returns a TuneResult
        whose `trials` is a DataFrame; the best plan stays in force."""
        from .tune import tune

        return tune(self, knobs, **options)


_NOT_A_ROLE = {"driver", "other", "agent_loop"}


def _planned_roles(values: dict[str, Any], roles: verl_config.RolesInUse) -> dict[int, list[str]]:
    gpus = list(values["gpus"])
    pools = [("critic", values["critic_gpus"]), ("reward", values["reward_gpus"]), ("rollout", values["rollout_gpus"])]
    actor = ["actor_rollout_ref", "rollout"]
    if roles.critic and not values["critic_gpus"]:
        actor.append("critic")
    if roles.reward_model and not values["reward_gpus"]:
        actor.append("reward")
    actor_count = len(gpus) - sum(n for _, n in pools)
    planned = {gpu: sorted(actor) for gpu in gpus[:actor_count]}
    at = actor_count
    for role, count in pools:
        planned.update({gpu: [role] for gpu in gpus[at:at + count]})
        at += count
    return planned


def _refusal(changes: dict[str, Any], message: str) -> Preview:
    return Preview(changes, None, [], {PLAN_PROBLEM: message}, messages=[message])


_warming = threading.Lock()
_warmed = False


def _warm_plan_checks() -> None:
    """Import what the plan checks need (verl's role rules pull in torch: seconds) in the background, once per
    process, so an operator's first preview does not wait for it."""
    global _warmed
    with _warming:
        if _warmed:
            return
        _warmed = True
    threading.Thread(target=verl_config.warm, name="warm-plan-checks", daemon=True).start()


def _effective_state(meta: dict[str, Any], directory: Path) -> str:
    """The recorded state; "failed" when the supervisor left a failure note (its store could not take the state);
    "lost" when it says active but its supervisor process is gone."""
    state = meta.get("state", c.STARTING)
    if state in c.ACTIVE_STATES and c.read_failure_note(directory):
        return c.FAILED
    pid = meta.get("supervisor_pid")
    if state in c.ACTIVE_STATES and pid is not None and not process_alive(int(pid)):
        return c.LOST
    return state


def _gone(meta: dict[str, Any], directory: Path) -> str:
    """Why a supervisor that left no word is gone, as far as its log tells."""
    try:
        last = (directory / c.LOG_DIR / "supervisor.log").read_text(errors="replace").strip().splitlines()[-1:]
    except OSError:
        last = []
    return (f"the supervisor (pid {meta.get('supervisor_pid')}) is gone without a word (killed?)"
            + (f"; its log ends: {last[0].strip()}" if last else ""))


def resolve_recording(recording: str | os.PathLike) -> Path:
    """A recording by path or by name under workbench/assets/recordings/."""
    path = Path(recording)
    if (path / STORE_FILE).exists():
        return path
    bundled = Path(__file__).resolve().parent / "assets" / "recordings" / str(recording)
    if (bundled / STORE_FILE).exists():
        return bundled
    raise FileNotFoundError(f"{recording}: no recorded session there (expected {STORE_FILE})")


__all__ = ["Session", "ApplyResult", "ApplyRefused", "Preview", "Poll", "PollCursor", "ReadOnlySession", "PlanError",
           "gpu_count"]
