"""Autopilot: follow the advisor round by round until the run is fast — a client of the public Session API only.

    result = session.autopilot(max_rounds=6, budget_s=1800)
    result.story           # DataFrame: one row per round — change, predicted, measured, kept or rolled back, why
    result.speedup         # tokens/s/GPU of the plan in force at the end ÷ at the start

Each round applies the top finding whose change is safe (the advisor screened it: its predicted peak memory, band
included, stays under the out-of-memory line, and no crash rules it out), hot or restart-class alike, and measures
`steps_per_round` steps after the new segment's warm-up step. A change that made the step faster is kept; one that
was slower is rolled back (its knobs put back, hot or restart-class as they came); one that crashed is rolled back
with `session.rollback()` — the crash stays in the session's record, so the advisor never offers that plan again.
The next round starts from the plan then in force, advised on its own measured segment; a plan tried in this run
is not tried again, nor a part of a change that was measured slower (a restart-class one costs a relaunch each way).

It stops when no applicable finding is left, at the round or time budget, when `stop` is set (or the session
stops), or when a change came out slower than predicted by more than its band and the measurement's own noise (the
model is off for this run: following it further is guesswork). The band already carries the basis segment's spread
(workbench.predict); what it cannot carry is the noise of the few steps a round measures, so a round's mean counts
as past its band only when it exceeds the band's top by more than that mean's standard error (`step_noise_s`;
under colocate_async, whose steps alternate long and short, that of whole pairs). A paused session pauses it.
Every round is a segment of the session; the story says what each one did and why.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd

from .knobs import ALGORITHM_KNOBS

# `session` below is a workbench.session.Session (not imported: Session.autopilot imports this module).
Session = Any

STORY_COLUMNS = ("round", "rule", "change", "mode", "segment_id", "predicted_step_s", "predicted_high_s",
                 "baseline_step_s", "measured_step_s", "step_noise_s", "throughput", "outcome", "why")
ENDED = ("stopped", "finished", "failed", "lost")
POLL_S = 0.2
# The relative standard error of a 2-step mean on real H200 runs: |a - b| / (a + b) over the 42 pairs of consecutive
# sync steps after the warm-up step in the five recordings of workbench/assets/recordings/ (h200-proof,
# h200-lora-critic-sync, h200-tuning, h200-hot-lever, h200-autopilot-1.5b) and
# bench/results/h200_2026-12-02/campaign_per_step_0.5b.csv: median 2.75 % (quartiles 1.4–6.5 %, mean 3.9 %). Two
# steps that happen to agree (14.41 and 14.56 s on 2026-12-02) say less about the noise than that record does.
STEP_NOISE_FLOOR = 0.0275


def step_noise_s(step_s, alternating: bool = False) -> float:
    """The standard error of the mean of `step_s` (seconds), at least the recorded H200 floor for that many steps
    (STEP_NOISE_FLOOR for two, shrinking as 1/sqrt(n)). `alternating` (colocate_async): a long and a short step are
    one sample, their difference the plan's pattern, not noise (8.42 / 18.64 s on the H200, 2026-12-02, would
    otherwise read as ±5.1 s and hide any model error): the spread is that of the means of whole pairs."""
    steps = pd.Series(step_s, dtype=float).dropna()
    n, mean = len(steps), float(steps.mean())
    floor = STEP_NOISE_FLOOR * mean * math.sqrt(2 / n)
    samples = pd.Series(steps.to_numpy()[:n - n % 2].reshape(-1, 2).mean(axis=1)) if alternating else steps
    return max(floor, float(samples.std(ddof=1)) / math.sqrt(len(samples))) if len(samples) > 1 else floor


@dataclass(frozen=True)
class Measured:
    segment_id: int
    steps: tuple[int, ...]
    step_s: float  # mean of the measured steps (colocate_async alternates long and short ones)
    throughput: float  # tokens/s/GPU, mean of the same steps
    noise_s: float = math.nan  # the mean's standard error (step_noise_s)


@dataclass
class AutopilotResult:
    story: pd.DataFrame
    ended_because: str
    before: Measured | None
    after: Measured | None
    crashes: int
    wall_s: float

    @property
    def rounds(self) -> int:
        return len(self.story)

    @property
    def speedup(self) -> float:
        """tokens/s/GPU of the plan in force at the end over the one at the start (NaN before any measurement)."""
        if self.before is None or self.after is None or not self.before.throughput > 0:
            return math.nan
        return self.after.throughput / self.before.throughput


class _Stopped(Exception):
    """The autopilot must end now (its reason is the message); `in_force`: the measurement of the plan the last
    round left in force, where that round ended the run."""

    def __init__(self, reason: str, in_force: Measured | None = None):
        super().__init__(reason)
        self.in_force = in_force


@dataclass
class _Round:
    number: int
    rule: str = ""
    change: dict[str, Any] = field(default_factory=dict)
    mode: str | None = None
    segment_id: int | None = None
    predicted_step_s: float = math.nan
    predicted_high_s: float = math.nan
    baseline_step_s: float = math.nan
    measured_step_s: float = math.nan
    step_noise_s: float = math.nan
    throughput: float = math.nan
    outcome: str = ""
    why: str = ""

    def row(self) -> dict[str, Any]:
        return {name: getattr(self, name) if name != "round" else self.number for name in STORY_COLUMNS}


class Autopilot:
    def __init__(self, session: Session, *, steps_per_round: int = 2, max_rounds: int = 8, budget_s: float = 3600.0,
                 timeout_s: float = 900.0, stop: threading.Event | None = None,
                 on_round: Callable[[pd.DataFrame], None] | None = None):
        if steps_per_round < 2 or max_rounds < 1 or not budget_s > 0:
            raise ValueError("steps_per_round must be at least 2, max_rounds at least 1 and budget_s positive")
        self.session, self.steps_per_round, self.max_rounds = session, steps_per_round, max_rounds
        self.budget_s, self.timeout_s = budget_s, timeout_s
        self.stop = stop or threading.Event()
        self.on_round = on_round
        self.t0 = time.time()
        self.rows: list[dict[str, Any]] = []
        self.tried: list[dict[str, Any]] = []  # plans (knob values) tried, whatever came of it: never again
        self.slower: dict[int, dict[str, Any]] = {}  # by round: changes measured not faster, rolled back
        self.crashes = 0

    # ----------------------------------------------------------------- waiting on the session
    def _left(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def _wait(self, condition: Callable[[], Any], what: str) -> Any:
        """Wait for `condition` to return something truthy, honouring pause, stop, the session's end and the
        time budget."""
        deadline = time.time() + min(self.timeout_s, max(1.0, self._left()))
        while True:
            if self.stop.is_set():
                raise _Stopped("stopped by the operator")
            value = condition()
            if value:
                return value
            state = self.session.state
            if state in ENDED and state != "failed":
                raise _Stopped(f"the session is {state}")
            if state == "paused":
                deadline += POLL_S  # a paused session holds the autopilot, not its deadline
            elif time.time() > deadline:
                raise _Stopped(f"the time budget ran out while waiting for {what}" if self._left() <= 0 else
                               f"no {what} within {self.timeout_s:.0f} s")
            time.sleep(POLL_S)

    def _newest_segment(self) -> int:
        segments = self.session.segments()
        return int(segments["id"].max()) if len(segments) else 0

    def _measured(self, segment_id: int, alternating: bool = False) -> Measured | None:
        """The segment's steps after its warm-up step, once there are `steps_per_round` of them (`alternating`: a
        colocate_async plan, its noise read from whole long/short pairs)."""
        steps = self.session.steps()
        steps = steps[steps["segment_id"] == segment_id].sort_values("step") if len(steps) else steps
        measured = steps.iloc[1:1 + self.steps_per_round]
        if len(measured) < self.steps_per_round:
            return None
        throughput = pd.to_numeric(measured.get("perf/throughput", pd.Series(dtype=float)), errors="coerce")
        step_s = pd.to_numeric(measured["timing_s/step"])
        return Measured(segment_id, tuple(int(s) for s in measured["step"]), float(step_s.mean()),
                        float(throughput.mean()), step_noise_s(step_s, alternating))

    def _measure_newest(self, after_segment: int, what: str, alternating: bool) -> Measured | None:
        """Wait for a segment newer than `after_segment` and its measured steps; None if the run crashed first."""
        def ready():
            if self.session.state == "failed":
                return "crashed"
            newest = self._newest_segment()
            return (newest > after_segment and self._measured(newest, alternating)) or None
        outcome = self._wait(ready, what)
        return None if outcome == "crashed" else outcome

    # ----------------------------------------------------------------- one round
    def _pick(self, baseline: Measured) -> tuple[Any, str]:
        """The top finding with a change to try, and why the others above it were passed over."""
        passed = []
        in_force = self.session.plan.knob_values()
        for finding in self.session.advice_findings(baseline.segment_id):
            if not finding.change:
                continue
            target = {**in_force, **finding.change}
            if set(finding.change) & set(ALGORITHM_KNOBS):
                passed.append(f"{finding.rule}: changes the algorithm")
            elif target in self.tried:
                passed.append(f"{finding.rule}: tried in this run")
            elif (number := self._part_of_slower(finding.change)) is not None:
                # On the GPU a restart-class change and its roll-back cost a relaunch each: a part of a change
                # measured slower (colocate_async alone after colocate_async with batched tokens) is not re-run.
                passed.append(f"{finding.rule}: part of round {number}'s change, measured slower")
            elif not (preview := self.session.preview(finding.change)).ok:
                passed.append(f"{finding.rule}: {'; '.join(preview.problems.values()) or preview}")
            else:
                return finding, "; ".join(passed)
        return None, "; ".join(passed)

    def _part_of_slower(self, change: Mapping[str, Any]) -> int | None:
        """The round whose slower change holds `change` (every knob at the same value), if any."""
        return next((number for number, slower in self.slower.items()
                     if all(k in slower and slower[k] == v for k, v in change.items())), None)

    def _apply(self, change: Mapping[str, Any]) -> tuple[bool, str, str | None]:
        """Apply and wait until it is in force: (in force, message, mode)."""
        handle = self.session.apply(dict(change))
        self._wait(lambda: handle.refresh().done, "the supervisor's answer")
        return handle.state in ("applied", "resumed"), handle.message or handle.state, handle.mode

    def _round(self, r: _Round, baseline: Measured) -> Measured:
        """Try the top safe finding; returns the measurement the next round compares against."""
        finding, passed = self._pick(baseline)
        if finding is None:
            raise _Stopped("nothing applicable is left" + (f" ({passed})" if passed else ""))
        in_force = self.session.plan.knob_values()
        r.rule, r.change, r.baseline_step_s = finding.rule, dict(finding.change), baseline.step_s
        prediction = self.session.predict(finding.change)
        if prediction is not None:
            r.predicted_step_s, r.predicted_high_s = prediction.step_s, prediction.step_range_s[1]
        before = self._newest_segment()
        applied, message, r.mode = self._apply(finding.change)
        self.tried.append({**in_force, **finding.change})  # whatever happens next, this plan is not tried again
        crashed = self.session.state == "failed"  # a restart may die before its first step
        if not applied and not crashed:
            r.outcome, r.why = "refused", message
            return baseline
        alternating = {**in_force, **finding.change}.get("trainer_mode") == "colocate_async"
        result = None if crashed else self._measure_newest(before, "the change's measured steps", alternating)
        r.segment_id = self._newest_segment()
        if result is None:
            return self._roll_back_crash(r, baseline)
        r.measured_step_s, r.step_noise_s, r.throughput = result.step_s, result.noise_s, result.throughput
        slower_than_band = r.measured_step_s > r.predicted_high_s + r.step_noise_s
        against_band = (f"{result.step_s:.1f} s against at most {r.predicted_high_s:.1f} s + "
                        f"{r.step_noise_s:.1f} s of step noise")
        if result.step_s < baseline.step_s:
            r.outcome = "kept"
            r.why = f"{result.step_s:.1f} s a step against {baseline.step_s:.1f} s"
            kept = result
        else:
            back = {k: in_force[k] for k in finding.change}
            self.slower[r.number] = dict(finding.change)
            applied, message, _ = self._apply(back)
            r.outcome = "rolled back" if applied else "not rolled back"
            r.why = f"{result.step_s:.1f} s a step, not faster than {baseline.step_s:.1f} s" + (
                "" if applied else f"; putting it back failed: {message}")
            if not applied:
                raise _Stopped(f"round {r.number}'s change could not be rolled back: {message}")
            kept = baseline
        if not math.isnan(r.predicted_high_s):
            r.why += f"; predicted {r.predicted_step_s:.1f} s: {against_band}"
        if slower_than_band:
            # The stop ends the run, not the round: what it kept is in force and is the run's "after".
            raise _Stopped(f"round {r.number} measured {result.step_s:.1f} s a step, slower than predicted "
                           f"({r.predicted_step_s:.1f} s; {against_band}): the model is off for this run",
                           in_force=kept)
        return kept

    def _roll_back_crash(self, r: _Round, baseline: Measured) -> Measured:
        """The round's change crashed the run: relaunch the last good plan; the crash stays in the session's
        record (the advisor never offers that plan again)."""
        self.crashes += 1
        failure = (self.session.failure or "the run crashed").split(": roll back")[0]  # its advice is taken here
        try:
            self.session.rollback()
        except RuntimeError as error:
            raise _Stopped(f"round {r.number} crashed ({failure}) and could not be rolled back: {error}")
        r.outcome, r.why = "crashed, rolled back", f"{failure}; the last good plan was relaunched"
        self._wait(lambda: self.session.state in ("running", "paused"), "the rolled-back run")
        return baseline

    # ----------------------------------------------------------------- the run
    def run(self) -> AutopilotResult:
        before = after = None
        ended = ""
        try:
            before = after = self._wait(lambda: self._measured(self._newest_segment()), "the first measured steps")
            for number in range(1, self.max_rounds + 1):
                if self._left() <= 0:
                    raise _Stopped("the time budget is spent")
                if self.stop.is_set():
                    raise _Stopped("stopped by the operator")
                r = _Round(number)
                try:
                    after = self._round(r, after)
                finally:
                    if r.rule:
                        self.rows.append(r.row())
                        if self.on_round is not None:
                            self.on_round(self.story())
            ended = f"the round budget ({self.max_rounds}) is spent"
        except _Stopped as stopped:
            ended = str(stopped)
            after = stopped.in_force or after
        return AutopilotResult(self.story(), ended, before, after, self.crashes, time.time() - self.t0)

    def story(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(STORY_COLUMNS))


def autopilot(session: Session, **options: Any) -> AutopilotResult:
    """Run the autopilot on an operator's session (see the module's docstring); a read-only handle is refused."""
    if not session.is_operator:
        session.pause()  # raises ReadOnlySession with the usual message
    return Autopilot(session, **options).run()
