"""The finding after a crash: it names the failure (which segment, out of memory or not, in which phase) and offers
the safer variant of the change that crashed — the part of it the memory model, now calibrated with the crash as
a lower bound, predicts to fit — never the crashed plan itself."""

from __future__ import annotations

from typing import Any

from .core import Finding, Measurements, finding, no_knob, prediction_text
from .record import PHASE_WORDS, Failure
from .safety import screen


def latest_failure(m: Measurements) -> Failure | None:
    """The newest crash after the measured segment began (older ones were answered by the runs since)."""
    if m.record is None:
        return None
    newer = [f for f in m.record.failures if f.segment_id > int(m.segment_id)]
    return newer[-1] if newer else None


def after_crash(m: Measurements) -> Finding | None:
    failure = latest_failure(m)
    if failure is None:
        return None
    crashed = {k: v for k, v in failure.knobs.items() if m.knobs.get(k) != v}
    screened = screen(m, crashed) if failure.oom else None
    change: dict[str, Any] = screened.change if screened is not None else {}
    if not failure.oom:
        expected = no_knob(f"the crash was not out of memory, so no smaller variant is known to avoid it; the plan "
                           f"that crashed ({_listed(crashed)}) is not offered again.")
    elif change:
        expected = (f"The safer variant of the change that crashed: {screened.why} This plan is predicted to fit "
                    f"with the crash taken as a lower bound." + prediction_text(screened.prediction))
    else:
        expected = no_knob(f"{screened.why} The plan that crashed ({_listed(crashed)}) is not offered again.")
    rollback = " Roll back first (session.rollback(); the autopilot does it)." if m.record.plan_in_force_segment \
        is not None and m.record.plan_in_force_segment < failure.segment_id else ""
    return finding(
        m, rule="crash", title=f"The last change {'ran out of memory' if failure.oom else 'crashed'} in "
                               f"{_phase_words(failure)}", severity="high",
        evidence={"failed_segment": failure.segment_id, "oom": failure.oom, "phase": failure.phase,
                  "exit_code": failure.exit_code, "crashed_change": crashed, "traceback_last_line": failure.last_line,
                  "left_out": screened.left_out if screened is not None else crashed},
        text=f"{failure.text.capitalize()} after changing {_listed(crashed)}"
             + (f" ({failure.last_line})" if failure.last_line else ""),
        change=change, expected=expected + rollback,
    )


def _phase_words(failure: Failure) -> str:
    return PHASE_WORDS.get(failure.phase, failure.phase)


def _listed(change: dict[str, Any]) -> str:
    return ", ".join(f"{k} → {v!r}" for k, v in change.items()) or "no knob"
