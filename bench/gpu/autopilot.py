"""The autopilot on a GPU (issue 16): a session on verl's quickstart-style settings, then only `Session.autopilot`,
under a wall budget; writes `autopilot_<workload>.json` (bench/common.py format) with tokens/s/GPU after ÷ before,
`details.crashes`, the rounds, the wall time, the story table, and the memory model's predicted vs measured peaks
for every segment of the session.

Two ways in:
- the campaign driver (bench/gpu/campaign.py) starts the session itself and calls
  `run(session, max_rounds=N, deadline=epoch_s, log=fn(str), save=fn(measure, **result_fields), workload="1.5b")`
  (more than once on one session: the JSON covers every call's rounds);
- standalone: `python3 bench/gpu/autopilot.py OUT --workload 1.5b --budget-s 1500` generates the workload's assets,
  starts the session (`start`), waits for the quickstart's measured steps and runs the autopilot;
  `--replay RECORDING` does the same against a replay on the CPU (a dry run: it measures nothing).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

GOAL_SPEEDUP = ">= 5"


@dataclass(frozen=True)
class Workload:
    name: str
    shape: str  # workbench.assets.generate SHAPES
    prompts: int
    prompt_length: int
    response_length: int
    n_train: int = 2048


WORKLOADS = {
    "1.5b": Workload("1.5b", "qwen2.5-1.5b", 128, 512, 1024),
    "0.5b": Workload("0.5b", "qwen2.5-0.5b", 128, 256, 768),
}


def quickstart_knobs(w: Workload) -> dict[str, Any]:
    """verl's quickstart-style settings for the workload: micro batches 4/8/4/4, no dynamic batching, rollout
    memory 0.4 (issue 16's starting point)."""
    return dict(gpus=[0], train_batch_size=w.prompts, ppo_mini_batch_size=max(1, w.prompts // 4),
                max_prompt_length=w.prompt_length, max_response_length=w.response_length, actor_micro_batch=4,
                logprob_micro_batch=8, ref_micro_batch=4, critic_micro_batch=4, use_dynamic_bsz=False,
                rollout_gpu_memory=0.4, rollout_tp=1, rollout_enforce_eager=False)


def start(w: Workload, assets: Path, log: Callable[[str], None] = print):
    """Generate the workload's assets (once) and start a live session on its quickstart plan."""
    from workbench.assets.generate import SHAPES, generate_assets_apart
    from workbench.assets.plans import offline_overrides
    from workbench.plan import Plan
    from workbench.session import Session

    if w.shape not in SHAPES:
        raise SystemExit(f"the asset generator has no shape {w.shape!r} (it has {', '.join(SHAPES)})")
    folder = assets / w.name
    # in a process of its own: the generation's CUDA memory must not stay in this one while the session runs
    info = generate_assets_apart(folder, shape=w.shape, n_train=w.n_train, n_test=64, device="cuda")
    log(f"assets {w.name}: {info.get('params')} parameters, reused={info.get('reused')}")
    plan = Plan.from_verl(overrides=offline_overrides(folder)).with_changes(quickstart_knobs(w))
    plan.validate(gpu_count=1)
    return Session.start(plan, name=f"autopilot-{w.name}")


# ------------------------------------------------------------------------------------------------ figures
def first_measurement(session, steps_after_warmup: int = 2) -> dict[str, Any] | None:
    """The session's first segment after its warm-up step: the quickstart 'before'."""
    steps = session.steps()
    if steps.empty:
        return None
    first = steps[steps["segment_id"] == steps["segment_id"].min()].sort_values("step").iloc[1:]
    if len(first) < steps_after_warmup:
        return None
    return {"segment_id": int(first["segment_id"].iloc[0]), "steps": [int(s) for s in first["step"]],
            "step_s": float(pd.to_numeric(first["timing_s/step"]).mean()),
            "tokens_per_s_per_gpu": float(pd.to_numeric(first["perf/throughput"]).mean())}


def crashes_in(session) -> int:
    segments = session.segments()
    return int((segments["status"] == "failed").sum()) if len(segments) else 0


def memory_table(session) -> list[dict[str, Any]]:
    """The memory model's predicted vs measured peaks for every measured segment of the session."""
    from bench.memory_error import session_rows

    try:
        return session_rows(Path(session.dir))
    except Exception as error:  # a figure beside the result, never the reason it is missing
        return [{"error": f"{type(error).__name__}: {error}"}]


# ------------------------------------------------------------------------------------------------ the driver's call
_STORIES: dict[str, list[pd.DataFrame]] = {}  # session id → every call's story, for one JSON over all of them
_WALL: dict[str, float] = {}


def run(session, *, max_rounds: int, deadline: float, log: Callable[[str], None],
        save: Callable[..., None], workload: str, steps_per_round: int = 2) -> dict[str, Any]:
    """Run the autopilot on `session` until `deadline` (epoch seconds) or `max_rounds`; save and return the
    report (JSON-able)."""
    budget = deadline - time.time()
    if budget <= 0:
        raise RuntimeError(f"no time left for the autopilot ({budget:.0f} s)")
    log(f"autopilot {workload}: up to {max_rounds} round(s) in {budget:.0f} s")

    def on_round(story: pd.DataFrame) -> None:
        row = story.iloc[-1]
        log(f"autopilot {workload} round {row['round']}: {row['rule']} {json.dumps(row['change'], default=str)} "
            f"→ {row['outcome']} ({row['why']})")

    result = session.autopilot(max_rounds=max_rounds, budget_s=budget, steps_per_round=steps_per_round,
                               timeout_s=max(60.0, budget), on_round=on_round)
    _STORIES.setdefault(session.id, []).append(result.story)
    _WALL[session.id] = _WALL.get(session.id, 0.0) + result.wall_s
    story = pd.concat(_STORIES[session.id], ignore_index=True)
    before = first_measurement(session)
    after = result.after
    after_tps = after.throughput if after is not None else math.nan
    before_tps = before["tokens_per_s_per_gpu"] if before else math.nan
    speedup = after_tps / before_tps if before_tps > 0 else math.nan
    crashes = crashes_in(session)
    report = {
        "workload": workload, "speedup": speedup, "crashes": crashes, "rounds": len(story),
        "wall_s": _WALL[session.id], "ended_because": result.ended_because, "before": before,
        "after": None if after is None else {"segment_id": after.segment_id, "steps": list(after.steps),
                                             "step_s": after.step_s, "tokens_per_s_per_gpu": after.throughput},
        "story": story.to_dict("records"),
    }
    save(f"autopilot_{workload}", value=None if math.isnan(speedup) else round(speedup, 3),
         unit="x tokens/s/GPU (plan in force at the end ÷ quickstart)", goal=GOAL_SPEEDUP,
         repetitions=[{"value": r.get("throughput"), **r} for r in report["story"]],
         plan_overrides=session.export("overrides", segment=before["segment_id"]) if before else None,
         details={**{k: v for k, v in report.items() if k != "story"}, "story": report["story"],
                  "memory": memory_table(session), "goal_crashes": 0},
         notes="Only Session.autopilot changed the plan: each round applies the advisor's top safe finding, keeps "
               "it if faster, rolls it back if slower or crashed. before = the quickstart segment's steps after "
               "its warm-up step; after = the plan in force at the end, its measured steps.")
    log(f"autopilot {workload}: {speedup:.2f}× tokens/s/GPU, {crashes} crash(es), {len(story)} round(s), "
        f"ended because {result.ended_because}")
    return report


# ------------------------------------------------------------------------------------------------ standalone
def main(argv: list[str] | None = None) -> int:
    from bench.common import environment, result, write
    from workbench.session import Session

    p = argparse.ArgumentParser(prog="bench/gpu/autopilot.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="1.5b")
    p.add_argument("--budget-s", type=float, default=1500.0)
    p.add_argument("--max-rounds", type=int, default=8)
    p.add_argument("--assets", type=Path, default=Path("/root/assets"))
    p.add_argument("--replay", help="dry run on the CPU: a replay of this recording stands in for the session")
    p.add_argument("--speed", type=float, default=30.0, help="replay speed (with --replay)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    env = environment()

    def log(line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} +{time.time() - t0:5.0f}s {line}", flush=True)

    def save(measure: str, **fields: Any) -> None:
        res = result(measure, env=env, machine=env["machine"], command=" ".join(sys.argv), **fields)
        if a.replay:
            res["notes"] = "DRY RUN ON A REPLAY (no GPU): checks the driver, measures nothing. " + res["notes"]
        log(f"result -> {write(res, a.out)}")

    w = WORKLOADS[a.workload]
    session = (Session.replay(a.replay, speed=a.speed, follow=False, root=a.out / "sessions") if a.replay
               else start(w, a.assets, log))
    try:
        session.wait_until(lambda s: first_measurement(s) is not None or s.state in ("failed", "stopped",
                                                                                        "finished", "lost"),
                           timeout=max(60.0, a.budget_s))
        run(session, max_rounds=a.max_rounds, deadline=t0 + a.budget_s, log=log, save=save, workload=w.name)
    finally:
        if session.state not in ("stopped", "finished", "failed", "lost"):
            session.stop(timeout=240)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
