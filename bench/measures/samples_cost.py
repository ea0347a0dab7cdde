"""samples(window_s, every_s) cost: GPU samples aggregated in SQL per bucket and GPU, as a chart asks for them.

Store: bench/synthetic_store.py (SYNTHETIC load: 8 GPUs × 1 h × 10 Hz = 288 000 sample rows, 2 000 steps). Cases
(window, bucket): (60 s, 0.1 s) raw-ish, (600 s, 1 s) the dashboard's default view, (3 600 s, 10 s) the whole hour.
Goal (ours: a share of the dashboard's 200 ms refresh): ≤ 100 ms for the 600 s / 1 s view.
"""

from __future__ import annotations

from bench.common import Timer, median, result
from bench.measures import Context, standalone

MEASURE = "samples_cost"
WHERE = "cpu"
GOAL = "<= 100 ms"
CASES = ((60, 0.1), (600, 1.0), (3600, 10.0), (3600, 1.0))
MAIN_CASE = (600, 1.0)


def run(ctx: Context) -> dict:
    from workbench.session import Session

    s = Session.attach(ctx.load_store(), read_only=True)
    reps = 3 if ctx.quick else 20
    repetitions, rows = [], {}
    for window, every in CASES:
        for i in range(reps):
            with Timer() as t:
                df = s.samples(window_s=window, every_s=every)
            rows[f"{window}s/{every}s"] = len(df)
            repetitions.append({"case": f"{window}s/{every}s", "value": t.ms, "first": i == 0})
    by_case = {c: median(r["value"] for r in repetitions if r["case"] == c) for c in rows}
    main = f"{MAIN_CASE[0]}s/{MAIN_CASE[1]}s"
    return result(
        MEASURE, value=by_case[main], unit="ms", goal=GOAL, repetitions=repetitions, machine=ctx.machine,
        details={"median_by_case_ms": by_case, "rows_returned": rows, "store": ctx.store_params(), "store_synthetic": True},
        notes=f"value: median samples(window_s={MAIN_CASE[0]}, every_s={MAIN_CASE[1]}) over all GPUs",
        command="python -m bench.run --measure samples_cost",
    )


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
