"""The recorded sessions a replay plays (workbench/assets/recordings/), and what a replay of one can take.

A replay can only play what was recorded: a change is playable when a recorded segment ran the plan it leads to.
`RecordedPlans` reads just a recording's plans (not its timed rows), once per process, so a preview can refuse at
once what the replay would refuse later, and name the changes it can take instead (`offers`).

This module stays light (sqlite3 for the listing, no pandas): `verl-workbench up --help` lists the recordings.
"""

from __future__ import annotations

import functools
import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from .control import STORE_FILE

if TYPE_CHECKING:
    from .plan import Plan

BUNDLED = Path(__file__).resolve().parent / "assets" / "recordings"
NO_RECORDED_SEGMENT = "this replay has no recorded segment with that plan: applying it needs a GPU (live session)"
REPLAY_ENDED = ("the replay has ended: its recording has no more steps with the plan in force; play it again "
                "(Session.start_like(), or Play again on the page)")


def bundled() -> list[str]:
    """The names of the recordings that come with the workbench."""
    return sorted(p.name for p in BUNDLED.iterdir() if (p / STORE_FILE).exists())


def describe(name: str) -> str:
    """One line about a bundled recording, from its store: GPU, date, steps and segments."""
    path = BUNDLED / name / STORE_FILE
    with sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True) as db:
        meta = {key: json.loads(value) for key, value in db.execute(
            "SELECT key, value FROM meta WHERE key IN ('gpu_name', 'gpus_used', 'date')")}
        steps, segments = db.execute("SELECT COUNT(*), COUNT(DISTINCT segment_id) FROM steps").fetchone()
    return (f"{meta.get('gpus_used', 1)} × {meta.get('gpu_name', 'GPU')}, {meta.get('date', '?')}: "
            f"{steps} steps in {segments} segment{'s' if segments != 1 else ''}")


def ran(plan_json: str, knobs: Callable[[], dict[str, Any]], plan: Plan) -> bool:
    """Whether a recorded plan (its JSON, its knob values on demand) is `plan`: the very same plan, or one with
    equal knob values."""
    return plan_json == plan.to_json() or knobs() == plan.knob_values()


def changes_to(current: Plan, recorded: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each recorded plan's knob values other than `current`'s: the knob changes that switch to it (each
    once, in recorded order)."""
    knobs = current.knob_values()
    out: list[dict[str, Any]] = []
    for values in recorded:
        changes = {k: v for k, v in values.items() if knobs.get(k) != v}
        if changes and changes not in out:
            out.append(changes)
    return out


def change_text(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in changes.items())


def no_segment_words(offers: Sequence[dict[str, Any]]) -> str:
    """Why a replay can't take a change, and the changes it can take from the plan in force."""
    if not offers:
        return NO_RECORDED_SEGMENT
    return f"{NO_RECORDED_SEGMENT}. It can take: " + "; or ".join(change_text(changes) for changes in offers)


class RecordedPlans:
    """The plans a recording's segments ran (those that ran a step or crashed), in recorded order."""

    def __init__(self, directory: str | Path):
        with sqlite3.connect(f"file:{Path(directory) / STORE_FILE}?mode=ro", uri=True) as db:
            played = {row[0] for row in db.execute("SELECT DISTINCT segment_id FROM steps")}
            played |= {json.loads(row[0]).get("segment") for row in db.execute(
                "SELECT data_json FROM events WHERE kind = 'crash'")}
            rows = db.execute("SELECT id, plan_json FROM segments ORDER BY id").fetchall()
        self.plan_jsons = tuple(dict.fromkeys(plan_json for segment_id, plan_json in rows if segment_id in played))

    @functools.cached_property
    def knobs(self) -> tuple[dict[str, Any], ...]:
        # Parsed on demand: some knobs' defaults import verl (seconds; an operator's handle warms it up anyway).
        from .plan import Plan

        return tuple(Plan.from_json(plan_json).knob_values() for plan_json in self.plan_jsons)

    def takes(self, plan: Plan) -> bool:
        """Whether a recorded segment ran `plan`, so that a replay can play it."""
        return any(ran(plan_json, lambda i=i: self.knobs[i], plan) for i, plan_json in enumerate(self.plan_jsons))

    def offers(self, current: Plan) -> list[dict[str, Any]]:
        """The changes from `current` a replay of this recording can take (one per other recorded plan)."""
        return changes_to(current, self.knobs)


@functools.lru_cache(maxsize=8)
def _recorded_plans(directory: str) -> RecordedPlans:
    return RecordedPlans(directory)


def recorded_plans(directory: str | Path) -> RecordedPlans:
    """A recording's plans, read once per process."""
    return _recorded_plans(str(Path(directory).resolve()))
