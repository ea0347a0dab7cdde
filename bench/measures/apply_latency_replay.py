"""apply() latency on a replay: how long apply() takes to return (first call in the process and later ones), and the
step from which a hot change is in force against the step during which it was queued (goal: the next boundary).

Runs the bundled real recording h200-proof as a replay (no GPU; its steps come ~speed× faster than on the H200),
with follow=False so only this script sends commands. The recorded plans it can switch between hot: all four token
budgets 4 096 <-> 32 768 (the recording's segments 1 and 2). On the GPU the same figure comes from
bench/gpu/drive_session.py (hot_apply_latency).
"""

from __future__ import annotations

import time

from bench.common import median, result
from bench.measures import Context, standalone

MEASURE = "apply_latency_replay"
WHERE = "cpu"
GOAL = "<= 500 ms"
RECORDING = "h200-proof"
BUDGETS = ("actor_token_budget", "logprob_token_budget", "ref_token_budget", "critic_token_budget")


def measure_hot_applies(session, n: int, values=(32768, 4096), timeout: float = 120.0) -> list[dict]:
    """n hot applies alternating between `values` for every budget knob; one dict per apply."""
    reps = []
    for i in range(n):
        value = values[i % len(values)]
        queued_after = session.poll().last_step
        t0 = time.time()
        handle = session.apply({k: value for k in BUDGETS})  # returns at once with a handle
        returned_ms = 1000 * (time.time() - t0)
        handle.wait(timeout=timeout)
        if handle.state != "applied":
            raise RuntimeError(f"hot change not applied: {handle!r}")
        reps.append({
            "value": returned_ms, "call": i + 1, "to": value, "queued_after_step": queued_after,
            # Queued while step queued_after+1 runs: the next boundary ends that step, so the change is in force
            # from queued_after+2 (0 boundaries late) at best.
            "in_force_from_step": handle.step, "boundaries_late": handle.step - (queued_after + 2),
            "s_to_applied": round(time.time() - t0, 3),
        })
        session.wait_for_step(handle.step, timeout=timeout)  # one step under the new plan before the next change
    return reps


def run(ctx: Context) -> dict:
    from workbench.session import Session

    # A replay compresses time: at speed 3 a recorded 12.5 s step takes ~4 s, still long against the supervisor's
    # 0.25 s poll, so "boundaries late" means what it would on the GPU. Quick mode (CI) only checks the script runs;
    # at speed 5 its two applies fit in the recorded segment's steps on a loaded machine (at 10 the segment could end
    # first: "not applied: the supervisor is gone").
    speed = 5.0 if ctx.quick else 3.0
    n = 2 if ctx.quick else 6
    # verl's recorded start-up (157 s) plays 10x faster: nothing is measured before step 2, where it waited 30-50 s.
    s = Session.replay(RECORDING, speed=speed, startup_speed=10 * speed, follow=False, root=ctx.work / "sessions")
    try:
        s.wait_for_step(2, timeout=300)
        reps = measure_hot_applies(s, n)
    finally:
        try:
            s.stop(now=True, timeout=60)
        except Exception:
            pass
    later = [r["value"] for r in reps[1:]] or [reps[0]["value"]]
    late = [r["boundaries_late"] for r in reps]
    value = median(later)
    return result(
        MEASURE, value=value, unit="ms", goal=f"{GOAL}; in force from the next step boundary", repetitions=reps,
        machine=ctx.machine, met=value <= 500 and all(x == 0 for x in late),
        details={"first_call_ms": reps[0]["value"], "later_calls_median_ms": value,
                 "boundaries_late": late, "replay_speed": speed, "startup_speed": 10 * speed, "recording": RECORDING},
        notes="value: median apply() return time after the first call; boundaries_late 0 = in force from the step "
              "after the one running when it was queued (the next boundary)",
        command="python -m bench.run --measure apply_latency_replay",
    )


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
