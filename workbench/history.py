"""A session's history, read from its store: the plans that ran (segments, each with its diff from the one before
and what it measured), where the roles were planned and seen (placement), what the runs needed of this machine
(machine notes), where a launch's start-up went, and the what-if model's calibration (segment costs).

Session (session.py) answers with these in a line or two each; the logic lives here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from . import control as c
from . import verl_config
from .advisor import segment_costs
from .plan import Plan
from .store import Store

SEGMENT_COLUMNS = ["id", "started_at", "ended_at", "plan_json", "status", "reason", "resumed_from_step", "diff",
                   "diff_text", "steps", "first_step", "last_step", "step_time_s", "throughput", "util_mean",
                   "sm_active_mean", "mem_peak_gb"]
PLACEMENT_COLUMNS = ["gpu", "planned", "actual", "processes", "mem_used", "mismatch", "message"]
# What a runner note implies for plain verl on this machine, said beside the note where it appears.
NOTE_CONSEQUENCES = {
    "flash-attn": "verl 0.9.1's critic loader asks for flash_attention_2 whatever the config says: without "
                  "flash-attn, plain verl's critic fails to load (the workbench patches it to sdpa in its Ray workers)",
}
# Process roles the sampler records that are no verl role of the plan.
_NOT_A_ROLE = {"driver", "other", "agent_loop"}


class PlanCache:
    """Plans by their JSON: a session's segments share a few plans, each parsed once."""

    def __init__(self) -> None:
        self._plans: dict[str, Plan] = {}

    def plan(self, plan_json: str) -> Plan:
        if plan_json not in self._plans:
            self._plans[plan_json] = Plan.from_json(plan_json)
        return self._plans[plan_json]

    def knobs(self, plan_json: str) -> dict[str, Any]:
        return self.plan(plan_json).knob_values()


def segments_frame(store: Store, plans: PlanCache, since_id: int = 0) -> pd.DataFrame:
    """Every plan that ran (segments after since_id) with its knob diff from the segment before it (Plan.knob_diff)
    and what it measured (SEGMENT_COLUMNS)."""
    rows = store.rows("segments", since_id=max(0, since_id - 1) if since_id else 0)
    figures = store.step_figures(since_segment=since_id).set_index("segment_id")
    out = []
    previous = None
    for seg in rows:
        if seg["id"] > since_id:
            plan = plans.plan(seg["plan_json"])
            entries = plans.plan(previous["plan_json"]).knob_diff(plan) if previous else []
            diff = [{"knob": d["knob"], "before": d["old"], "after": d["new"]} for d in entries]
            row = {**seg, "diff": diff, "diff_text": ", ".join(f"{d['knob']}: {d['before']!r} → {d['after']!r}"
                                                               for d in diff)}
            fig = figures.loc[seg["id"]] if seg["id"] in figures.index else None
            for name in ("steps", "first_step", "last_step", "step_time_s", "throughput"):
                row[name] = fig[name] if fig is not None else (0 if name == "steps" else math.nan)
            row.update(store.sample_figures(seg["started_at"], seg["ended_at"], gpus=plan.knob_values()["gpus"]))
            out.append(row)
        previous = seg
    return pd.DataFrame(out, columns=SEGMENT_COLUMNS)


def planned_roles(values: dict[str, Any], roles: verl_config.RolesInUse) -> dict[int, list[str]]:
    """GPU -> the roles a plan puts there. Ray picks physical GPUs inside the plan's set, so roles follow the pools
    in order: the actor pool first (actor, rollout, and the critic and reward model where they have no pool of
    their own), then critic, reward, rollout."""
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


def placement_frame(plan: Plan, procs: pd.DataFrame) -> pd.DataFrame:
    """Per GPU: the roles `plan` puts there, the roles whose processes the sampler saw there (`procs`: the newest
    sample per process) with their memory, and whether they disagree (PLACEMENT_COLUMNS)."""
    planned = planned_roles(plan.knob_values(), verl_config.roles_in_use(plan.config))
    rows = []
    for gpu, want in planned.items():
        here = procs[procs["gpu"] == gpu]
        seen = _roles_seen(here)
        unexpected = sorted(set(seen) - set(want))
        message = (f"GPU {gpu}: {', '.join(unexpected)} running here, but the plan puts "
                   f"{', '.join(want) or 'nothing'} here") if unexpected else ""
        rows.append({"gpu": gpu, "planned": want, "actual": seen, "processes": _memory_by_process(here),
                     "mem_used": float(here["mem_used"].sum()) if len(here) else math.nan,
                     "mismatch": bool(unexpected), "message": message})
    for gpu in sorted(set(procs["gpu"]) - set(planned)):
        here = procs[procs["gpu"] == gpu]
        seen = _roles_seen(here)
        if seen:
            rows.append({"gpu": int(gpu), "planned": [], "actual": seen, "processes": _memory_by_process(here),
                         "mem_used": float(here["mem_used"].sum()), "mismatch": True,
                         "message": f"GPU {gpu} is outside the plan, but {', '.join(seen)} runs there"})
    return pd.DataFrame(rows, columns=PLACEMENT_COLUMNS)


def _roles_seen(procs: pd.DataFrame) -> list[str]:
    return sorted({atom for role in procs["role"] for atom in str(role).split("+")} - _NOT_A_ROLE)


def _memory_by_process(procs: pd.DataFrame) -> dict[str, float]:
    return {f"{r.role} (pid {r.pid})": r.mem_used for r in procs.itertuples()}


def machine_notes(events: pd.DataFrame) -> list[str]:
    """What runs of a session needed that plain verl does not do on this machine: the runner's notes (events of
    kind runtime), each once, then what they imply."""
    notes = list(dict.fromkeys(events.query("kind == @c.EV_RUNTIME")["text"]))
    return notes + [consequence for word, consequence in NOTE_CONSEQUENCES.items()
                    if any(word in note for note in notes)]


def plan_export(plan: Plan, format: str, notes: Callable[[], list[str]]) -> str | list[str]:
    """A plan as Hydra overrides (a list), YAML or a command line; YAML and command start with the machine notes
    (`notes()`: what this machine needed that verl's defaults don't do on their own) as comments."""
    if format == "overrides":
        return plan.to_overrides()
    if format not in ("yaml", "command"):
        raise ValueError(f"unknown export format {format!r}: choose one of overrides, yaml, command")
    body = plan.to_yaml() if format == "yaml" else plan.to_command()
    return "".join(f"# {line}\n" for line in notes()) + body


def startup_phases(store: Store, directory: Path, steps: pd.DataFrame, segment: int | None = None) -> pd.DataFrame:
    """Where a launch's start-up went (workbench/startup.py), from the segment's log: the newest launched segment
    up to `segment` (a hot-applied segment ran in the process its predecessor launched)."""
    from .startup import parse_startup, read_log

    rows = {r["id"]: r for r in store.rows("segments")}
    ids = sorted(i for i in rows if (segment is None or i <= segment))
    logs = [i for i in ids if (directory / c.LOG_DIR / f"segment-{i}.log").exists()]
    if not logs:
        raise FileNotFoundError(f"session {directory.name}: no segment log"
                                f"{'' if segment is None else f' up to segment {segment}'} "
                                f"in {directory / c.LOG_DIR} (recordings carry no logs)")
    launched = logs[-1]
    first = steps.loc[steps["segment_id"] == launched, "t"] if len(steps) else steps
    return parse_startup(read_log(directory / c.LOG_DIR / f"segment-{launched}.log"),
                         launched_at=rows[launched]["started_at"],
                         first_step_end=float(first.min()) if len(first) else None)


def segment_costs_of(store: Store, plans: PlanCache) -> list:
    """The what-if model's calibration (advisor.segment_costs): each segment with enough measured steps."""
    knobs = {row["id"]: plans.knobs(row["plan_json"]) for row in store.rows("segments")}
    return segment_costs(store.frame("steps"), store.frame("samples"), knobs)


class UntilNewRows:
    """A value read from a session's store, computed again only once `tables` have new rows (the what-if
    calibration on a new step; the memory model on a new step or event)."""

    def __init__(self, store: Store, tables: tuple[str, ...], compute: Callable[[], Any]) -> None:
        self._store, self._tables, self._compute = store, tables, compute
        self._seen: tuple[tuple, Any] | None = None  # (newest row ids, value)

    def get(self) -> Any:
        newest = tuple(self._store.max_id(table) for table in self._tables)
        if self._seen is None or self._seen[0] != newest:
            self._seen = (newest, self._compute())
        return self._seen[1]
