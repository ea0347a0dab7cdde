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

import os
import sqlite3
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd

from . import advisor
from . import control as c
from . import history
from . import verl_config
from .advisor import Finding, findings_frame
from .handles import (HANDLE_FINAL, ApplyRefused, ApplyResult, Poll, PollCursor, Preview, ReadOnlySession,
                      poll_since, preview_change, unplayable, wait_for_answer, with_prediction)
from .knobs import KNOB_TABLE_COLUMNS, irrelevant_knobs, knob_defaults, knob_rows
from .lifecycle import (SessionKind, check_replay_speeds, closed_words, effective_state, failure_words, gpu_count,
                        list_sessions, mark_lost, no_supervisor_words, read_token, replay_launch, resolve_recording,
                        spawn_supervisor, status_words, step_reached, token_matches, wait_until,
                        warm_plan_checks)
from .paths import resolve_session_dir
from .plan import Plan, PlanError
from .predict import Prediction, closest_cost
from .predict import predict as predict_plan
from .procs import process_alive, wait_gone
from .recordings import recorded_plans
from .store import SessionClosed, Store, StoreError

COMMAND_TIMEOUT_S = 30.0


class Session:
    def __init__(self, directory: str | os.PathLike, token: str | None = None, *, read_only: bool = False):
        self.dir = Path(directory)
        self._token = None if read_only else token if token is not None else read_token(self.dir)
        # A viewer opens the store read-only: no writes, no schema script (the session may be another user's).
        self._store = Store(self.dir, readonly=self._token is None, create=False)
        self._plans = history.PlanCache()
        self._costs = history.UntilNewRows(self._store, ("steps",),
                                           lambda: history.segment_costs_of(self._store, self._plans))
        self._memory = history.UntilNewRows(self._store, ("steps", "events"), lambda: advisor.memory_model_of(self))
        if self._token is not None:
            warm_plan_checks()

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
        return cls(*spawn_supervisor(plan, name=name, root=root, meta=meta, args=[]))

    @classmethod
    def replay(
        cls, recording: str | os.PathLike, *, speed: float = 1.0, follow: bool = True, crash_at_step: int | None = None,
        root: Path | None = None, prometheus_port: int | None = None, startup_speed: float | None = None,
    ) -> "Session":
        """Play a recorded session (a session directory, or the name of a bundled one) as a run: the no-GPU demo
        and the CPU test double.

        follow=True re-issues the recorded operator's commands (changes, telemetry, rollback, stop) where the
        recording gave them, so the replay tells the whole recorded story; any command of yours takes control from
        it for good. follow=False leaves every command to you. startup_speed: plays verl's recorded start-up (before
        each segment's first step) at this speed instead (None: at `speed`)."""
        check_replay_speeds(speed, startup_speed)
        recording = resolve_recording(recording)
        plan_json, meta, args = replay_launch(recording, speed=speed, follow=follow, crash_at_step=crash_at_step,
                                              startup_speed=startup_speed)
        meta.update(prometheus_port=prometheus_port)
        return cls(*spawn_supervisor(Plan.from_json(plan_json), name=f"replay-{recording.name}", root=root,
                                     meta=meta, args=args))

    @classmethod
    def attach(
        cls, path_or_id: str | os.PathLike | None = None, token: str | None = None, *, read_only: bool = False,
    ) -> "Session":
        """Attach to a session by directory or id (newest if None). Without the operator token it is read-only;
        read_only=True makes a view that can't control the session even where the token file is readable."""
        return cls(resolve_session_dir(path_or_id), token, read_only=read_only)

    @classmethod
    def list(cls, root: Path | None = None) -> pd.DataFrame:
        return list_sessions(root)

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
    def kind(self) -> SessionKind:
        """What this session runs: live, or a replay (of which recording, at what speed, following its operator)."""
        return SessionKind.from_meta(self.meta)

    def as_operator(self, token: str) -> "Session":
        """This session's operator handle, for a token typed into a viewer's page: ReadOnlySession when it is not
        the session's token (where this process can read the token file to compare; elsewhere the supervisor
        refuses whatever a wrong token signs)."""
        token = str(token or "").strip()
        if not token_matches(self.dir, token):
            raise ReadOnlySession(f"that is not this session's operator token: session {self.id} stays read-only")
        return Session(self.dir, token)

    def start_like(self) -> "Session":
        """A new session with this one's plan in force, once this one has ended: a live run on this machine, or
        the same recording replayed the same way. The operator's alone: ReadOnlySession for a viewer's handle."""
        self._require_operator("start")
        state = self.state
        if state not in c.ENDED_STATES:
            raise RuntimeError(f"session {self.id} is {state}: a session runs one verl run at a time; "
                               "start another once it has ended")
        kind = self.kind
        if kind.is_replay:
            return Session.replay(kind.recording, speed=kind.speed, follow=kind.follow,
                                  startup_speed=kind.startup_speed)
        return Session.start(self.plan)

    @property
    def state(self) -> str:
        meta = self.meta
        state = effective_state(meta, self.dir)
        if state == c.LOST and meta.get("state") != c.LOST and self.is_operator:
            try:
                self._mark_lost(meta)
            except (StoreError, sqlite3.Error) as error:  # e.g. a full disk: it is lost all the same
                warnings.warn(f"session {self.id} is lost, and its store can't say so: {error}")
        return state

    @property
    def failure(self) -> str | None:
        """Why the session failed or was lost, in words; None while it runs or when it ended well."""
        return c.read_failure_note(self.dir) or failure_words(self._store, self.state, self.dir)

    def _mark_lost(self, meta: dict[str, Any]) -> None:
        """The watchdog: the session says it runs but its supervisor is gone (killed, or the machine rebooted). Say
        so in the store (state lost, why, changes in flight not applied) and end what is left of its run: a live
        run's processes share the run's process session, which the supervisor no longer ends. The next operator
        handle that looks does it (a viewer can't write)."""
        mark_lost(self._store, meta, self.dir)

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

    def _put(self, kind: str, payload: dict[str, Any] | None = None, unless_state: tuple[str, ...] = ()) -> int:
        self._require_operator(kind)
        if not self.supervisor_alive() and self.state not in unless_state:  # else the store refuses it: SessionClosed
            raise RuntimeError(self._no_supervisor(kind))
        return self._store.put_command(kind, c.signed(self._token, kind, payload or {}), unless_state=unless_state)

    def _command(self, kind: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        """Queue a command and wait for the supervisor's answer; RuntimeError if it failed or was refused."""
        command_id = self._put(kind, payload)
        result = wait_for_answer(self, command_id, kind, COMMAND_TIMEOUT_S, self._no_supervisor)
        return {"id": command_id, "result": result}

    def supervisor_alive(self) -> bool:
        """Whether the session's supervisor process runs (True while it is still starting)."""
        pid = self.meta.get("supervisor_pid")
        return pid is None or process_alive(int(pid))

    def command(self, command_id: int) -> dict[str, Any]:
        """A command's row as the store holds it (state, result JSON): what ApplyResult.refresh reads."""
        return self._store.command(command_id)

    def wait_supervisor_exit(self, timeout_s: float = 30.0) -> bool:
        """After a stop: wait until the supervisor process has ended (and reap it, where this process started it)."""
        pid = self.meta.get("supervisor_pid")
        return pid is None or wait_gone(int(pid), timeout_s)

    def _no_supervisor(self, kind: str) -> str:
        return no_supervisor_words(kind, self.id, self.state, self.failure)

    def _status_words(self) -> str:
        state = self.state  # first: reading the state runs the watchdog, which may write the failure
        return status_words(self.id, state, self.failure)

    def preview(self, changes: dict[str, Any] | None) -> Preview:
        """What applying `changes` would do (mode, diff against the plan in force, problems keyed by knob), with
        the fast checks (knob types and ranges, budgets, batch divisibility, placement); nothing is queued and
        nothing raises for bad values. verl's own config check runs once, in the supervisor, when you apply."""
        state, kind = self.state, self.kind
        preview, new = preview_change(
            self.plan, changes, gpu_count=self.meta.get("gpu_count"), in_place=not kind.is_replay,
            session_words=closed_words(self.id, state, kind) if state in c.ENDED_STATES else None,
            restart_pending=bool(self._store.commands_in([c.RESTARTING], kinds=[c.APPLY])))
        if new is not None and kind.is_replay and not recorded_plans(kind.recording).takes(new):
            return unplayable(preview, self.recorded_changes())
        return with_prediction(preview, self._predict(new.knob_values())) if new is not None else preview

    def recorded_changes(self) -> list[dict[str, Any]]:
        """On a replay: the changes from the plan in force its recording can play (one per other recorded plan);
        [] for a live session, which can take any valid change."""
        kind = self.kind
        return recorded_plans(kind.recording).offers(self.plan) if kind.is_replay else []

    def apply(self, changes: dict[str, Any] | None, wait: bool = False, timeout: float = COMMAND_TIMEOUT_S) -> ApplyResult:
        """Apply a change: returns at once with a handle (see ApplyResult). Bad changes raise PlanError (with
        `.problems` keyed by knob) and nothing is queued. wait=True: return once the supervisor has answered
        (accepted or restarting), raising ApplyRefused if it refused."""
        self._require_operator("apply")
        preview = self.preview(changes)
        if not preview.ok:
            raise PlanError(preview.messages or list(preview.problems.values()))
        try:  # an apply is followed, not waited for: none is queued once the supervisor is on its way out
            command_id = self._put(c.APPLY, {"changes": preview.changes, "gpu_count": self.meta.get("gpu_count")},
                                   unless_state=c.CLOSED_STATES)
        except SessionClosed:  # the session ended since the preview looked
            raise PlanError([closed_words(self.id, self.state, self.kind)]) from None
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
        if not self.supervisor_alive():
            return self._status_words()
        try:
            self._command(c.STOP, {"now": now, "checkpoint": checkpoint})
        except RuntimeError:
            if self.supervisor_alive():
                raise
            wait = False  # it ended meanwhile (e.g. it failed at start-up): nothing runs, as a stop wants
        if wait:
            self.wait_until(lambda s: s.state in c.ENDED_STATES and not s.supervisor_alive(), timeout=timeout)
        return self._status_words()

    def telemetry(self, on: bool = True) -> None:
        """Turn the NVML sampler off or on (e.g. to measure what it costs)."""
        self._command(c.TELEMETRY, {"on": on})

    def rollback(self) -> int:
        """After a crash: relaunch the last plan that ran good steps, resuming from the newest checkpoint."""
        return self._command(c.ROLLBACK)["result"]["segment"]

    def wait_until(self, predicate: Callable[["Session"], bool], timeout: float = 600.0, poll: float = 0.5) -> "Session":
        return wait_until(self, predicate, timeout, poll)

    def wait_for_step(self, step: int, timeout: float = 600.0) -> "Session":
        """Wait until `step` ran; RuntimeError (with the reason) once the session ended before it."""
        return self.wait_until(step_reached(step), timeout=timeout)

    # ----------------------------------------------------------------- cheap reads for many viewers
    def poll(self, cursor: PollCursor | None = None) -> Poll:
        """What changed since `cursor` (None: everything), in one query; nothing is decoded when nothing changed.
        Then read only the rows after `poll.since[table]` (e.g. `steps(since_id=poll.since["steps"])`)."""
        return poll_since(self._store.poll_row(), cursor, lambda meta: effective_state(meta, self.dir))

    # ----------------------------------------------------------------- data (pandas, one call away)
    def steps(self, since_id: int = 0) -> pd.DataFrame:
        return self._store.frame("steps", since_id)

    def samples(
        self, since_id: int = 0, *, window_s: float | None = None, every_s: float | None = None,
        gpus: Iterable[int] | None = None, metrics: Iterable[str] | None = None, since_t: float | None = None,
    ) -> pd.DataFrame:
        """GPU samples. With every_s: aggregated in SQL per bucket of every_s seconds and GPU (t = bucket start,
        node, gpu, n, and per metric m: m (mean), m_min, m_max; metrics: only these, default all — each costs time
        per row; since_t: only samples with t >= since_t, e.g. a live chart's newest bucket on). window_s: only the
        last that many seconds before the newest sample; gpus: only these GPU indices. With neither every_s,
        window_s nor gpus: every raw row after since_id."""
        if every_s is not None:
            return self._store.sample_buckets(every_s, window_s, gpus, metrics, since_t)
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

    def segment(self, segment_id: int | None = None) -> dict[str, Any] | None:
        """One segment's row (id, started_at, ended_at, plan_json, status, reason, resumed_from_step); None: the
        newest. None when there is no such segment (a session still starting has none)."""
        return self._store.segment(segment_id) if segment_id is not None else self._store.last_segment()

    def segments(self, since_id: int = 0) -> pd.DataFrame:
        """Every plan that ran (segments after since_id) with what changed from the segment before it and what it
        measured: diff (list of {knob, before, after}), diff_text, reason, steps, step_time_s, throughput
        (tokens/s/GPU), util_mean, sm_active_mean and mem_peak_gb of the plan's GPUs while it ran."""
        return history.segments_frame(self._store, self._plans, since_id)

    def knob_table(self, segment: int | None = None) -> pd.DataFrame:
        """One row per knob for a segment's plan (default: the plan in force): KNOB_TABLE_COLUMNS (keeps: what of
        the running verl a restart-class knob's change leaves alone, knob.REBUILD_KEEPS)."""
        plan = self._plan_of(segment)
        irrelevant = irrelevant_knobs(plan.knob_values(), verl_config.roles_in_use(plan.config))
        return pd.DataFrame(knob_rows(plan.knob_values(), knob_defaults(), irrelevant), columns=KNOB_TABLE_COLUMNS)

    def placement(self) -> pd.DataFrame:
        """Per GPU of the plan in force: the roles the plan puts there and the roles whose processes the sampler
        saw there (with their memory), and whether they disagree. Ray picks physical GPUs inside the plan's set,
        so planned roles follow the pools in order (actor pool first, then critic, reward, rollout)."""
        return history.placement_frame(self.plan, self._store.latest_procs())

    def _plan_of(self, segment: int | None) -> Plan:
        return Plan.from_json(self._store.segment(segment)["plan_json"]) if segment else self.plan

    def export(self, format: str = "overrides", segment: int | None = None) -> str | list[str]:
        """The plan of a segment (default: the one in force) as Hydra overrides, YAML or a command line. YAML and
        command start with what this machine needed that verl's defaults don't do on their own."""
        return history.plan_export(self._plan_of(segment), format, self.machine_notes)

    def machine_notes(self) -> list[str]:
        """What runs of this session needed that plain verl does not do on this machine (the runner's notes)."""
        return history.machine_notes(self._store.frame("events"))

    def knob_values(self, segment: int | None = None) -> dict[str, Any]:
        """Every knob's value in a segment's plan (default: the one in force), defaults included."""
        return self._plan_of(segment).knob_values()

    def advice_findings(self, segment_id: int | None = None) -> list[Finding]:
        """The advisor's findings for a segment (default: the newest that measured enough steps and did not
        fail), judged against the plan in force, screened for memory with the session's own memory model and its
        crashes (workbench.advisor.advice_for)."""
        return advisor.advice_for(self, segment_id)

    def advice(self, segment_id: int | None = None) -> pd.DataFrame:
        """advice_findings as a table: one row per finding, most severe first."""
        return findings_frame(self.advice_findings(segment_id))

    def startup_phases(self, segment: int | None = None) -> pd.DataFrame:
        """Where a launch's start-up went (Ray, TaskRunner/dataloader, workers, vLLM's phases, first step), read
        from the segment's log (workbench/startup.py). Default: the newest launched segment (a hot-applied segment
        ran in the process its predecessor launched, so that launch is the one shown)."""
        return history.startup_phases(self._store, self.dir, self.steps(), segment)

    # ----------------------------------------------------------------- what-if and live tuning (predict.py, tune.py)
    def segment_costs(self) -> list:
        """The what-if model's calibration: each segment with enough measured steps (cached until a new step)."""
        return self._costs.get()

    def predict(self, changes: dict[str, Any]) -> Prediction | None:
        """The plan in force with `changes`: step time per phase and peak GPU memory, with an uncertainty, from
        the measured segment nearest to it (None before any segment measured enough steps). PlanError for bad
        changes. `prediction.frame()` is the per-phase table, `prediction.text` one line."""
        return self._predict(self.plan.with_changes(changes).knob_values())

    def memory_model(self):
        """The memory model this session's segments and crashes calibrate (cached until a new step or event)."""
        return self._memory.get()

    def _predict(self, values: dict[str, Any]) -> Prediction | None:
        basis = closest_cost(self.segment_costs(), values)
        return predict_plan(basis, values, self.memory_model()) if basis is not None else None

    def tune(self, knobs: Any = None, **options: Any):
        """Live auto-tune over knob values or candidate changes (see workbench.tune.tune); returns a TuneResult
        whose `trials` is a DataFrame; the best plan stays in force."""
        from .tune import tune

        return tune(self, knobs, **options)

    def autopilot(self, **options: Any):
        """Follow the advisor round by round until the run is fast (workbench.autopilot): each round applies the
        top safe finding, keeps it if faster, rolls it back if slower or crashed. Returns an AutopilotResult whose
        `story` is one DataFrame; options: steps_per_round, max_rounds, budget_s, timeout_s, stop (an Event),
        on_round (called with the story after each round)."""
        from .autopilot import autopilot

        return autopilot(self, **options)


__all__ = ["Session", "ApplyResult", "ApplyRefused", "Preview", "Poll", "PollCursor", "ReadOnlySession", "PlanError",
           "gpu_count"]
