"""The recorded session's operator, played back in a replay: its commands (changes, sampler switches, rollback,
stop) re-issued into the replayed session at the points of the story where the recording gave them, until the user
changes the story's course (replay.py starts it; a replay with follow=False has none).
"""

from __future__ import annotations

import json
import threading
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any, Sequence

from . import control as c
from .plan import Plan
from .store import Store

TICK_S = 0.1  # how often the operator looks at the session
# The recorded operator's commands that a replay re-issues. A pause and its resume are left out: no recorded step
# lies between them, so a replayed pause would last one tick.
REPLAYED_COMMANDS = ("apply", "telemetry", "rollback", "stop")
# How recordings carry the operator's credentials: a signature (now) or the token itself (before commands were
# signed). Neither is valid in another session: a re-issued command is signed afresh.
RECORDED_CREDENTIALS = ("token", *c.SIGNATURE_FIELDS)
TOOK_CONTROL = "replay: you took control; the recorded operator's remaining commands are not replayed"
FOLLOWED_YOU = "replay: your change is the recording's next one: the recorded story goes on from it"
# A user's command that changes the story's course takes control from the recorded operator; a pause, a resume or a
# sampler switch does not (the story goes on after them).
COURSE_COMMANDS = (c.APPLY, c.ROLLBACK, c.STOP)


@dataclass(frozen=True)
class RecordedCommand:
    """A command the recorded operator gave (its payload without credentials), the step the recorded session had
    completed when it arrived (0: none yet), and, for a change, the first step it was in force (None: unknown)."""

    id: int
    kind: str
    payload: dict[str, Any]
    after_step: int
    in_force_from: int | None = None

    def __str__(self) -> str:
        when = "the crash" if self.kind == "rollback" else f"step {self.after_step}"
        return f"{self.kind} after {when}"


def operator_commands(commands: list[dict[str, Any]], steps: list[dict[str, Any]]) -> tuple[RecordedCommand, ...]:
    """The recorded operator's commands that a replay re-issues (those the recorded supervisor carried out), in
    order, each with the step the recorded session had completed when it arrived: its newest step by then."""
    by_time = sorted(steps, key=lambda row: row["t"])
    times = [row["t"] for row in by_time]
    out = []
    for command in commands:
        if command["kind"] in REPLAYED_COMMANDS and command["state"] in c.CARRIED_OUT:
            newest = bisect_right(times, command["t"]) - 1
            after_step = by_time[newest]["step"] if newest >= 0 else 0
            payload = {k: v for k, v in command["payload"].items() if k not in RECORDED_CREDENTIALS}
            out.append(RecordedCommand(command["id"], command["kind"], payload, after_step, _step_of(command["result"])))
    return tuple(out)


def _step_of(result: Any) -> int | None:
    """The step a command's stored result names (a change's first step in force), if any."""
    try:
        step = (json.loads(result) if isinstance(result, str) else result or {}).get("step")
    except (ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def takes(state: str, kind: str) -> bool:
    """Whether the supervisor takes a command of `kind` in session state `state`."""
    if kind == "apply":
        return state in ("starting", "running")  # a run in progress, and no restart-class change pending
    if kind == "rollback":
        return state == "failed"
    return True  # telemetry and stop: in any state


class RecordedOperator:
    """The recorded session's operator, played back in the supervisor process: a thread that re-issues the
    recording's commands into this session's store, signed with this session's operator token, one at a time, in
    the recorded order, each once the previous one was answered:
    - an apply, telemetry or stop once the replayed session has completed the step the recorded one had completed
      when the command arrived, and is in a state that takes it (`takes`);
    - a rollback once the replayed session has failed.
    A run holds before a step while the operator owes a command from before it (`owes`), so each directive reaches
    the step boundary it reached in the recording, whatever the speed and the supervisor's latency.
    The user's control always wins: at the user's first apply, rollback or stop it stops for good, unless that apply
    is the recorded operator's next change: then it counts as issued, and the rest of the story follows, shifted by
    the steps between where the user gave it and where the recording did.
    """

    def __init__(self, store: Store, token: str, commands: Sequence[RecordedCommand]):
        self._store = store
        self._token = token
        self._pending = list(commands)
        self._issued: set[int] = set()  # store ids of the commands it issued
        self._in_flight: int | None = None  # the store id of the command awaiting the supervisor's answer
        self._seen = 0  # store id of the last command checked for the user's
        self._shift = 0  # steps between the replay's story and the recording's (a recorded change given earlier)
        self._adopted: tuple[int, RecordedCommand] | None = None  # a user's command taken as the recorded one
        self._stopped = False
        self._lock = threading.Lock()  # `owes` reads what the operator's thread changes
        if self._pending:
            self._store.add_event(
                "replay",
                "replay: the recorded operator's commands follow at their recorded points ("
                + ", ".join(map(str, self._pending)) + "); a change of your own, a rollback or a stop takes control",
                {"commands": [command.kind for command in self._pending], "replay": True},
            )
            threading.Thread(target=self._main, name="recorded-operator", daemon=True).start()

    def owes(self, step: int) -> bool:
        """Whether a run must hold before `step`: the recorded operator gave its next command before the recorded
        `step`, and it is still to be issued (the session takes it) or answered."""
        with self._lock:
            if self._stopped or not self._pending:
                return False
            command = self._pending[0]
            if command.kind == "rollback" or self._point(command) >= step:
                return False
            return self._in_flight is not None or self._due(command)

    def _main(self) -> None:
        while self._pending:
            if self._user_took_control():
                return
            self._settle_shift()
            if self._in_flight is not None:
                if self._store.command(self._in_flight)["state"] in c.ANSWERED:
                    with self._lock:
                        self._pending.pop(0)
                        self._in_flight = None
            elif self._due(self._pending[0]):
                self._issue(self._pending[0])
            time.sleep(TICK_S)

    def _point(self, command: RecordedCommand) -> int:
        """The step after which this replay's story gives the command."""
        return command.after_step + self._shift

    def _due(self, command: RecordedCommand) -> bool:
        """Whether the replayed session has reached the command's point and takes it now."""
        reached = command.kind == "rollback" or (self._store.last_step() or 0) >= self._point(command)
        return reached and takes(self._store.meta().get("state", "starting"), command.kind)

    def _issue(self, command: RecordedCommand) -> None:
        payload = c.signed(self._token, command.kind, {**command.payload, "recorded_command": command.id})
        command_id = self._store.put_command(command.kind, payload)
        with self._lock:
            self._issued.add(command_id)
            self._in_flight = command_id

    def _adopt(self, command: dict[str, Any]) -> bool:
        """Count a user's apply as issued when it is the recorded operator's next change, from wherever it came."""
        with self._lock:
            nxt = self._pending[0] if self._pending and self._in_flight is None else None
        if nxt is None or nxt.kind != c.APPLY or command["kind"] != c.APPLY:
            return False
        in_force = Plan.from_json(self._store.last_segment()["plan_json"]).knob_values()

        def effect(changes: dict[str, Any]) -> dict[str, Any]:  # what a change changes in the plan in force
            return {k: v for k, v in (changes or {}).items() if in_force.get(k) != v}

        if effect(nxt.payload.get("changes")) != effect(command["payload"].get("changes")):
            return False
        with self._lock:
            self._shift = (self._store.last_step() or 0) - nxt.after_step  # until it is in force (_settle_shift)
            self._adopted = (command["id"], nxt)
            self._issued.add(command["id"])
            self._in_flight = command["id"]
        self._store.add_event("replay", FOLLOWED_YOU, {"command": command["id"], "shift": self._shift, "replay": True})
        return True

    def _settle_shift(self) -> None:
        """Once an adopted change is in force, the story's shift is where it came in force against where the
        recorded one did: the recorded commands after it then reach the same recorded steps."""
        if self._adopted is None:
            return
        command_id, recorded = self._adopted
        step = _step_of(self._store.command(command_id)["result"])
        if step is not None and recorded.in_force_from is not None:
            with self._lock:
                self._shift, self._adopted = step - recorded.in_force_from, None

    def _user_took_control(self) -> bool:
        for command in self._store.rows("commands", since_id=self._seen):
            self._seen = command["id"]
            if command["kind"] in COURSE_COMMANDS and command["id"] not in self._issued and not self._adopt(command):
                with self._lock:
                    self._stopped = True
                    not_replayed = self._pending[1:] if self._in_flight is not None else self._pending
                self._store.add_event(
                    "replay", TOOK_CONTROL,
                    {"command": command["id"], "not_replayed": [str(c) for c in not_replayed], "replay": True},
                )
                return True
        return False
