"""Safe proposals: a change is offered only where its predicted peak memory, upper band included, stays under the
out-of-memory line, and never when it repeats a crashed plan or needs more memory than a crashed plan did in the
role that crashed. When the whole change doesn't fit, the part that does is offered — fused kernels with
gradient checkpointing kept, smaller token budgets for the pass that peaks, optimizer state offloaded, a lever
left out — the fastest such variant by the what-if model, with what was left out and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .. import predict as what_if
from .core import BUDGET_KNOBS, Measurements
from .record import Failure, SessionRecord

# The levers a change may be split into when it doesn't fit whole, each a set of knobs that go together.
PARTS = (
    ("gradient checkpointing off", ("gradient_checkpointing",)),
    ("dynamic batching", ("use_dynamic_bsz", *BUDGET_KNOBS)),
    ("rollout memory", ("rollout_gpu_memory", "rollout_max_batched_tokens", "rollout_max_num_seqs")),
    ("the trainer mode", ("trainer_mode",)),
    ("fused kernels", ("fused_kernels", "fused_kernel_backend")),
)
PASS_BUDGET = {"update_actor": "actor_token_budget", "old_log_prob": "logprob_token_budget",
               "ref": "ref_token_budget", "update_critic": "critic_token_budget", "values": "critic_token_budget"}
OPTIMIZER_OFFLOAD = {"actor": "actor_optimizer_offload", "critic": "critic_optimizer_offload"}
MAX_HALVINGS = 4


@dataclass(frozen=True)
class Screened:
    """A change as it may be proposed: the whole of it, a part, or nothing (change {})."""

    change: dict[str, Any]
    prediction: what_if.Prediction | None
    left_out: dict[str, Any] = field(default_factory=dict)  # the values the whole change meant, where not offered
    why: str = ""  # what was left out and why ("" when the whole change is offered)

    @property
    def whole(self) -> bool:
        return not self.why


def same_plan(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return all(a.get(k) == v for k, v in b.items()) and all(b.get(k) == v for k, v in a.items())


def blocking_failure(record: SessionRecord | None, target: Mapping[str, Any],
                     basis: Mapping[str, Any] | None = None) -> Failure | None:
    """The crash that rules a plan out: the same plan crashed, or it ran out of memory in a role where this plan
    needs at least as much (both predicted by the session's memory model, the crash being a lower bound)."""
    if record is None:
        return None
    for failure in record.failures:
        if same_plan(failure.knobs, target):
            return failure
        if not failure.oom:
            continue
        crashed = record.predict_memory(failure.knobs, basis)
        candidate = record.predict_memory(target, basis)
        phase = failure.phase or crashed.peak_phase
        if phase == "gen":
            if candidate.gen_peak_gib >= crashed.gen_peak_gib - 1e-6:
                return failure
        elif candidate.phase_gib(phase) >= crashed.phase_gib(phase) - 1e-6:
            return failure
    return None


def _halved(m: Measurements, change: dict[str, Any], budget: str) -> dict[str, Any] | None:
    target = {**m.knobs, **change}
    now = int(target[budget])
    smaller = max(m.longest_sequence, now // 2 // 1024 * 1024)
    return {**change, budget: smaller} if smaller < now else None


def _variants(m: Measurements, change: dict[str, Any]) -> list[tuple[dict[str, Any], list[str]]]:
    """Changes to try instead of `change`, each with what it gives up, nearest first."""
    out: list[tuple[dict[str, Any], list[str]]] = [(change, [])]
    if change.get("gradient_checkpointing") is False and m.knobs.get("gradient_checkpointing"):
        out.append(({k: v for k, v in change.items() if k != "gradient_checkpointing"},
                    ["gradient checkpointing stays on"]))
    for base, said in list(out):
        target = {**m.knobs, **base}
        if target["use_dynamic_bsz"]:
            current, told = dict(base), list(said)
            for _ in range(MAX_HALVINGS * len(PASS_BUDGET)):
                prediction = m.predicted(current)
                if prediction is None or prediction.memory is None or prediction.memory.peak_phase == "gen":
                    break
                budget = PASS_BUDGET[prediction.memory.peak_phase]
                smaller = _halved(m, current, budget)
                if smaller is None:
                    break
                current = smaller
                told = [t for t in told if not t.startswith(budget)] + [
                    f"{budget} {int({**m.knobs, **change}.get(budget, 0))} → {current[budget]}"]
                out.append((dict(current), list(told)))
        for role, knob in OPTIMIZER_OFFLOAD.items():
            if not target.get(knob):
                out.append(({**base, knob: True}, [*said, f"{role} optimizer state kept on the CPU between updates"]))
    for name, knobs in PARTS:
        if any(k in change for k in knobs) and len(set(change) - set(knobs)) > 0:
            out.append(({k: v for k, v in change.items() if k not in knobs}, [f"{name} left out"]))
    return out


def _reason(m: Measurements, change: dict[str, Any], prediction: what_if.Prediction | None,
            failure: Failure | None) -> str:
    if failure is not None:
        same = same_plan(failure.knobs, {**m.knobs, **change})
        return f"{failure.text} with {'this plan' if same else 'less memory there than this plan needs'}"
    mem = prediction.memory
    where = "generation" if mem.peak_phase == "gen" else mem.peak_phase
    return (f"the whole change is predicted to peak at {mem.gpu_peak_gib:.0f} ± {mem.band_gib:.0f} GiB in {where}, "
            f"over the out-of-memory line at {mem.oom_line_gib:.0f} GiB")


def screen(m: Measurements, change: Mapping[str, Any]) -> Screened:
    """The fastest safe variant of `change` for the measured segment `m` (the change itself when it is safe)."""
    change = dict(change)
    if not change:
        return Screened({}, None)
    whole_prediction = m.predicted(change)
    whole_failure = blocking_failure(m.record, {**m.knobs, **change}, m.knobs)
    safe: list[tuple[float, int, dict[str, Any], list[str], what_if.Prediction | None]] = []
    # A crash that was not out of memory is avoided by no memory saving: only leaving a lever out may.
    levers_only = whole_failure is not None and not whole_failure.oom
    for order, (variant, said) in enumerate(_variants(m, change)):
        if not variant or (levers_only and not (said and all(s.endswith(" left out") for s in said))):
            continue
        prediction = m.predicted(variant)
        if prediction is not None and not prediction.fits:
            continue
        if blocking_failure(m.record, {**m.knobs, **variant}, m.knobs) is not None:
            continue
        if order == 0:
            return Screened(change, prediction)
        safe.append((prediction.step_s if prediction else float("inf"), order, variant, said, prediction))
    reason = _reason(m, change, whole_prediction, whole_failure)
    if not safe:
        return Screened({}, whole_prediction, change, f"No part of the change is safe: {reason}.")
    _, _, variant, said, prediction = min(safe, key=lambda s: (s[0], s[1]))
    proposed, offered = {**m.knobs, **change}, {**m.knobs, **variant}
    left_out = {k: proposed[k] for k in {*change, *variant} if offered[k] != proposed[k]}
    return Screened(variant, prediction, left_out, f"Offered in part ({'; '.join(said)}): {reason}.")
