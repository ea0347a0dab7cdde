"""Live auto-tune: try candidate plans on the running session, one segment per trial, and keep the fastest.

    result = tune(session, knobs={"actor_token_budget": [8192, 16384], "fused_kernels": [True]})
    result = tune(session, candidates=[{"fused_kernels": True}, {"rollout_enforce_eager": False}])
    result.trials            # DataFrame: one row per trial
    result.best              # the winning knob values (now in force)

The search is Optuna's ask/tell over the candidates (a grid of the given knob values, or the given change dicts):
each candidate is enqueued in a chosen order and asked for, so the study holds every trial with its parameters and
the measured step time, stored as SQLite in the session directory (`optuna-dashboard sqlite:///…/tune.sqlite3`).
The order: the plan in force first (the baseline), then candidates that apply hot (no restart: a few steps each,
in the same process), then restart-class candidates by predicted gain (workbench.predict, calibrated on the
session's own segments). A candidate whose predicted peak memory, band included, crosses the out-of-memory line is
never applied (recorded as pruned), nor one
that preview refuses; knobs that change the algorithm are refused unless allowed. Tuning waits while the session
is paused and ends when it stops; at the end the best measured plan is put (back) in force.

A trial's step time is the median `timing_s/step` of its segment's steps, leaving out the first step of a segment
that started a new process (restart: its first step carries start-up work); a hot segment's first step counts.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Protocol, Sequence

import optuna
import pandas as pd

from . import predict as what_if
from .knobs import ALGORITHM_KNOBS, KNOBS
from .handles import ApplyResult, Preview
from .plan import Plan, PlanError



class Session(Protocol):
    """The part of workbench.session.Session a tuner uses: its public API, nothing else. (Session.tune imports
    this module, so importing session here would close an import circle; Session satisfies this protocol.)"""

    dir: Path
    is_operator: bool

    @property
    def state(self) -> str: ...

    @property
    def plan(self) -> Plan: ...

    def preview(self, changes: dict[str, Any] | None) -> Preview: ...

    def apply(self, changes: dict[str, Any] | None, wait: bool = False) -> ApplyResult: ...

    def pause(self) -> None: ...

    def steps(self, since_id: int = 0) -> pd.DataFrame: ...

    def segment(self, segment_id: int | None = None) -> dict[str, Any] | None: ...

    def segment_costs(self) -> list: ...

STUDY_FILE = "tune.sqlite3"
POLL_S = 0.2
ENDED = ("stopped", "finished", "failed", "lost")
TRIAL_COLUMNS = ("trial", "state", "change", "mode", "predicted_step_s", "predicted_gpu_peak_share", "step_time_s",
                 "throughput", "segment_id", "steps", "reason")
DEFAULT_STEP_CHOICES = (0.5, 2.0)  # an int knob given by name alone: half and twice its value


@dataclass(frozen=True)
class Candidate:
    change: dict[str, Any]  # knob values against the plan tuning started from (empty: that plan itself)
    mode: str | None  # "hot" | "restart" | None (the baseline)
    prediction: what_if.Prediction | None
    problems: dict[str, str]


@dataclass(frozen=True)
class TuneResult:
    study_name: str
    storage: str
    trials: pd.DataFrame
    best: dict[str, Any] | None  # the best trial's knob values (of the knobs tuned), now in force
    best_step_time_s: float | None
    ended_because: str


def _default_values(name: str, value: Any) -> list[Any]:
    knob = KNOBS[name]
    if knob.kind == "bool":
        return [not value]
    if knob.kind == "choice":
        return [choice for choice in knob.choices if choice != value]
    if knob.kind == "int" and isinstance(value, int):
        return sorted({max(1, int(value * f)) for f in DEFAULT_STEP_CHOICES} - {value})
    raise ValueError(f"{name}: give the values to try (tune(knobs={{'{name}': [...]}}))")


def grid(knobs: Mapping[str, Sequence[Any]] | Sequence[str], values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of the given knob values (a knob given by name alone: its other choices, or half and
    twice an integer), as changes against `values`."""
    if not isinstance(knobs, Mapping):
        knobs = {name: _default_values(name, values[name]) for name in knobs}
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ValueError(f"unknown knobs: {', '.join(unknown)}")
    names = list(knobs)
    options = [list(dict.fromkeys([values[name], *knobs[name]])) for name in names]
    return [{n: v for n, v in zip(names, combo) if v != values[n]} for combo in itertools.product(*options)]


def plan_candidates(session: Session, changes: Iterable[Mapping[str, Any]], *,
                    allow_algorithm_changes: bool = False) -> list[Candidate]:
    """The candidates in trial order, each previewed and predicted: baseline, hot ones, then restart-class ones by
    predicted step time (those without a prediction last)."""
    changes = [dict(c) for c in changes]
    algorithm = sorted({k for c in changes for k in c} & set(ALGORITHM_KNOBS))
    if algorithm and not allow_algorithm_changes:
        raise ValueError(f"{', '.join(algorithm)} change(s) the algorithm, not only its speed: pass "
                         "allow_algorithm_changes=True to tune them")
    plan = session.plan
    values = plan.knob_values()
    costs = session.segment_costs()
    out, seen = [Candidate({}, None, None, {})], [{}]
    for change in changes:
        change = {k: v for k, v in change.items() if values.get(k) != v}
        if change in seen:
            continue
        seen.append(change)
        preview = session.preview(change)
        prediction = None
        if preview.mode is not None and costs:  # a valid change (a replay may still refuse it): predicted
            target = plan.with_changes(change).knob_values()
            prediction = what_if.predict(what_if.closest_cost(costs, target), target, session.memory_model())
        out.append(Candidate(change, preview.mode, prediction, dict(preview.problems)))

    def order(c: Candidate) -> tuple:
        group = 0 if not c.change else {"hot": 1, "restart": 2}.get(c.mode, 3)  # refused by preview: last
        return (group, c.prediction.step_s if c.prediction else math.inf)

    return sorted(out, key=order)


def _predicted(session: Session, candidate: Candidate, start_values: Mapping[str, Any]) -> Candidate:
    target = {**start_values, **candidate.change}
    basis = what_if.closest_cost(session.segment_costs(), target)
    prediction = what_if.predict(basis, target, session.memory_model()) if basis is not None else None
    return Candidate(candidate.change, candidate.mode, prediction, candidate.problems)


def _param(value: Any) -> Any:
    """An Optuna categorical choice: None, bool, int, float or str (lists and dicts as JSON)."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value, sort_keys=True)


class _Trials:
    """The running session seen from the tuner: applies a candidate and measures the segment it ran in."""

    def __init__(self, session: Session, steps_per_trial: int, timeout_s: float):
        self.session = session
        self.steps_per_trial = steps_per_trial
        self.timeout_s = timeout_s

    def ended(self) -> str | None:
        while True:
            state = self.session.state
            if state in ENDED:
                return f"the session is {state}"
            if state != "paused":
                return None
            time.sleep(POLL_S)  # a paused session: tuning waits with it

    def run(self, change: dict[str, Any]) -> dict[str, Any]:
        """Apply `change` (relative to the plan in force; empty: measure the plan in force) and measure it."""
        self._wait_for(lambda: self._last_segment() > 0)  # a session still starting has no segment yet
        segment = self._last_segment()
        fresh = self._segment_row(segment).get("reason") != "hot apply"
        if change:
            try:
                handle = self.session.apply(change).wait(timeout=self.timeout_s)
            except (PlanError, TimeoutError) as error:  # refused now (e.g. a restart under way) or no answer
                return {"state": "FAIL", "reason": str(error)}
            if handle.state not in ("applied", "resumed"):
                return {"state": "FAIL", "reason": handle.message}
            last, fresh = segment, handle.mode != "hot"
            if self._wait_for(lambda: self._last_segment() > last) is None:
                return {"state": "FAIL", "reason": "no new segment started"}
            segment = self._last_segment()
        needed = self.steps_per_trial + (1 if fresh else 0)
        self._wait_for(lambda: self._steps_of(segment).shape[0] >= needed or self.session.state in ENDED)
        steps = self._steps_of(segment)
        # A restart's first step is start-up work; kept only when the run ended before a later one.
        measured = steps.iloc[1:] if fresh and len(steps) > 1 else steps
        measured = measured.iloc[:self.steps_per_trial]
        if measured.empty:
            return {"state": "FAIL", "reason": f"segment {segment} ran no step", "segment_id": segment}
        return {"state": "COMPLETE", "segment_id": segment, "steps": [int(s) for s in measured["step"]],
                "step_time_s": float(pd.to_numeric(measured["timing_s/step"]).median()),
                "throughput": float(pd.to_numeric(measured.get("perf/throughput", pd.Series(dtype=float))).median()),
                "reason": "" if len(measured) >= self.steps_per_trial else
                f"the run ended after {len(measured)} measured step(s)"}

    def _last_segment(self) -> int:
        newest = self.session.segment()
        return newest["id"] if newest else 0

    def _segment_row(self, segment: int) -> dict[str, Any]:
        return self.session.segment(segment) or {}

    def _steps_of(self, segment: int) -> pd.DataFrame:
        steps = self.session.steps()
        return steps[steps["segment_id"] == segment].sort_values("step") if len(steps) else steps

    def _wait_for(self, condition) -> Any:
        deadline = time.time() + self.timeout_s
        while time.time() < deadline:
            if condition():
                return self._last_segment()
            time.sleep(POLL_S)
        return None


def tune(session: Session, knobs: Mapping[str, Sequence[Any]] | Sequence[str] | None = None, *,
         candidates: Iterable[Mapping[str, Any]] | None = None, steps_per_trial: int = 3, max_trials: int = 8,
         allow_algorithm_changes: bool = False, timeout_s: float = 1800.0, study_name: str | None = None) -> TuneResult:
    """Try plans on the live session (see the module's docstring) and keep the fastest in force."""
    if (knobs is None) == (candidates is None):
        raise ValueError("give either knobs (a grid) or candidates (a list of changes)")
    if steps_per_trial < 1 or max_trials < 1:
        raise ValueError("steps_per_trial and max_trials must be at least 1")
    start_values = session.plan.knob_values()
    changes = grid(knobs, start_values) if knobs is not None else [dict(c) for c in candidates]
    algorithm = sorted({k for c in changes for k in c} & set(ALGORITHM_KNOBS))
    if algorithm and not allow_algorithm_changes:
        raise ValueError(f"{', '.join(algorithm)} change(s) the algorithm, not only its speed: pass "
                         "allow_algorithm_changes=True to tune them")
    if not session.is_operator:
        session.pause()  # raises ReadOnlySession with the usual message
    ordered = plan_candidates(session, changes, allow_algorithm_changes=allow_algorithm_changes)
    names = sorted({k for c in ordered for k in c.change})
    distributions = {n: optuna.distributions.CategoricalDistribution(
        list(dict.fromkeys(_param(v) for v in [start_values[n], *(c.change[n] for c in ordered if n in c.change)])))
        for n in names}

    storage = f"sqlite:///{session.dir / STUDY_FILE}"
    study_name = study_name or f"tune-{time.strftime('%Y%m%d-%H%M%S')}"
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=storage, study_name=study_name, direction="minimize")
    runner = _Trials(session, steps_per_trial, timeout_s)
    rows: list[dict[str, Any]] = []
    ended_because = "every candidate was tried"
    for index, candidate in enumerate(ordered):
        if candidate.change and candidate.prediction is None and candidate.mode is not None:
            candidate = _predicted(session, candidate, start_values)  # the baseline may have measured by now
        full = {n: candidate.change.get(n, start_values[n]) for n in names}
        study.enqueue_trial({n: _param(v) for n, v in full.items()})
        trial = study.ask(distributions)
        row = {"trial": trial.number, "change": candidate.change, "mode": candidate.mode or "baseline",
               "predicted_step_s": candidate.prediction.step_s if candidate.prediction else math.nan,
               "predicted_gpu_peak_share": candidate.prediction.gpu_peak_share if candidate.prediction else math.nan}
        skip = (candidate.prediction.warnings["plan"] if candidate.prediction and not candidate.prediction.fits else
                "; ".join(candidate.problems.values()) if candidate.problems else None)
        trial.set_user_attr("change", json.dumps(candidate.change, sort_keys=True, default=str))
        trial.set_user_attr("mode", candidate.mode or "baseline")
        if not skip and len([r for r in rows if r["state"] != "PRUNED"]) >= max_trials:
            skip = f"max_trials ({max_trials}) reached"
        if skip:
            trial.set_user_attr("reason", skip)
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            rows.append({**row, "state": "PRUNED", "reason": skip})
            continue
        if (why := runner.ended()) is not None:
            trial.set_user_attr("reason", why)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            rows.append({**row, "state": "FAIL", "reason": why})
            ended_because = why
            rows += [{"trial": None, "change": c.change, "mode": c.mode or "baseline", "state": "PRUNED",
                      "reason": f"not tried: {why}"} for c in ordered[index + 1:]]
            break
        in_force = session.plan.knob_values()
        outcome = runner.run({n: v for n, v in full.items() if in_force[n] != v})
        for key in ("segment_id", "throughput", "reason"):
            if outcome.get(key) not in (None, ""):
                trial.set_user_attr(key, outcome[key])
        if outcome["state"] == "COMPLETE":
            study.tell(trial, outcome["step_time_s"])
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        rows.append({**row, **outcome})
    trials = pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))
    done = trials[trials["state"] == "COMPLETE"]
    best = best_s = None
    if len(done):
        winner = done.loc[done["step_time_s"].idxmin()]
        best_s = float(winner["step_time_s"])
        best = {n: winner["change"].get(n, start_values[n]) for n in names}
        if runner.ended() is None:
            in_force = session.plan.knob_values()
            back = {n: v for n, v in best.items() if in_force[n] != v}
            if back:
                try:
                    session.apply(back).wait(timeout=timeout_s)
                except PlanError as error:
                    ended_because += f"; the best plan could not be put back: {error}"
    return TuneResult(study_name, storage, trials, best, best_s, ended_because)
