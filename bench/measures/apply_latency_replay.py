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


def apply_now(session, changes: dict):
    """apply() as API.md has it (returns at once, wait=False), or the older one that waits for the supervisor."""
    try:
        return session.apply(changes, wait=False)
    except TypeError:
        return session.apply(changes)


def applied_event_after(session, t0: float, timeout: float) -> dict:
    """The first `applied` event recorded after t0 (its data says from which step the change is in force)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ev = session.events()
        ev = ev[(ev["kind"] == "applied") & (ev["t"] >= t0)]
        if len(ev):
            row = ev.iloc[0]
            return {"t": float(row["t"]), "data": row["data"], "text": row["text"]}
        if session.state in ("failed", "lost", "stopped", "finished"):
            raise RuntimeError(f"session {session.id} is {session.state} before the change took effect")
        time.sleep(0.05)
    raise TimeoutError(f"no applied event within {timeout:.0f} s")


def measure_hot_applies(session, n: int, values=(32768, 4096), timeout: float = 120.0) -> list[dict]:
    """n hot applies alternating between `values` for every budget knob; one dict per apply."""
    reps = []
    for i in range(n):
        value = values[i % len(values)]
        queued_after = session.store.last_step()
        t0 = time.time()
        handle = apply_now(session, {k: value for k in BUDGETS})
        returned_ms = 1000 * (time.time() - t0)
        ev = applied_event_after(session, t0, timeout)
        from_step = int(ev["data"]["from_step"])
        reps.append({
            "value": returned_ms, "call": i + 1, "to": value, "queued_after_step": queued_after,
            "in_force_from_step": from_step, "boundaries_late": from_step - (queued_after + 1),
            "s_to_applied_event": round(ev["t"] - t0, 3), "handle": str(handle),
        })
        session.wait_for_step(from_step, timeout=timeout)  # one step under the new plan before the next change
    return reps


def run(ctx: Context) -> dict:
    from workbench.session import Session

    # Slow enough that the recorded segment's steps (1-9) don't run out between applies: 1.2 s a step.
    speed = 10.0
    n = 2 if ctx.quick else 6
    s = Session.replay(RECORDING, speed=speed, follow=False, root=ctx.work / "sessions")
    try:
        s.wait_for_step(2, timeout=180)
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
                 "boundaries_late": late, "replay_speed": speed, "recording": RECORDING},
        notes="value: median apply() return time after the first call; boundaries_late 0 = in force from the step "
              "after the one during which it was queued",
        command="python -m bench.run --measure apply_latency_replay",
    )


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
