"""The step boundary: where a run (the live trainer inside verl, or a replay) executes the supervisor's directives.

One executor for both, so pause / resume / hot apply / checkpoint-and-exit / stop mean the same in a replay as in a
live run. It imports no verl: the run gives it what differs as callables (how to put new budgets in force, how to
checkpoint, how to end the run, how to wait while paused).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from . import control as c
from .knob import KEEP_WORDS, checkpoints_first
from .store import Store

PAUSE_POLL_S = 0.1


@dataclass
class HotChange:
    """What a run reports after putting a hot change in force: the values before, and anything to add to the
    `applied` event (text appended, data merged)."""

    before: dict[str, Any]
    note: str = ""
    data: dict[str, Any] = field(default_factory=dict)


class StepBoundary:
    """Executes runner directives at a step boundary and keeps the segment a run writes to.

    hot_apply(changes, plan_json, step) -> HotChange: put the changes in force (raise to refuse: nothing changes).
    checkpoint(step) -> str: save a checkpoint; returns words for the event.
    end_run(): make the run end after this step. idle(seconds): wait while paused (a replay raises when killed).
    rebuild(payload, segment_id) -> str: prepare an in-place rebuild of verl under the directive's plan, as the new
    segment (after the checkpoint where the change needs one; the run's fit ends after this step and verl, or its
    rollout, is rebuilt); returns words for the event. None where the run can't (a replay: the supervisor relaunches it instead).
    replay=True marks events as the replay's own ("replay: …", data replay=True).
    token: the session's operator token. Only directives the supervisor signed with it are executed (each once):
    anyone who can write the store (a viewer that should not, a copied row) can't steer the run.
    """

    def __init__(
        self, store: Store, segment_id: int, *, hot_apply: Callable[[dict, str, int], HotChange],
        checkpoint: Callable[[int], str], end_run: Callable[[], None], idle: Callable[[float], None] = time.sleep,
        replay: bool = False, token: str, rebuild: Callable[[dict, int], str] | None = None,
    ):
        self.store = store
        self._signatures = c.SignatureCheck(token)
        self.segment_id = segment_id
        self.paused = False
        self._hot_apply = hot_apply
        self._checkpoint = checkpoint
        self._end_run = end_run
        self._rebuild = rebuild
        self._idle = idle
        self._replay = replay

    def _event(self, kind: str, text: str, data: dict[str, Any]) -> None:
        if self._replay:
            text, data = f"replay: {text}", {**data, "replay": True}
        self.store.add_event(kind, text, data)

    def __call__(self, step: int) -> bool:
        """Execute what the supervisor sent (and, while paused, what it sends, waiting here); True: the run ends
        after this step."""
        ending = False
        while True:
            # One at a time, and none once the run is ending: what comes behind a checkpoint-and-exit or a stop (a
            # pause sent during a restart) is the relaunched run's; taken here, a pause kept the ending run waiting.
            while not ending and (taken := self.store.take_commands(kinds=c.RUNNER_DIRECTIVES,
                                                                     taker=c.TAKEN_BY_RUNNER, limit=1)):
                directive = taken[0]
                why = self._signatures.refusal(directive["kind"], directive["payload"])
                if why is not None:
                    why = why if why.startswith("malformed") else "not signed by this session's supervisor"
                    self.store.finish_command(directive["id"], c.REFUSED, why)
                    self._event(c.EV_REFUSED, f"{directive['kind']}: {why}", {"command": directive["id"], "step": step})
                    continue
                ending = self._execute(directive, step) or ending
            if not self.paused:
                return ending
            self._idle(PAUSE_POLL_S)

    def _execute(self, directive: dict[str, Any], step: int) -> bool:
        kind, payload = directive["kind"], directive["payload"]
        ending = False
        try:
            if kind == c.RUNNER_PAUSE:
                self.paused = True
                self.store.set_meta(state=c.PAUSED)
                self._event(c.EV_PAUSED, f"paused after step {step}", {"step": step})
            elif kind == c.RUNNER_RESUME:
                self.paused = False
                self.store.set_meta(state=c.RUNNING)
                self._event(c.EV_RESUMED, f"resumed after step {step}", {"step": step})
            elif kind == c.RUNNER_HOT_APPLY:
                self._apply(payload, step)
            elif kind == c.RUNNER_REBUILD:
                self._rebuild_in_place(payload, step)
                self.paused, ending = False, True
                self._end_run()
            elif kind in (c.RUNNER_CHECKPOINT_EXIT, c.RUNNER_STOP):
                if kind == c.RUNNER_CHECKPOINT_EXIT or payload.get("checkpoint"):
                    words = self._checkpoint(step)
                    self._event(c.EV_CHECKPOINT, f"checkpoint at step {step}{words}", {"step": step})
                self.paused, ending = False, True
                self._end_run()
                self._event(c.EV_EXITING, f"exits after step {step} ({kind.split('.')[1]})", {"step": step})
            else:
                raise ValueError(f"unknown directive {kind!r}")
            self.store.finish_command(directive["id"], c.DONE, {"step": step})
        except Exception as e:
            self.store.finish_command(directive["id"], c.FAILED_COMMAND, repr(e))
            self._event(c.EV_ERROR, f"{kind} failed at step {step}: {e}", {"step": step})
            if kind in (c.RUNNER_HOT_APPLY, c.RUNNER_REBUILD) and payload.get("command") is not None:
                self.store.finish_command(payload["command"], c.NOT_APPLIED, {"message": f"the run refused it: {e}"})
        return ending

    def _rebuild_in_place(self, payload: dict[str, Any], step: int) -> None:
        """Checkpoint (unless the change keeps the trainer's workers, whose state stays where it is), then the new plan
        as a new segment that verl, rebuilt in place, resumes from there. Nothing changes when the checkpoint fails
        (the change is refused, the run goes on under its plan)."""
        if self._rebuild is None:
            raise ValueError("this run can't rebuild verl in place")
        keeps = payload["keeps"]
        if checkpoints_first(keeps):
            words = self._checkpoint(step)
            self._event(c.EV_CHECKPOINT, f"checkpoint at step {step}{words}", {"step": step})
            resuming = f"resuming from the checkpoint at step {step}"
        else:
            resuming = f"going on after step {step} (no checkpoint: the trainer's state stays in its workers)"
        self.store.end_segment(self.segment_id, "done", "ended for a restart-class change (rebuilt in place)")
        self.segment_id = self.store.begin_segment(payload["plan_json"], reason="restart-class change",
                                                   resumed_from_step=step)
        note = self._rebuild(payload, self.segment_id)
        for loss in payload.get("losses", []):
            self._event(c.EV_NOT_RESUMED, loss, {"segment": self.segment_id})
        self._event(
            c.EV_LAUNCHED, f"segment {self.segment_id} rebuilt in place (restart-class change; keeps "
            f"{KEEP_WORDS[keeps]}), {resuming}{note}",
            {"segment": self.segment_id, "resume_step": step, "in_place": True, "keeps": keeps,
             "command": payload.get("command")})

    def _apply(self, payload: dict[str, Any], step: int) -> None:
        changes: dict[str, Any] = payload["changes"]
        done = self._hot_apply(changes, payload["plan_json"], step)
        # A hot change is a new segment: same run, new plan, measured separately.
        self.store.end_segment(self.segment_id, "done", f"hot apply after step {step}")
        self.segment_id = self.store.begin_segment(payload["plan_json"], reason="hot apply", resumed_from_step=step)
        text = ", ".join(f"{k} {done.before.get(k)} → {v}" for k, v in changes.items())
        self._event(
            c.EV_APPLIED, f"hot: {text} from step {step + 1}{done.note}",
            {"mode": "hot", "from_step": step + 1, "changes": changes, "before": done.before,
             "segment": self.segment_id, "command": payload.get("command"), **done.data},
        )
        if payload.get("command") is not None:
            self.store.finish_command(
                payload["command"], c.APPLIED,
                {"mode": "hot", "changes": changes, "step": step + 1, "segment": self.segment_id},
            )
