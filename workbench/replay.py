"""A recorded session played back as a run, at scaled real time: the CPU test double and the no-GPU demo.

A recording is a session directory (see store.py). `replay_factory` gives the supervisor a run factory; each run
copies the recorded rows of the recorded segment whose plan matches into this session's store, re-timed to now:
steps at their recorded spacing / speed, and the samples, procs, workers and events of the same time window.
It answers the supervisor's directives at step boundaries with the live trainer's own executor (boundary.py), so
the supervisor's own paths run unchanged: pause / resume, hot apply (the recorded segment with the new plan takes
over in the same run), checkpoint-and-exit (the next run continues in the recorded segment of the pending plan),
stop, and a crash: a recorded one (a failed recorded segment plays until it died, then exits with its recorded
traceback) or an injected one (`crash_at_step`).

The recorded operator comes along (recorded_operator.py, unless follow=False): it re-issues the recording's
commands into this session at the matching points of the replayed timeline, so a replay tells the whole recorded
story (changes, restarts, a crash, the rollback, the stop), until the user changes its course (a change of their own,
a rollback, a stop); a pause does not, and the recording's next change given early carries the story on from there.
What a replay can play at all (the plans its recording ran) is in recordings.py: previews refuse the rest at once.

A replay never pretends to be live: the session's meta says kind=replay and names the recording, copied events
keep their recorded text, and the replay's own events say "replay".
"""

from __future__ import annotations

import functools
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from . import control as c
from .boundary import HotChange, StepBoundary
from .plan import Plan
from .recorded_operator import RecordedOperator, operator_commands
from .recordings import NO_RECORDED_SEGMENT, REPLAY_ENDED, changes_to, no_segment_words, ran
from .store import PROC_COLUMNS, SAMPLE_COLUMNS, Store

TICK_S = 0.1  # the replay wakes this often (wall clock) and writes what the recording did meanwhile, in one batch
# Recorded events about the recorded session's control and analysis: the replayed session has its own.
OWN_EVENT_KINDS = c.CONTROL_EVENT_KINDS
class InjectedReplayFault(RuntimeError):
    """The crash `crash_at_step` asks for: exercises the supervisor's crash path; not a verl failure."""


class _Killed(Exception):
    """The supervisor killed the run (stop now, or the supervisor is ending)."""


@dataclass(frozen=True)
class RecordedCrash:
    """What the recorded supervisor wrote down when a recorded segment's run died (its `crash` event)."""

    exit_code: int
    oom: bool
    traceback_tail: str


@dataclass(frozen=True)
class RecordedSegment:
    id: int
    plan_json: str
    started_at: float
    ended_at: float | None
    steps: tuple[dict[str, Any], ...]  # the recording's step rows (step, t, metrics), in order
    crash: RecordedCrash | None  # how its run died; None: it did not fail

    @functools.cached_property
    def knobs(self) -> dict[str, Any]:
        # Parsed on demand: reading some knobs' defaults imports verl (seconds), which a plain replay never needs.
        return Plan.from_json(self.plan_json).knob_values()

    def ran(self, plan: Plan) -> bool:
        """Whether this segment ran `plan`: the very same plan, or one with equal knob values."""
        return ran(self.plan_json, lambda: self.knobs, plan)

    def first_index_after(self, step: int | None) -> int:
        """Where to continue after `step`: its first recorded step beyond it, or its first step when it has none."""
        for index, row in enumerate(self.steps):
            if step is None or row["step"] > step:
                return index
        return 0

    @property
    def ready_at(self) -> float:
        """Recorded time verl's startup ended (its first step's work began); a segment that never got there spent
        its whole time starting."""
        return self.work_start(0) if self.steps else self.ended_at

    def work_start(self, index: int) -> float:
        """Recorded time the work of steps[index] began: the previous step's end; for the first step, its end
        less its own duration (verl's timing_s/step). Before that lies verl's startup."""
        if index > 0:
            return self.steps[index - 1]["t"]
        first = self.steps[0]
        duration = first["metrics"].get("timing_s/step") or 0.0
        return max(self.started_at, first["t"] - duration)


class Recording:
    """A recorded session directory, read once: its segments that ran steps or crashed, its operator's commands,
    and its timed rows."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        store = Store(self.dir, readonly=True)
        try:
            steps = store.rows("steps")
            steps_by_segment: dict[int, list[dict[str, Any]]] = {}
            for row in steps:
                steps_by_segment.setdefault(row["segment_id"], []).append(row)
            crashes = {
                event["data"]["segment"]: RecordedCrash(
                    event["data"]["exit_code"], event["data"]["oom"], event["data"]["traceback_tail"],
                )
                for event in store.rows("events") if event["kind"] == "crash"
            }
            self.segments = [
                RecordedSegment(
                    seg["id"], seg["plan_json"], seg["started_at"], seg["ended_at"],
                    tuple(steps_by_segment.get(seg["id"], ())), crashes.get(seg["id"]),
                )
                for seg in store.rows("segments") if seg["id"] in steps_by_segment or seg["id"] in crashes
            ]
            self.operator_commands = operator_commands(store.rows("commands"), steps)
            self._frames = {
                table: store.frame(table).sort_values("t", kind="stable").reset_index(drop=True)
                for table in ("samples", "procs", "workers", "events")
            }
        finally:
            store.close()
        self._times = {table: frame["t"].to_numpy() for table, frame in self._frames.items()}

    @property
    def name(self) -> str:
        return self.dir.name

    def segment_for(self, plan: Plan, after_step: int | None = None) -> RecordedSegment | None:
        """The recorded segment that ran `plan`, preferring one with steps beyond after_step."""
        first_match = None
        for segment in self.segments:
            if segment.ran(plan):
                if after_step is None or (segment.steps and segment.steps[-1]["step"] > after_step):
                    return segment
                first_match = first_match or segment
        return first_match

    def alternatives(self, plan: Plan) -> list[dict[str, Any]]:
        """For each recorded plan other than `plan`: the knob values that would switch to it."""
        return changes_to(plan, [segment.knobs for segment in self.segments])

    def rows_between(self, table: str, start: float, end: float) -> pd.DataFrame:
        """The recorded rows of a table with start < t <= end."""
        times = self._times[table]
        lo, hi = np.searchsorted(times, start, side="right"), np.searchsorted(times, end, side="right")
        return self._frames[table].iloc[lo:hi]


class ReplayRun:
    """One run: a thread that plays recorded segments into the session's store (see the module docstring). It has
    the supervisor's Run interface (poll, kill, cannot_apply, log_path, end_words, rebuilds_in_place)."""

    end_words = REPLAY_ENDED
    rebuilds_in_place = False  # a restart-class change plays the recorded relaunch

    def __init__(
        self, store: Store, recording: Recording, session_dir: Path, segment_id: int, plan: Plan,
        resume_step: int | None, speed: float, crash_due: Callable[[int], bool], operator: RecordedOperator | None,
        ready: threading.Event, startup_speed: float | None = None,
    ):
        self._store = store
        self._recording = recording
        self._dir = session_dir
        self._plan = plan
        self._resume_step = resume_step
        self._speed = speed
        self._startup_speed = startup_speed or speed  # verl's recorded start-up, before the first step
        self._crash_due = crash_due
        self._operator = operator
        self._ready = ready
        self._boundary = StepBoundary(
            store, segment_id, hot_apply=self._hot_apply, checkpoint=self._checkpoint, end_run=lambda: None,
            idle=self._idle, replay=True, token=(session_dir / c.TOKEN_FILE).read_text().strip(),
        )
        self._switch_to: RecordedSegment | None = None  # the recorded segment a hot change continues in
        self._killed = threading.Event()
        self._exit_code: int | None = None
        # Recorded time `_position` has been played up to; `_clock` pairs a wall time with the recorded time it
        # stands for, so the replay keeps the recorded pace across windows (None: start afresh, e.g. after a pause).
        self._position: float | None = None
        self._clock: tuple[float, float, float] | None = None  # (wall time, recorded time, speed)
        self.log_path = session_dir / c.LOG_DIR / f"segment-{segment_id}.log"
        self.log_path.parent.mkdir(exist_ok=True)
        self._thread = threading.Thread(target=self._main, name=f"replay-segment-{segment_id}", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- the Run interface
    def poll(self) -> int | None:
        return None if self._thread.is_alive() else self._exit_code

    def kill(self) -> None:
        self._killed.set()
        self._thread.join(timeout=30)

    def cannot_apply(self, plan: Plan) -> str | None:
        if self._recording.segment_for(plan) is not None:
            return None
        return no_segment_words(self._recording.alternatives(self._plan))

    # ----------------------------------------------------------------- playing
    def _main(self) -> None:
        with open(self.log_path, "a") as self._log:
            try:
                self._exit_code = self._play()
            except _Killed:
                self._log.write("replay: killed by the supervisor\n")
                self._exit_code = -15
            except Exception:  # an injected fault or a replay bug: either way the supervisor's crash path runs
                self._log.write(traceback.format_exc())
                self._exit_code = 1

    def _say(self, line: str) -> None:
        self._log.write(line + "\n")
        self._log.flush()

    def _play(self) -> int:
        while not self._ready.wait(TICK_S):
            if self._killed.is_set():
                raise _Killed()
        for recorded in self._recording.segments:
            recorded.knobs  # noqa: B018 (parsed before playing, so that a change's check finds them parsed)
        segment = self._recording.segment_for(self._plan, after_step=self._resume_step)
        if segment is None:
            raise RuntimeError(NO_RECORDED_SEGMENT)
        index = segment.first_index_after(self._resume_step)
        step = (self._resume_step or 0) + 1
        self._say(
            f"replay of {self._recording.dir}, speed {self._speed:g}: recorded segment {segment.id} "
            + (f"from its step {segment.steps[index]['step']} as step {step}" if segment.steps else "(it ran no step)")
        )
        # A new process goes through verl's startup first (the recorded one, however far in it resumes).
        self._play_window(segment.started_at, segment.ready_at, self._startup_speed)
        if segment.steps:
            self._store.add_event(
                "started",
                f"replay: recorded segment {segment.id} of {self._recording.name} ready at step {step} "
                f"({self._speed:g}× real time)",
                {"segment": self._boundary.segment_id, "first_step": step, "recorded_segment": segment.id,
                 "replay": True},
            )
            self._store.set_meta(state=c.RUNNING)
        while index < len(segment.steps):
            row = segment.steps[index]
            self._play_window(segment.work_start(index), row["t"])
            self._wait_for_recorded_operator(step)
            self._wait_for_commands_on_their_way()
            if self._crash_due(step):
                raise InjectedReplayFault(
                    f"injected replay fault at step {step} (crash_at_step): a test of the crash path, not a verl failure"
                )
            self._store.add_step(self._boundary.segment_id, step, row["metrics"])
            self._say(f"step {step}: recorded step {row['step']} of segment {segment.id}")
            # What arrived before the step ended takes effect at its boundary, as in the live trainer.
            if self._boundary(step):
                return 0
            if self._switch_to is not None:
                segment, index, self._switch_to = self._switch_to, self._switch_to.first_index_after(step), None
            else:
                index += 1
            step += 1
        if segment.crash is not None:
            self._play_window(self._position, segment.ended_at)  # what the recording shows until its run died
            return self._recorded_crash(segment)
        self._store.add_event(
            "exiting", f"replay: the recording has no step after {step - 1} with this plan: the run ends",
            {"step": step - 1, "replay": True},
        )
        return 0

    def _recorded_crash(self, segment: RecordedSegment) -> int:
        """Write the recorded crash into the log and give its exit code: the supervisor's crash path reads them."""
        crash = segment.crash
        # The recorded supervisor found the OOM in log lines before the recorded tail, which the recording does not
        # keep: the first line carries its verdict, in the words the supervisor's OOM scan looks for.
        verdict = "; the recorded supervisor found it out of memory" if crash.oom else ""
        self._say(
            f"replay: the recorded crash of recorded segment {segment.id} of {self._recording.name} "
            f"(exit code {crash.exit_code}{verdict}); its recorded traceback tail:"
        )
        self._say(crash.traceback_tail)
        return crash.exit_code

    def _wait_for_recorded_operator(self, step: int) -> None:
        """Hold before `step` while the recorded operator owes a command it gave before the recorded one: its
        directive must reach this boundary, as it did in the recording. The recording's clock stands still."""
        while self._operator is not None and self._operator.owes(step):
            self._clock = None
            if self._killed.wait(TICK_S):
                raise _Killed()

    def _wait_for_commands_on_their_way(self) -> None:
        """Hold before the step's end while a command sent during it waits for the supervisor's answer (a live run's
        step lasts the seconds a first check may take; a replayed one a fraction of them): what the user sent during
        a step takes effect at its boundary, and a replay never ends with a command on its way. The recording's
        clock stands still."""
        while self._store.commands_in([c.QUEUED, c.TAKEN_BY_SUPERVISOR], kinds=c.USER_COMMANDS):
            self._clock = None
            if self._killed.wait(TICK_S):
                raise _Killed()

    def _play_window(self, start: float, end: float, speed: float | None = None) -> None:
        """Write the recording's rows with start < t <= end, at `speed` recorded seconds per second (default: the
        replay's), re-timed."""
        speed = speed or self._speed
        if self._clock is None or start != self._position or self._clock[2] != speed:
            self._clock = (time.time(), start, speed)  # a jump in the recording or its pace: its clock starts here
        self._position = start
        wall_0, recorded_0, _ = self._clock
        while self._position < end:
            if self._killed.wait(TICK_S):
                raise _Killed()
            reached = min(end, recorded_0 + (time.time() - wall_0) * speed)
            self._copy_rows(self._position, reached, lambda t: wall_0 + (t - recorded_0) / speed)
            self._position = reached

    def _copy_rows(self, start: float, end: float, wall: Callable[[Any], Any]) -> None:
        """Copy the rows with start < t <= end; `wall` maps recorded times (scalars or Series) to wall times."""
        samples = self._recording.rows_between("samples", start, end)
        if len(samples):
            self._store.add_samples(samples.assign(t=wall(samples["t"]))[list(SAMPLE_COLUMNS)].to_dict("records"))
        procs = self._recording.rows_between("procs", start, end)
        if len(procs):
            self._store.add_procs(procs.assign(t=wall(procs["t"]))[list(PROC_COLUMNS)].to_dict("records"))
        for worker in self._recording.rows_between("workers", start, end).to_dict("records"):
            self._store.add_worker(worker["pid"], worker["role"], worker["node"], self._boundary.segment_id)
        for event in self._recording.rows_between("events", start, end).to_dict("records"):
            if not self._is_recorded_control(event):
                self._store.add_event(event["kind"], event["text"], {**event["data"], "replayed": True}, t=wall(event["t"]))

    def _is_recorded_control(self, event: dict[str, Any]) -> bool:
        """Whether a recorded event is the recorded session's control, which this session does itself: its life
        cycle always; its sampler switches (the answer to a telemetry command) when the recorded operator's commands
        are re-issued, as this session's supervisor answers them again."""
        if event["kind"] in OWN_EVENT_KINDS:
            return True
        return self._operator is not None and event["kind"] == "telemetry" and "sampler" in event["data"]

    # ----------------------------------------------------------------- the step boundary (boundary.py calls these)
    def _idle(self, seconds: float) -> None:
        self._clock = None  # the recording's clock stands still while paused
        if self._killed.wait(seconds):
            raise _Killed()

    def _hot_apply(self, changes: dict[str, Any], plan_json: str, step: int) -> HotChange:
        plan = Plan.from_json(plan_json)
        target = self._recording.segment_for(plan, after_step=step)
        if target is None:
            raise ValueError(NO_RECORDED_SEGMENT)
        before = {k: self._plan.knob_values()[k] for k in changes}
        self._plan, self._switch_to = plan, target
        return HotChange(before, note=f" (recorded segment {target.id})", data={"recorded_segment": target.id})

    def _checkpoint(self, step: int) -> str:
        c.write_checkpoint_marker(self._dir, step)
        return " (a marker only: a replay has no weights to save)"


class ReplayFactory:
    """The supervisor's run factory for a replayed session: `(segment_id, plan, env) -> ReplayRun`."""

    def __init__(
        self, session_dir: Path, recording_dir: Path, speed: float = 1.0, crash_at_step: int | None = None,
        follow: bool = True, startup_speed: float | None = None,
    ):
        if not speed > 0 or not (startup_speed is None or startup_speed > 0):
            raise ValueError(f"replay speed must be positive, got {speed} (start-up: {startup_speed})")
        self.session_dir = Path(session_dir)
        self.recording = Recording(recording_dir)
        self.store = Store(self.session_dir)
        self.speed, self.startup_speed = speed, startup_speed
        self._crash_at_step = crash_at_step
        # Set when runs may play: the supervisor holds them until its process has imported verl.
        self.ready = threading.Event()
        self.ready.set()
        self.operator = None
        if follow:
            token = (self.session_dir / c.TOKEN_FILE).read_text().strip()
            self.operator = RecordedOperator(self.store, token, self.recording.operator_commands)

    def _crash_due(self, step: int) -> bool:
        # One injected fault per session: the run that a rollback launches must get past that step.
        if step != self._crash_at_step:
            return False
        self._crash_at_step = None
        return True

    def __call__(self, segment_id: int, plan: Plan, env: dict[str, str]) -> ReplayRun:
        # `env` tells a live relaunch how to resume verl's weights; a replay has none to load.
        resume_step = self.store.segment(segment_id)["resumed_from_step"]
        return ReplayRun(
            self.store, self.recording, self.session_dir, segment_id, plan, resume_step, self.speed, self._crash_due,
            self.operator, self.ready, self.startup_speed,
        )


def replay_factory(
    session_dir: str | Path, recording_dir: str | Path, speed: float = 1.0, crash_at_step: int | None = None,
    follow: bool = True, startup_speed: float | None = None,
) -> ReplayFactory:
    """A run factory for `Supervisor(run_factory=...)` that plays `recording_dir` into `session_dir`; with
    follow=True the recorded operator re-issues the recording's commands (it signs them with the session's token)."""
    return ReplayFactory(
        Path(session_dir), Path(recording_dir), speed=speed, crash_at_step=crash_at_step, follow=follow,
        startup_speed=startup_speed,
    )
