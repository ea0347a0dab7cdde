"""One long-lived process per session: owns the run, executes commands, outlives the kernels that started it.

`python -m workbench.supervisor --session DIR` (Session.start spawns it detached). It
- takes user commands (apply, pause, resume, stop, rollback) from the store, validates them, and turns them into
  runner directives (`runner.*`, executed by the trainer at the next step boundary) or process actions;
- runs each segment as its own process (a live verl run, or a replayed recording — see `Run`), relaunching with
  `resume_mode=auto` for restart-class changes; a live run rebuilds verl in place instead where the change leaves its
  processes' environment alone (the knob table's `runner.keeps`, runner/rebuild.py), and is relaunched when that
  rebuild fails; records crashes with the traceback tail;
- starts the NVML sampler beside a live run;
- keeps `meta.state` current: starting, running, paused, restarting, stopping, stopped, finished, failed.
Control belongs to the operator: each command carries a signature made with the session's operator token
(control.py). An apply is answered at once (accepted / restarting / refused with problems keyed by knob) and followed
to its end (applied at step N by the runner, resumed at step N after a restart, or not_applied when the run ends
first). For a live run verl's own config check runs here, once per change, in this process that imported verl
already (in the background when it started); a replay's supervisor checks a change with the fast checks only and
never imports verl.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import sqlite3
import traceback
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from . import checkpoints
from . import control as c
from . import verl_config
from .handles import judge_change
from .knob import KEEP_WORDS, RELAUNCH, restart_steps
from .plan import PLAN_PROBLEM, Plan, PlanError
from .procs import end_child
from .runs import (OOM_SCAN_LINES, LiveRun, Run, checkpoint_bytes, log_tail, looks_like_oom, machine_meta,
                   restart_environment, traceback_tail)
from .ray_cluster import SessionRayCluster
from .store import Store, StoreError

POLL_S = 0.1  # a command waits at most this long to be taken: a hot change must reach the next step boundary
STOP_GRACE_S = 120.0  # a stop waits for the step boundary this long before it kills the run


class Supervisor:
    def __init__(self, session_dir: Path, run_factory=None):
        self.dir = session_dir
        self.store = Store(session_dir)
        self.token = (session_dir / c.TOKEN_FILE).read_text().strip()
        self.signatures = c.SignatureCheck(self.token)
        self.run_factory = run_factory or self._live_run
        self.run: Run | None = None
        self.segment_id: int | None = None
        self.pending_plan: Plan | None = None  # a restart-class change waiting for the runner's checkpoint
        self.pending_command: int | None = None  # the apply that asked for it
        self.pending_in_place = False  # the runner rebuilds verl in place for it (else: it exits, and is relaunched)
        self.resuming: tuple[int, int, int] | None = None  # (apply command, its new segment, last event id before it)
        self.stopping_since: float | None = None
        self.ended: str | None = None  # why no run takes commands, once the run ended well (its end_words)
        self.sampler: subprocess.Popen | None = None
        self.ray = SessionRayCluster(session_dir)
        # verl's first import and a plan's first composition cost seconds: pay them now, beside the run's start, not
        # when the first change comes (it must reach the next step boundary). A replay's changes get the fast checks
        # only (cmd_apply), so its supervisor composes and never imports verl: that would cost it ~11 of its ~13.5
        # CPU-seconds for nothing.
        self.warmed = threading.Event()
        threading.Thread(target=self._warm, args=(run_factory is None,), name="warm-verl", daemon=True).start()

    def _warm(self, with_verl: bool) -> None:
        try:
            verl_config.warm(with_verl=with_verl)
            initial = self.store.meta().get("initial_plan")
            if initial:
                Plan.from_json(initial).knob_values()
        finally:
            self.warmed.set()

    # ----------------------------------------------------------------- helpers
    def state(self) -> str:
        return self.store.meta().get("state", c.STARTING)

    def set_state(self, state: str) -> None:
        self.store.set_meta(state=state)

    def current_plan(self) -> Plan:
        return Plan.from_json(self.store.last_segment()["plan_json"])

    def _live_run(self, segment_id: int, plan: Plan, env: dict[str, str]) -> Run:
        # Before the run can write one; sized (config.json reads, NVML) only while not yet decided.
        placed = "" if checkpoints.placed(self.dir) else checkpoints.place(self.dir, checkpoint_bytes(plan))
        if placed:
            self.store.add_event(c.EV_RUNTIME, placed)
        return LiveRun(self.dir, segment_id, plan, env, ray=self.ray)

    # ----------------------------------------------------------------- segments
    def launch(self, plan: Plan, reason: str, env: dict[str, str] | None = None) -> None:
        last = self.store.last_segment()
        resumed_from = c.latest_checkpoint_step(self.dir)
        # The run resumes from the newest complete checkpoint, and so would a rollback after it: the rest can go.
        pruned = checkpoints.words(checkpoints.prune(self.dir))
        self.segment_id = self.store.begin_segment(plan.to_json(), reason=reason, resumed_from_step=resumed_from)
        self.ended = None
        # State and event first: once created, the run writes its own ("running", "started"), which must come after.
        self.set_state(c.STARTING)
        text = f"segment {self.segment_id} launched ({reason})"
        if resumed_from is not None and last is not None:
            text += f", resuming from the checkpoint at step {resumed_from}"
        self.store.add_event(c.EV_LAUNCHED, text + (f"; {pruned} (only the one resumed from is kept)" if pruned else ""),
                             {"segment": self.segment_id, "resume_step": resumed_from})
        self.run = self.run_factory(self.segment_id, plan, env or {})
        for notice in self.ray.notices:  # the session Ray cluster restarted, or left to the run
            self.store.add_event(c.EV_RUNTIME, notice)
        self._ensure_sampler(plan)
        if isinstance(self.run, LiveRun):
            # run_pid is also the run's process session id: what a watchdog kills when this supervisor is gone.
            self.store.set_meta(run_pid=self.run.proc.pid, **machine_meta(plan))

    def _ensure_sampler(self, plan: Plan) -> None:
        if not isinstance(self.run, LiveRun) or os.environ.get("WORKBENCH_NO_SAMPLER") == "1":
            return
        if self.sampler is not None and self.sampler.poll() is None:
            return
        command = [sys.executable, "-m", "workbench.telemetry.sampler", "--session", str(self.dir),
                   "--hz", os.environ.get("WORKBENCH_SAMPLER_HZ", "10")]
        if plan.config.trainer.nnodes > 1:
            # verl joins the Ray cluster at RAY_ADDRESS; the sampler puts one pinned actor on each of its nodes.
            command += ["--cluster", os.environ.get("RAY_ADDRESS", "auto")]
        else:
            command += ["--gpus", ",".join(map(str, plan.workbench["gpus"]))]
        with open(self.dir / c.LOG_DIR / "sampler.log", "ab") as log:
            self.sampler = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                env={**os.environ, c.SUPERVISOR_PID_ENV: str(os.getpid())},  # it dies with this supervisor
            )

    def _stop_sampler(self) -> None:
        if self.sampler is not None and self.sampler.poll() is None:
            end_child(self.sampler)

    # ----------------------------------------------------------------- commands
    def handle_commands(self) -> None:
        """Answer every command claimed: a malformed or unsigned row is refused with its reason, a command that
        fails says why; only a store that can't be written stops the supervisor (fail() then releases the rest)."""
        for cmd in self.store.take_commands(kinds=c.USER_COMMANDS, taker=c.TAKEN_BY_SUPERVISOR):
            kind, payload = cmd["kind"], cmd["payload"]
            why = self.signatures.refusal(kind, payload)
            if why is not None:
                self.store.finish_command(cmd["id"], c.REFUSED, {"problems": {PLAN_PROBLEM: why}, "message": why}
                                          if kind == c.APPLY else why)
                continue
            try:
                if kind == c.APPLY:
                    self.cmd_apply(cmd["id"], payload)  # answers the command itself, and follows it
                else:
                    self.store.finish_command(cmd["id"], c.DONE, getattr(self, f"cmd_{kind}")(payload))
            except (sqlite3.Error, StoreError, OSError):
                raise
            except (PlanError, RuntimeError, ValueError, TypeError, AttributeError, KeyError) as e:
                problems = e.problems if isinstance(e, PlanError) else {PLAN_PROBLEM: _words(e)[:400]}
                if kind == c.APPLY:
                    self.store.finish_command(cmd["id"], c.REFUSED, {"problems": problems, "message": str(e)})
                else:
                    self.store.finish_command(cmd["id"], c.FAILED_COMMAND, str(e))
                self.store.add_event(c.EV_REFUSED, f"{kind}: {e}", {"command": cmd["id"], "problems": problems})

    def directive(self, kind: str, payload: dict[str, Any]) -> int:
        """Queue a runner directive, signed: the runner executes only what this supervisor signed (boundary.py)."""
        return self.store.put_command(kind, c.signed(self.token, kind, payload))

    def _require_run(self, what: str) -> Run:
        if self.run is None or self.run.poll() is not None:
            raise RuntimeError(f"can't {what}: " + (self.ended or f"no run is in progress (state {self.state()})"))
        return self.run

    def cmd_apply(self, command_id: int, payload: dict[str, Any]) -> None:
        """Check the change in full (verl's own check for a live run) and answer at once: accepted (a hot
        directive for the next step boundary) or restarting (checkpoint there, then relaunch)."""
        run = self._require_run("apply a change")
        if self.pending_plan is not None:
            raise RuntimeError("a restart-class change is already pending; wait for it to take effect")
        if not payload.get("changes"):
            raise PlanError([f"{PLAN_PROBLEM}: no change given"])
        judged = judge_change(self.current_plan(), payload["changes"], gpu_count=payload.get("gpu_count"),
                              with_verl=isinstance(run, LiveRun), in_place=run.rebuilds_in_place)
        new, mode, changes = judged.new, judged.mode, judged.changes
        reason = run.cannot_apply(new)
        if reason:
            raise RuntimeError(reason)
        answer = {"mode": mode, "changes": changes}
        if mode == "hot":
            self.directive(c.RUNNER_HOT_APPLY, {"changes": changes, "plan_json": new.to_json(), "command": command_id})
            self.store.finish_command(command_id, c.ACCEPTED, answer, final=False)
            return
        self.pending_plan, self.pending_command = new, command_id
        self.pending_in_place = judged.keeps != RELAUNCH
        if self.pending_in_place:
            env, losses = restart_environment(self.current_plan(), new, self.dir, checkpoint_step=None)
            self.resuming = (command_id, None, self.store.max_id("events"))  # the runner numbers the new segment
            self.directive(c.RUNNER_REBUILD, {"plan_json": new.to_json(), "config_yaml": OmegaConf.to_yaml(new.config),
                                              "keeps": judged.keeps, "env": env, "losses": losses,
                                              "command": command_id})
            kept = f" (keeps {KEEP_WORDS[judged.keeps]})"
        else:
            self.directive(c.RUNNER_CHECKPOINT_EXIT, {})
            kept = ""
        self.set_state(c.RESTARTING)
        self.store.finish_command(command_id, c.RESTARTING, {**answer, "keeps": judged.keeps}, final=False)
        self.store.add_event(
            c.EV_RESTART_PENDING,
            f"restart-class change ({', '.join(changes)}): {restart_steps(judged.keeps)}{kept}",
            {"changes": changes, "command": command_id, "keeps": judged.keeps, "in_place": self.pending_in_place},
        )

    def _abandon_changes(self, reason: str) -> None:
        """The run ended before changes in flight took effect: say so on each, and drop directives no run took."""
        for cmd in self.store.commands_in([c.ACCEPTED, c.RESTARTING], kinds=[c.APPLY]):
            self.store.finish_command(cmd["id"], c.NOT_APPLIED, {**(cmd["result"] or {}), "message": reason})
            self.store.add_event(c.EV_NOT_APPLIED, f"change {cmd['id']} not applied: {reason}", {"command": cmd["id"]})
        for directive in self.store.commands_in([c.QUEUED], kinds=c.RUNNER_DIRECTIVES):
            self.store.finish_command(directive["id"], c.DROPPED, reason)
        self.pending_plan = self.pending_command = None
        self.pending_in_place = False
        self.resuming = None

    def _release_claimed(self, reason: str) -> None:
        """Commands this supervisor claimed and will never answer: said so, not left "supervisor" for ever."""
        for cmd in self.store.commands_in([c.TAKEN_BY_SUPERVISOR]):
            self.store.finish_command(cmd["id"], c.FAILED_COMMAND, reason)

    def check_resumed(self) -> None:
        """A restart-class change is resumed once its relaunched run is ready (the runner's `started` event)."""
        if self.resuming is None:
            return
        command_id, segment_id, seen = self.resuming
        if self.pending_in_place and self.store.command(command_id)["state"] == c.NOT_APPLIED:
            # the runner refused the rebuild (its checkpoint failed): nothing changed, the run goes on
            self.pending_plan = self.pending_command = None
            self.pending_in_place, self.resuming = False, None
            self.set_state(c.RUNNING)
            return
        for event in self.store.rows("events", since_id=seen):
            # A rebuild in place numbers its segment itself (segment_id None): the first start after the Apply.
            segment = event["data"].get("segment")
            if event["kind"] == c.EV_STARTED and (segment_id is None or segment == segment_id):
                result = self.store.command(command_id)["result"]
                answer = json.loads(result) if result else {}
                step = event["data"].get("first_step")
                self.store.finish_command(command_id, c.RESUMED, {**answer, "step": step, "segment": segment})
                self.resuming = None
                if self.pending_in_place:
                    self.pending_plan = self.pending_command = None
                    self.pending_in_place = False
                return

    def cmd_pause(self, payload: dict[str, Any]) -> dict[str, Any]:
        self._require_run("pause")
        self.directive(c.RUNNER_PAUSE, {})
        return {"at": "next step boundary"}

    def cmd_resume(self, payload: dict[str, Any]) -> dict[str, Any]:
        self._require_run("resume")
        self.directive(c.RUNNER_RESUME, {})
        return {"at": "now"}

    def cmd_stop(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.run is None or self.run.poll() is not None:
            self._abandon_changes("the session was stopped")
            self.set_state(c.STOPPED)
            return {"stopped": "nothing was running"}
        if payload.get("now"):
            self._end_run(c.STOPPED, "stopped at once by the operator")
            return {"stopped": "at once"}
        self._abandon_changes("the session is stopping: the run exits at the next step boundary")
        self.directive(c.RUNNER_STOP, {"checkpoint": bool(payload.get("checkpoint"))})
        self.stopping_since = time.time()
        self.set_state(c.STOPPING)
        return {"stopped": "at the next step boundary"}

    def cmd_telemetry(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Turn the NVML sampler off or on (to measure what it costs, or to spare a loaded host)."""
        on = bool(payload.get("on", True))
        if on:
            self._ensure_sampler(self.current_plan())
        else:
            self._stop_sampler()
        self.store.add_event(c.EV_TELEMETRY, f"sampler {'on' if on else 'off'}", {"sampler": on})
        return {"sampler": on}

    def cmd_rollback(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.run is not None and self.run.poll() is None:
            raise RuntimeError("rollback is for a failed or stopped run; stop this one first")
        plan_json = self._last_good_plan_json()
        if plan_json is None:
            raise RuntimeError("no segment ever finished a step: there is no good plan to roll back to")
        self.launch(Plan.from_json(plan_json), reason="rollback to the last good plan")
        return {"segment": self.segment_id}

    def _last_good_plan_json(self) -> str | None:
        """The plan of the newest segment that completed at least one step and did not fail."""
        steps = self.store.frame("steps")
        good = set(steps["segment_id"]) if len(steps) else set()
        for seg in reversed(self.store.rows("segments")):
            if seg["status"] != "failed" and seg["id"] in good:
                return seg["plan_json"]
        return None

    # ----------------------------------------------------------------- run life cycle
    def _end_run(self, state: str, reason: str) -> None:
        if self.run is not None:
            self.run.kill()
        self._abandon_changes(reason)
        self._stop_sampler()
        if self.segment_id is not None and self.store.segment(self.segment_id)["status"] == "running":
            self.store.end_segment(self.segment_id, "done", reason)
        self.run = None
        self.stopping_since = None
        self.set_state(state)
        self.store.add_event(state, reason)

    def check_run(self) -> None:
        if self.run is None:
            return
        rc = self.run.poll()
        if rc is None:
            if self.stopping_since and time.time() - self.stopping_since > STOP_GRACE_S:
                self._end_run(c.STOPPED, f"no step boundary within {STOP_GRACE_S:.0f} s: stopped at once")
            return
        # The runner may have opened further segments (hot applies): the newest one is the one that ended.
        self.segment_id = self.store.last_segment()["id"]
        if rc != 0 and self.pending_in_place and self._rebuild_failed():
            return self._relaunch_after_failed_rebuild()
        if rc != 0:
            tail = traceback_tail(self.run.log_path)
            # An OOM inside a Ray worker surfaces as a wrapper error at the end: look further back than the tail.
            oom = looks_like_oom(log_tail(self.run.log_path, OOM_SCAN_LINES))
            self.run.kill()  # Ray leaves workers behind on a crash
            self.run = None
            self.store.end_segment(self.segment_id, "failed", "out of memory" if oom else f"exit code {rc}")
            self._abandon_changes(f"the run crashed ({'out of memory' if oom else f'exit code {rc}'})")
            self.set_state(c.FAILED)
            self.store.add_event(
                c.EV_CRASH,
                ("verl ran out of GPU memory" if oom else f"verl exited with code {rc}")
                + (": roll back to the last good plan with session.rollback()" if not self.stopping_since else ""),
                {"segment": self.segment_id, "exit_code": rc, "oom": oom, "traceback_tail": tail},
            )
            if self.stopping_since:  # the operator asked for a stop: it is stopped, not waiting for a rollback
                self.stopping_since = None
                self.set_state(c.STOPPED)
                self.store.add_event(c.EV_STOPPED, "stopped by the operator (its last step crashed: see the crash)")
            return
        self.run.kill()
        ended, self.run = self.run.end_words, None
        if self.pending_plan is not None:
            self.store.end_segment(self.segment_id, "done", "checkpointed for a restart-class change")
            self._relaunch_pending(self.current_plan())
            return
        self.store.end_segment(self.segment_id, "done", "run ended")
        self._stop_sampler()
        state = c.STOPPED if self.stopping_since else c.FINISHED
        self.ended = ended if state == c.FINISHED else None
        self._abandon_changes(ended if state == c.FINISHED else "the session was stopped")
        self.stopping_since = None
        self.set_state(state)
        self.store.add_event(state, "verl run ended" if state == c.FINISHED else "stopped by the operator")

    def _relaunch_pending(self, previous: Plan) -> None:
        """Relaunch verl under the pending restart-class change (from the plan `previous`), resuming from the
        checkpoint the run wrote for it."""
        new, command_id = self.pending_plan, self.pending_command
        self.pending_plan = self.pending_command = None
        self.pending_in_place = False
        env, losses = restart_environment(previous, new, self.dir, c.latest_checkpoint_step(self.dir))
        for loss in losses:
            self.store.add_event(c.EV_NOT_RESUMED, loss)
        seen = self.store.max_id("events")
        self.launch(new, reason="restart-class change", env=env)
        if command_id is not None:
            self.resuming = (command_id, self.segment_id, seen)

    def _rebuild_failed(self) -> bool:
        seen = self.resuming[2] if self.resuming else 0
        return any(e["kind"] == c.EV_REBUILD_FAILED for e in self.store.rows("events", since_id=seen))

    def _relaunch_after_failed_rebuild(self) -> None:
        """An in-place rebuild failed before verl was ready, after the run checkpointed (at the step boundary, or
        after the failure where it kept the trainer): the segment the runner opened for it failed; the change is
        relaunched as any restart-class change is."""
        self.run.kill()
        self.run = None
        failed = self.segment_id
        self.store.end_segment(failed, "failed", "rebuilding verl in place failed: relaunched instead")
        before = [seg for seg in self.store.rows("segments") if seg["id"] < failed][-1]
        self._relaunch_pending(Plan.from_json(before["plan_json"]))

    def loop(self) -> int:
        self.store.set_meta(supervisor_pid=os.getpid())
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            while True:
                # Runs first: a run that just exited for a restart is relaunched before commands look for a run.
                self.check_run()
                self.check_resumed()
                self.handle_commands()
                if self._exiting():
                    # What came in while the state was being written (behind a stop) is answered too; no change
                    # comes after: Session.apply queues none once the state is closed (control.CLOSED_STATES).
                    self.handle_commands()
                    if self._exiting():
                        break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self._end_run(c.STOPPED, "supervisor terminated")
        except Exception as error:  # e.g. the store can't be written (disk full): said, and nothing left running
            _log(traceback.format_exc())
            self.fail(f"the supervisor could not go on: {_words(error)}")
            return 1
        finally:
            self._stop_sampler()
            self.ray.stop()
            checkpoints.release(self.dir)
        return 0

    def _exiting(self) -> bool:
        return self.state() in c.CLOSED_STATES and self.run is None and self.pending_plan is None

    def fail(self, reason: str) -> None:
        """End what runs and say why the supervisor stops (in the store if it takes it, else the failure note)."""
        for step in (lambda: self.run is not None and self.run.kill(), self._stop_sampler,
                     lambda: self._abandon_changes(f"the supervisor failed: {reason}"),
                     lambda: self._release_claimed(f"the supervisor failed: {reason}"),
                     lambda: self.segment_id is not None and self.store.end_segment(self.segment_id, "failed", reason)):
            try:
                step()
            except Exception:  # noqa: BLE001 — the store may be what fails; the rest must still happen
                pass
        self.run = None
        record_failure(self.dir, reason)


class StartupError(RuntimeError):
    """What keeps a supervisor from starting its session, in words for the session's failure."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # recorded as the session's failure instead of usage text only a log would show
        raise StartupError(f"bad supervisor arguments: {message}")


def _words(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _log(text: str) -> None:
    """Into the supervisor's log, if the disk takes it (a full disk must not stop the failure from being said)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:
        pass


def _session_arg(argv: list[str] | None) -> Path | None:
    """--session, read without the parser (the other arguments may be what is wrong)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    for index, arg in enumerate(argv):
        if arg == "--session" and index + 1 < len(argv):
            return Path(argv[index + 1])
        if arg.startswith("--session="):
            return Path(arg.split("=", 1)[1])
    return None


def record_failure(session_dir: Path, reason: str) -> None:
    """Say why the supervisor can't go on: state failed and an event in the store or, where the store can't take
    them (unwritable, disk full), the failure note the session handle reads; and in the supervisor's log."""
    _log(f"supervisor failed: {reason}")
    try:
        store = Store(session_dir, create=False)
        try:
            store.set_meta(state=c.FAILED, failure=reason, supervisor_pid=os.getpid())
            store.add_event(c.EV_FAILED, reason, {"supervisor_pid": os.getpid()})
        finally:
            store.close()
        return
    except Exception:  # noqa: BLE001 — whatever the store says, the note carries the reason
        pass
    try:
        c.write_failure_note(session_dir, reason)
    except OSError as error:
        _log(f"supervisor: no failure note either: {error}")


def main(argv: list[str] | None = None) -> int:
    # What this supervisor and its runs write (store, logs, checkpoints) is the owner's alone.
    os.umask(0o077)
    # Past a file size limit a write fails (EFBIG) and is said, instead of SIGXFSZ killing the supervisor unheard.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    session_dir = _session_arg(argv)
    if session_dir is not None:
        try:
            c.reserve_failure_note(session_dir)
        except OSError:
            pass  # an unwritable session directory: the store (if it can be written) or the log says why
    try:
        supervisor = _start(argv)
    except Exception as error:  # anything that stops it before its loop: said, not left "starting" for ever
        _log(traceback.format_exc())
        if session_dir is None:
            raise
        record_failure(session_dir, _words(error))
        return 1
    return supervisor.loop()


def _start(argv: list[str] | None) -> Supervisor:
    parser = _Parser(prog="python -m workbench.supervisor")
    parser.add_argument("--session", type=Path, required=True)
    parser.add_argument("--replay", type=Path, help="play this recorded session instead of running verl")
    parser.add_argument("--speed", type=float, default=1.0, help="replay speed (2 = twice real time)")
    parser.add_argument("--startup-speed", type=float, help="speed of the recorded start-up")
    parser.add_argument("--crash-at-step", type=int, help="replay fault injection: crash at this step")
    parser.add_argument(
        "--no-follow", action="store_true",
        help="replay without the recorded operator: none of the recording's commands are re-issued",
    )
    args = parser.parse_args(argv)
    run_factory = None
    if args.replay is not None:
        from .replay import replay_factory

        run_factory = replay_factory(
            args.session, args.replay, speed=args.speed, crash_at_step=args.crash_at_step, follow=not args.no_follow,
            startup_speed=args.startup_speed,
        )
    supervisor = Supervisor(args.session, run_factory=run_factory)
    supervisor.store.set_meta(supervisor_pid=os.getpid())
    prometheus_port = supervisor.store.meta().get("prometheus_port")
    if prometheus_port is not None:
        from .telemetry.prometheus import serve

        try:
            _, port = serve(supervisor.store, port=int(prometheus_port))
        except OSError as error:
            in_use = error.errno == errno.EADDRINUSE
            raise StartupError(f"Prometheus port {prometheus_port} is " + ("in use by another program" if in_use else
                               f"unusable: {error.strerror}") + ": start the session with another prometheus_port "
                               "(0 picks a free one)") from error
        url = f"http://127.0.0.1:{port}/metrics"
        supervisor.store.set_meta(prometheus_url=url)
        supervisor.store.add_event("prometheus", f"metrics for Prometheus at {url}", {"url": url})
    if args.replay is not None:
        # The warm-up (composing verl's config and the plan) holds the interpreter for tenths of a second at a time:
        # the replay starts playing at its recorded pace once it has ended.
        run_factory.ready = supervisor.warmed
    if supervisor.store.last_segment() is None:
        supervisor.launch(Plan.from_json(supervisor.store.meta()["initial_plan"]), reason="start")
    return supervisor


if __name__ == "__main__":
    sys.exit(main())
