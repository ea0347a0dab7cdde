"""poll() cost: one viewer's cheap "what changed?" query against a long session's store.

Store: bench/synthetic_store.py (SYNTHETIC load: 8 GPUs × 1 h × 10 Hz samples, 2 000 steps). Cases: the first poll
(no cursor), polls with nothing new, and polls after a producer appended what 0.5 s of a live session writes (40
sample rows; a step every 24th poll, i.e. every 12 s). Goal (ours: 2 Hz × many viewers must cost ~nothing): ≤ 5 ms.
"""

from __future__ import annotations

import time

from bench.common import Timer, median, result
from bench.measures import Context, standalone
from bench.synthetic_store import NODE

MEASURE = "poll_cost"
WHERE = "cpu"
GOAL = "<= 5 ms"


def append_live_tick(writer, gpus: int, tick: int, segment_id: int, step_metrics: dict) -> None:
    """What a live session writes in 0.5 s: 5 samples per GPU (the store's GPUs, on its node); a step every 24
    ticks."""
    now = time.time()
    writer.add_samples([{"t": now + k / 10, "node": NODE, "gpu": g, "util": 50.0, "mem_used": 1.0, "mem_total": 2.0}
                        for k in range(5) for g in range(gpus)])
    if tick % 24 == 0:
        last = writer.last_step() or 0
        writer.add_step(segment_id, last + 1, step_metrics)


def run(ctx: Context) -> dict:
    from workbench.session import Session
    from workbench.store import Store

    path = ctx.load_store()
    gpus = ctx.store_params()["gpus"]
    reps = 20 if ctx.quick else 200
    s = Session.attach(path, read_only=True)
    writer = Store(path)
    segment_id = writer.last_segment()["id"]
    step_metrics = writer.rows("steps", since_id=writer.max_id("steps") - 1)[0]["metrics"]
    repetitions = []
    with Timer() as t:
        first = s.poll()
    repetitions.append({"case": "first (no cursor)", "value": t.ms})
    cursor = first.cursor
    for _ in range(reps):
        with Timer() as t:
            p = s.poll(cursor)
        assert not p.changed, f"nothing was written, yet poll says {p.changed}"
        cursor = p.cursor
        repetitions.append({"case": "unchanged", "value": t.ms})
    for i in range(reps):
        append_live_tick(writer, gpus, i, segment_id, step_metrics)
        with Timer() as t:
            p = s.poll(cursor)
        assert "samples" in p.changed
        cursor = p.cursor
        repetitions.append({"case": "after 0.5 s of writes", "value": t.ms})
    writer.close()
    by_case = {c: median(r["value"] for r in repetitions if r["case"] == c) for c in dict.fromkeys(r["case"] for r in repetitions)}
    return result(
        MEASURE, value=by_case["unchanged"], unit="ms", goal=GOAL, repetitions=repetitions, machine=ctx.machine,
        details={"median_by_case_ms": by_case, "store": ctx.store_params(), "store_synthetic": True},
        notes="value: median poll(cursor) with nothing new; read-only attach, as a viewer would",
        command="python -m bench.run --measure poll_cost",
    )


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
