"""The advisor: names the bottleneck in a segment's measurements and offers the knob change that fixes it —
one a user can follow blindly.

Every rule (workbench/advice/: training, generation, placement, crash) reads the same `Measurements`: one
segment's steps without its warm-up step, the GPU samples inside them, and the session's record (its memory
model, its crashes, the plan in force). Each proposal then passes the safety screen (workbench.advice.safety):
it is offered only where its predicted peak memory, band included, stays under the out-of-memory line and no
crash rules it out; otherwise the part that fits is offered, saying what was left out and why. Proposals are
judged against the plan in force: what is already in force is not proposed again. Thresholds live in
advice.core.THRESHOLDS, each with the reason for its value. Knobs that change the algorithm
(knobs.ALGORITHM_KNOBS) are never proposed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict
from typing import Any, Callable, Mapping

import pandas as pd

from . import memory_fit
from .advice.core import (BUDGET_KNOBS, FINDING_COLUMNS, FUSED_BUDGETS, OFFLOAD_KNOBS, SEVERITIES, THRESHOLDS,
                          Finding, Measurements, gain_evidence, measurements, prediction_text, segment_costs)
from .advice.crash import after_crash
from .advice.generation import async_alternation, gen_on_poll_grid, gpu_idle, rollout_bound, weight_sync
from .advice.placement import pcie_offload, util_spread
from .advice.record import SessionRecord, build_record
from .advice.safety import screen
from .advice.training import (actor_update_bound, checkpointing_headroom, critic_heavy, logprob_loop,
                              memory_headroom, oom_risk)
from .knobs import MICRO_BATCH_KNOBS

__all__ = ["BUDGET_KNOBS", "FINDING_COLUMNS", "FUSED_BUDGETS", "MICRO_BATCH_KNOBS", "OFFLOAD_KNOBS", "RULES",
           "THRESHOLDS", "Finding", "Measurements", "SessionRecord", "advice_for", "advise", "findings_frame", "measurements", "record_of", "segment_costs"]

RULES: tuple[Callable[[Measurements], Finding | None], ...] = (
    after_crash, oom_risk, logprob_loop, rollout_bound, actor_update_bound, critic_heavy, gpu_idle, util_spread,
    pcie_offload, memory_headroom, checkpointing_headroom, async_alternation, weight_sync, gen_on_poll_grid,
)


def _safe(m: Measurements, f: Finding) -> Finding:
    """The finding with a change that passed the safety screen."""
    if not f.change or f.rule == "crash":  # the crash rule screened its own
        return f
    screened = screen(m, f.change)
    if screened.whole:
        return f
    evidence = {**f.evidence, "proposed": f.change, "left_out": screened.left_out}
    expected = f.expected if screened.change else ""
    note = screened.why + (f" Predicted for the part offered: {screened.prediction.text}." if screened.change
                           and screened.prediction is not None else "")
    return dataclasses.replace(f, change=screened.change, evidence=evidence, expected=(f"{note} {expected}").strip())


def _measured_already(m: Measurements, f: Finding) -> Finding:
    """A change to a plan this session measured in another segment, not faster than this one, is not offered again:
    the measurement outranks the prediction (the autopilot rolled it back, or a user tried it)."""
    if m.record is None or not f.change:
        return f
    seen = m.record.measured({**m.knobs, **f.change})
    here = float(m.seconds("step").mean())
    if seen is None or seen.segment_id == m.segment_id or not seen.step_s >= here:
        return f
    return dataclasses.replace(
        f, change={}, evidence={**f.evidence, "proposed": f.change,
                                "measured_plan": {"segment_id": seen.segment_id, "step_s": seen.step_s}},
        expected=f"Not offered again: segment {seen.segment_id} ran this plan at {seen.step_s:.1f} s a step against "
                 f"{here:.1f} s here (a measurement outranks the prediction). {f.expected}")


def _with_prediction(m: Measurements, f: Finding) -> Finding:
    """An offered change with the what-if model's prediction for it as offered: step, band, gain and sources in the
    evidence, and in the expected gain's words where they are not yet."""
    prediction = m.predicted(f.change) if f.change else None
    if prediction is None:
        return f
    expected = f.expected if "Predicted" in f.expected else f.expected + prediction_text(prediction)
    return dataclasses.replace(f, evidence={**f.evidence, **gain_evidence(prediction)}, expected=expected)


def _in_force(m: Measurements, f: Finding) -> Finding:
    """Judged against the plan in force: knobs already at the proposed value are not proposed again."""
    if m.record is None or not f.change:
        return f
    force = m.record.plan_in_force
    change = {k: v for k, v in f.change.items() if force.get(k) != v}
    if change == f.change:
        return f
    segment = m.record.plan_in_force_segment
    if not change:
        return dataclasses.replace(f, change={}, expected=(
            f"Already in force (segment {segment}, not yet measured here): {f.expected}"))
    return dataclasses.replace(f, change=change)


def advise(steps: pd.DataFrame, samples: pd.DataFrame, knobs: Mapping[str, Any], *, segment_id: Any = None,
           procs: pd.DataFrame | None = None, record: SessionRecord | None = None) -> list[Finding]:
    """Every rule's finding for one segment (the newest if None), each screened for safety, most severe first
    (the crash finding leads); a change offered by a higher finding is not offered again below it."""
    m = measurements(steps, samples, knobs, segment_id=segment_id, procs=procs, record=record)
    if m is None:
        return []
    # Screened, ruled out where measured, predicted as offered: all against the measured segment's plan; then
    # rebased on the plan in force.
    findings = [_in_force(m, _with_prediction(m, _measured_already(m, _safe(m, f)))) for rule in RULES
                if (f := rule(m)) is not None]
    findings.sort(key=lambda f: (f.rule != "crash", SEVERITIES.index(f.severity)))
    seen: list[dict[str, Any]] = []
    out = []
    for f in findings:
        if f.change and f.change in seen:
            f = dataclasses.replace(f, change={}, expected=f"The same change as a finding above. {f.expected}")
        seen.append(f.change)
        out.append(f)
    return out


def findings_frame(findings: list[Finding]) -> pd.DataFrame:
    """One row per finding, columns in Finding's field order."""
    return pd.DataFrame([asdict(f) for f in findings], columns=list(FINDING_COLUMNS))


# ------------------------------------------------------------------------------------------------ on a session
# `session` below is a workbench.session.Session, read through its public API only.
def record_of(session: Any, steps: pd.DataFrame | None = None, samples: pd.DataFrame | None = None
              ) -> SessionRecord:
    """The advisor's record of a session: memory model, failures, plan in force (steps and samples: as read
    already, else read here)."""
    segments = session.segments()
    return build_record(
        meta=session.meta, segments=segments[["id", "status", "reason"]],
        knobs_of=lambda segment: session.knob_values(segment),
        steps=session.steps() if steps is None else steps, samples=session.samples() if samples is None else samples,
        events=session.events(), initial_knobs=session.knob_values(),
    )


def advice_for(session: Any, segment_id: int | None = None) -> list[Finding]:
    """The findings for a session's segment (default: the newest that measured the plan in force, else the newest
    that measured enough steps and did not fail), judged against the plan in force and screened with everything the
    session's history knows."""
    steps = session.steps()
    if steps.empty:
        return []
    samples = session.samples()
    record = record_of(session, steps, samples)
    if segment_id is None:
        # The newest measurement of the plan in force (after a roll-back: the segment before the rolled-back one),
        # else the newest segment that measured enough steps and did not fail.
        failed = {f.segment_id for f in record.failures}
        counts = steps.groupby("segment_id").size()
        usable = [int(s) for s, n in counts.items() if s not in failed and n > THRESHOLDS["min_steps"].value]
        in_force = record.measured(record.plan_in_force)
        segment_id = in_force.segment_id if in_force is not None else max(usable) if usable else \
            int(steps["segment_id"].max())
    return advise(steps, samples, session.knob_values(segment_id), segment_id=segment_id, procs=session.procs(),
                  record=record)


def memory_model_of(session: Any) -> memory_fit.MemoryModel:
    return record_of(session).memory_model
