"""The GPU campaign of issue 17: one detached process for one lease, parts in priority order under a time budget
(a later part shrinks or is skipped when the budget runs short; a failed part is logged and the next one runs).
Each part writes its result (bench/common.py format, machine named) as soon as it has its figures.

 a. workload "1.5b" (Qwen2.5-1.5B dims, 128 prompts x 512+1024 tokens, verl's quickstart-style start: micro batches
    4/8/4/4, no dynamic batching, rollout memory 0.4): the advisor's autopilot, its first round only. Its fused-kernel
    lever is hot now: in force from the next step, with the runner's log-prob check in the `applied` event
                                                                                   -> hot_lever_1.5b.json
 b. the same plan restarted by a change no one-GPU step reads (an NCCL variable): Apply -> first resumed step, over
    the session's cold start, each start-up phase of both launches                 -> restart_vs_cold_1.5b.json
    Its steps are the plan "started fresh" that (a)'s hot steps are held to (within 10 %): hot_lever_1.5b.json again.
 b2. the sampler off / on, alternating step by step in that segment                  -> sampler_ab_1.5b.json
 c. workload "0.5b" (0.5B dims, 128 prompts x 256+768) with the autopilot if >= C_NEEDS_S are left, else the
    autopilot's further rounds on (a)'s session                                     -> hot_lever_0.5b.json, ...
 d. the newest tuned plan as plain `python3 -m verl.trainer.main_ppo` if >= D_NEEDS_S are left -> overhead.json
The autopilot is the advisor helper's part (bench/gpu/autopilot.py, `run(session, ...)`); where it is missing the
driver stands in with the advisor's top findings, one per round (`_stand_in_rounds`). The session directories
(without checkpoints and caches) are the recordings.

usage (GPU machine, repo root, after `source /root/gpu-env.sh`):  python3 bench/gpu/campaign.py OUT_DIR
      (CPU dry run of the driver on replays of real recordings):  python3 -m bench.gpu.campaign OUT_DIR --replay
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from bench.common import environment, median, result, write  # noqa: E402
from bench.gpu.analysis import per_step, segment_steps, summarize  # noqa: E402

QUICKSTART = dict(  # verl's quickstart settings (examples/ppo_trainer), on one GPU
    gpus=[0], actor_micro_batch=4, logprob_micro_batch=8, ref_micro_batch=4, critic_micro_batch=4,
    use_dynamic_bsz=False, rollout_gpu_memory=0.4, rollout_tp=1, rollout_enforce_eager=False,
)
MEASURED_STEPS = 3  # steps measured after a change (plus the first one after a relaunch)
C_NEEDS_S = 510  # workload c: cold start ~4.6 min, step 1, two quickstart steps, a hot round, two steps
D_NEEDS_S = 420  # plain verl of a 0.5B plan: ~4 min to its first step, then a few steps
ROUND_NEEDS_S = 150  # one more hot round of the autopilot: apply at the next boundary, then measured steps
RESTART_NEEDS_S = 480  # one more restart-class round: boundary, checkpoint, relaunch (~4-5 min), measured steps


@dataclass
class Workload:
    name: str
    shape: str
    knobs: dict[str, Any]
    n_train: int
    replay: str  # the recording a dry run plays instead
    replay_change: dict[str, Any] = field(default_factory=dict)  # what stands in for the autopilot's round on it


WORKLOADS = {
    "1.5b": Workload("1.5b", "qwen2.5-1.5b", dict(QUICKSTART, train_batch_size=128, ppo_mini_batch_size=32,
                                                  max_prompt_length=512, max_response_length=1024), 2048,
                     replay="h200-tuning",  # the fused lever, recorded as a restart on 2026-12-01: hot now
                     replay_change={"fused_kernels": True, "use_dynamic_bsz": True, "actor_token_budget": 16384,
                                    "logprob_token_budget": 32768, "ref_token_budget": 32768,
                                    "critic_token_budget": 32768}),
    "0.5b": Workload("0.5b", "qwen2.5-0.5b", dict(QUICKSTART, train_batch_size=128, ppo_mini_batch_size=32,
                                                  max_prompt_length=256, max_response_length=768), 2048,
                     replay="h200-proof",  # its recorded restart-class change (LoRA critic + colocate_async)
                     replay_change={"actor_token_budget": 32768, "logprob_token_budget": 32768,
                                    "ref_token_budget": 32768, "critic_token_budget": 32768, "critic_lora_rank": 8,
                                    "trainer_mode": "colocate_async"}),
}


# The autopilot's round-1 plan on 0.5b (the 2026-12-02 lease: kept, 3.0x quickstart's tokens/s/GPU, ~15 s a step):
# what `parts="restart"` starts from, so that a cold start and a restart fit in what a lease has left.
ROUND1_0_5B = {"fused_kernels": True, "use_dynamic_bsz": True, "logprob_token_budget": 32768,
               "ref_token_budget": 32768, "gradient_checkpointing": False}


def round1_0_5b() -> Workload:
    """The 0.5b workload on the autopilot's round-1 plan."""
    base = WORKLOADS["0.5b"]
    return Workload(base.name, base.shape, {**base.knobs, **ROUND1_0_5B}, base.n_train, base.replay)


PARTS = ("all", "restart", "probe", "overhead")
AB_STEPS = 8  # steps of each run of the overhead A/B (the first one, with start-up work, left out)
AB_RUN_NEEDS_S = 420  # one run: cold start ~270 s, then the steps (~14 s each on the 0.5b round-1 plan), its stop
# After the A/B steps of a later session run: a rollout setting changed live, which rebuilds the rollout beside the
# kept trainer (knob.KEEPS_TRAINER; the plain-verl probe's rollout rebuild took 174 s with the trainer rebuilt too).
ROLLOUT_CHANGE_NEEDS_S = 240
# The restart-class changes `parts="restart"` applies in turn (label = what verl's in-place rebuild keeps, the change,
# the seconds it needs; bench/results/h200_2026-12-02_probe/: 75 / 115 / 174 s boundary -> first step in plain verl):
# the critic's LoRA alpha while it has no LoRA (rank 0: a change no step reads, the restart machinery alone, as the
# NCCL variable is for a relaunch; it keeps the rollout), then the trainer mode (the agent loops are rebuilt: the
# autopilot's next lever, measured on the round-1 plan), then the rollout engine's sequences (from colocate_async, a
# relaunch).
IN_PLACE_CONTROLS = (
    ("rollout", {"critic_lora_alpha": 32}, 150),
    ("servers", {"trainer_mode": "colocate_async"}, 200),
    ("relaunch", {"rollout_max_num_seqs": 192}, 300),
)


class Campaign:
    def __init__(self, out: Path, *, replay: bool, budget_s: float, steps_before: int, plain_steps: int,
                 assets: Path, machine: str | None, workloads: tuple[str, ...] = tuple(WORKLOADS),
                 parts: str = "all"):
        unknown = set(workloads) - set(WORKLOADS)
        if unknown or not workloads:
            raise ValueError(f"workloads {sorted(unknown) or '(none)'}: choose from {', '.join(WORKLOADS)}")
        if parts not in PARTS:
            raise ValueError(f"parts {parts!r}: choose from {', '.join(PARTS)}")
        self.workloads = workloads
        self.parts = parts
        self.out = out
        self.results = out / "results"
        self.results.mkdir(parents=True, exist_ok=True)
        self.replay = replay
        self.t0 = time.time()
        self.budget_s = budget_s
        self.steps_before, self.plain_steps = steps_before, plain_steps
        self.measured = 1 if replay else MEASURED_STEPS  # a replay has only the steps it recorded
        self.assets = assets
        self.env = environment(machine)
        self.machine = self.env["machine"]
        self.session = None
        self.sessions: list = []
        self.facts: dict[str, dict[str, Any]] = {}  # per workload: what later parts need from earlier ones
        self._log = open(out / "progress.log", "a", buffering=1)

    # ------------------------------------------------------------------ plumbing
    def log(self, msg: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} +{time.time() - self.t0:5.0f}s {msg}"
        print(line, flush=True)
        self._log.write(line + "\n")

    def left(self) -> float:
        return self.budget_s - (time.time() - self.t0)

    def part(self, name: str, fn, *args) -> bool:
        self.log(f"== {name} (budget left {self.left():.0f} s)")
        t = time.time()
        try:
            fn(*args)
            self.log(f"== {name}: ok ({time.time() - t:.0f} s)")
            return True
        except Exception:
            self.log(f"== {name}: FAILED ({time.time() - t:.0f} s)\n{traceback.format_exc()}")
            return False

    def save(self, measure: str, **kw) -> None:
        meta = self.session.meta if self.session is not None else {}
        kw.setdefault("model_shape", meta.get("model_shape"))
        res = result(measure, env=self.env, machine=self.machine,
                     command="bash bench/gpu/campaign.sh start (see bench/gpu/README.md)", **kw)
        if self.replay:
            res["notes"] = "DRY RUN ON A REPLAY (no GPU): checks the driver, measures nothing. " + res.get("notes", "")
        path = write(res, self.results)
        self.log(f"result {measure}: {res['value']} {res['unit']} (goal {res['goal']}, met {res['goal_met']}) "
                 f"-> {path.name}")

    def rows(self, table: str) -> list[dict]:
        from workbench.store import Store

        store = Store(self.session.dir, readonly=True)
        try:
            return store.rows(table)
        finally:
            store.close()

    def last_step(self) -> int:
        return int(self.session.last_step() or 0)

    def wait_steps(self, n: int, what: str) -> int:
        """Wait until the session's last step is >= n (bounded by the budget); returns it."""
        s = self.session
        s.wait_for_step(n, timeout=max(60.0, self.left()))
        last = s.steps().iloc[-1]
        self.log(f"{what}: step {int(last['step'])} {float(last.get('timing_s/step', float('nan'))):.1f} s, "
                 f"{float(last.get('perf/throughput', float('nan'))):.0f} tok/s/GPU, state {s.state}")
        return int(last["step"])

    def wait_segment_steps(self, segment: int, n: int, what: str) -> None:
        """Wait until `segment` has n steps (bounded by the budget)."""
        def enough(x) -> bool:
            if x.state in ("failed", "lost", "stopped", "finished"):
                raise RuntimeError(f"session {x.id} is {x.state} while waiting for {what}")
            steps = x.steps()
            return bool(len(steps)) and int((steps["segment_id"] == segment).sum()) >= n

        self.session.wait_until(enough, timeout=max(60.0, self.left()))
        self.wait_steps(self.last_step(), what)

    # ------------------------------------------------------------------ a session per workload
    def start(self, wl: Workload) -> None:
        from workbench.session import Session

        facts = self.facts.setdefault(wl.name, {"t_start": time.time()})
        if self.replay:
            # slow enough that the driver's parts fall between the recorded steps (~20-70 s each); verl's recorded
            # start-ups (4-5 min each) pass at 100x: a dry run checks the driver, not the start-up's pace
            self.session = Session.replay(wl.replay, speed=10, startup_speed=100, follow=False,
                                          root=self.out / "sessions")
        else:
            from workbench.assets.plans import offline_overrides
            from workbench.plan import Plan

            assets = self.assets / wl.name
            info = self.workload_assets(wl)
            self.log(f"assets {wl.name}: " + json.dumps({k: v for k, v in info.items()
                                                          if not str(k).endswith(("_dir", "_path", "files"))}))
            plan = Plan.from_verl(overrides=offline_overrides(assets)).with_changes(wl.knobs)
            plan.validate(gpu_count=1)
            (self.out / f"quickstart_overrides_{wl.name}.txt").write_text("\n".join(plan.to_overrides()) + "\n")
            facts["t_start"] = time.time()  # as the user sees it: from the call that starts the session
            self.session = Session.start(plan, name=f"levers-{wl.name}")
        self.sessions.append(self.session)
        (self.out / "session_path.txt").write_text(str(self.session.dir))
        with open(self.out / "sessions.txt", "a") as sessions:  # campaign.sh packs every session's logs
            sessions.write(f"{self.session.dir}\n")
        self.log(f"session {self.session.dir}")
        self.wait_steps(self.steps_before, f"{wl.name} quickstart")

    def workload_assets(self, wl: Workload, device: str | None = None) -> dict[str, Any]:
        """A workload's offline assets (reused when there), made in a process of their own: the 1.5B set on the GPU
        (faster), whose CUDA memory then leaves with that process instead of staying in this one while it measures;
        and no import of transformers here races another generation's (workbench.assets.generate_assets_apart)."""
        from workbench.assets.generate import generate_assets_apart

        device = device or ("cuda" if wl is WORKLOADS["1.5b"] else "cpu")
        return generate_assets_apart(self.assets / wl.name, shape=wl.shape, n_train=wl.n_train, n_test=64,
                                     device=device)

    def prepare_assets(self, wl: Workload) -> threading.Thread | None:
        """Generate a later workload's assets on the CPU while the GPU runs the first one (the thread only waits for
        the generating process; start() says any failure when it needs the set)."""
        if self.replay:
            return None
        thread = threading.Thread(target=self.workload_assets, args=(wl, "cpu"), name=f"assets-{wl.name}",
                                  daemon=True)
        thread.start()
        return thread

    # ------------------------------------------------------------------ autopilot rounds
    def autopilot(self, wl: Workload, max_rounds: int) -> list[dict[str, Any]]:
        """The advisor's autopilot for up to `max_rounds` rounds (its part function, where it exists); returns the
        rounds the session's store records (apply commands since the call), whatever ran them."""
        since = max((r["id"] for r in self.rows("commands")), default=0)
        try:
            from bench.gpu import autopilot as advisor_part  # the advisor helper's part (issue 16)
        except ImportError:
            advisor_part = None
        if advisor_part is not None and not self.replay:
            try:
                report = advisor_part.run(self.session, max_rounds=max_rounds, deadline=self.t0 + self.budget_s,
                                          log=self.log, save=self.save, workload=wl.name)
                self.log(f"autopilot ({wl.name}): {json.dumps(report, default=str)[:2000]}")
            except Exception:
                self.log(f"autopilot ({wl.name}) failed:\n{traceback.format_exc()}")
                if self.rounds(since):
                    raise
                advisor_part = None  # it applied nothing (e.g. another signature): the stand-in's rounds instead
        if advisor_part is None or self.replay:
            self._stand_in_rounds(wl, max_rounds)
        rounds = self.rounds(since)
        self.facts[wl.name].setdefault("rounds", []).extend(rounds)
        return rounds

    def _stand_in_rounds(self, wl: Workload, max_rounds: int) -> None:
        """Until the advisor's part lands (and on a replay, which plays only recorded plans): each round applies the
        most severe finding that previews clean, hot ones first (on a replay the recorded change stands in), then
        waits for its measured steps."""
        from workbench.knobs import ALGORITHM_KNOBS

        s = self.session
        for _ in range(1 if self.replay else max_rounds):  # a replay holds one recorded change to stand in
            if self.replay:
                change, rule = wl.replay_change, "replay-stand-in"
            else:
                findings = [f for f in s.advice_findings() if f.change and not set(f.change) & set(ALGORITHM_KNOBS)]
                previews = [(f, s.preview(f.change)) for f in findings]
                # a restart-class round takes a relaunch: only where the budget still holds one
                usable = [(f, p) for f, p in previews if p.ok and (p.mode == "hot" or self.left() > RESTART_NEEDS_S)]
                usable.sort(key=lambda fp: fp[1].mode != "hot")  # stable: the advisor's order within each mode
                (self.out / f"advice_{wl.name}_step{self.last_step()}.json").write_text(json.dumps(
                    [{"rule": f.rule, "severity": f.severity, "change": f.change, "expected": f.expected,
                      "mode": p.mode, "problems": p.problems} for f, p in previews], indent=1, default=str))
                if not usable:
                    self.log(f"{wl.name}: no applicable advice ({len(findings)} findings): rounds end")
                    return
                change, rule = usable[0][0].change, usable[0][0].rule
            since = max((r["id"] for r in self.rows("commands")), default=0)
            handle = s.apply(change)
            self.log(f"{wl.name} round ({rule}): {handle!r}")
            handle.wait(timeout=max(60.0, self.left()))
            self.log(f"{wl.name} round ended: {handle!r}")
            if handle.state in ("applied", "resumed"):
                segment = self.rounds(since)[0]["segment"]
                try:
                    self.wait_segment_steps(segment, self.measured + (handle.mode == "restart"),
                                            f"{wl.name} after {rule}")
                    continue
                except RuntimeError:
                    if s.state != "failed":
                        raise
            if s.state == "failed":  # the change crashed the run (e.g. out of memory): back to the last good plan
                self.log(f"{wl.name}: the round crashed the run ({s.failure}): rollback")
                self.wait_segment_steps(s.rollback(), 1, f"{wl.name} after the rollback")
            return

    def rounds(self, since_command: int) -> list[dict[str, Any]]:
        """The apply commands after `since_command` and how each ended: mode, state, the step it took effect at,
        the segment it opened, when it was given."""
        out = []
        for row in self.rows("commands"):
            if row["id"] <= since_command or row["kind"] != "apply":
                continue
            answer = row["result"] if isinstance(row["result"], dict) else json.loads(row["result"] or "{}")
            payload = row.get("payload") or {}
            out.append({"command": row["id"], "t": row["t"], "state": row["state"], "changes": payload.get("changes"),
                        "mode": answer.get("mode"), "step": answer.get("step"), "segment": answer.get("segment")})
        return out

    # ------------------------------------------------------------------ (a) the hot lever
    def hot_lever(self, wl: Workload) -> None:
        """The first round of the autopilot, applied hot: its figures now (and again once (b) ran the plan fresh)."""
        rounds = self.autopilot(wl, max_rounds=1)
        hot = next((r for r in rounds if r["mode"] == "hot" and r["state"] == "applied"), None)
        if hot is None:
            raise RuntimeError(f"the autopilot's first round was not applied hot: {rounds}")
        self.facts[wl.name]["hot"] = hot
        self.wait_segment_steps(hot["segment"], self.measured, f"{wl.name} hot segment")
        self.hot_lever_result(wl)

    def hot_lever_result(self, wl: Workload) -> None:
        s, facts = self.session, self.facts[wl.name]
        hot = facts["hot"]
        frame = per_step(s.steps(), s.samples(), gpus=[0])
        frame.to_csv(self.out / f"per_step_{wl.name}.csv", index=False)
        events = s.events()
        applied = events[(events["kind"] == "applied")]
        applied = applied[[d.get("segment") == hot["segment"] for d in applied["data"]]]
        data = applied["data"].iloc[0] if len(applied) else {}
        steps = s.steps()
        before = steps[(steps["segment_id"] < hot["segment"]) & (steps["step"] > 1)]
        in_hot = steps[steps["segment_id"] == hot["segment"]]
        fresh_segment = facts.get("fresh_segment")
        fresh = steps[steps["segment_id"] == fresh_segment].iloc[1:] if fresh_segment else steps.iloc[0:0]
        hot_s, fresh_s = median(in_hot["timing_s/step"]), median(fresh["timing_s/step"])
        # given while step queued_after + 1 ran: the next boundary puts it in force from step queued_after + 2
        queued_after = int(steps[steps["t"] <= hot["t"]]["step"].max()) if (steps["t"] <= hot["t"]).any() else 0
        ratio = hot_s / fresh_s if hot_s and fresh_s else None
        memory = {col.split("/")[0]: {"quickstart": median(before.get(col, [])), "hot": median(in_hot.get(col, [])),
                                      "fresh": median(fresh.get(col, []))}
                  for col in ("actor/perf/max_memory_allocated_gb", "critic/perf/max_memory_allocated_gb")}
        self.save(
            f"hot_lever_{wl.name}", value=None if ratio is None else round(ratio, 3),
            unit="x step time, hot-applied / the same plan started fresh", goal="within 10 %",
            met=None if ratio is None else abs(ratio - 1) <= 0.10,
            repetitions=[{"value": float(t), "step": int(st), "segment": int(seg),
                          "side": "hot" if seg == hot["segment"] else "fresh"}
                         for t, st, seg in zip(pd.concat([in_hot, fresh])["timing_s/step"],
                                               pd.concat([in_hot, fresh])["step"],
                                               pd.concat([in_hot, fresh])["segment_id"])],
            plan_overrides=s.export("overrides", segment=hot["segment"]),
            details={"changes": hot["changes"], "command_t": hot["t"], "in_force_from_step": hot["step"],
                     "queued_after_step": queued_after,
                     "boundaries_late": None if hot["step"] is None else hot["step"] - (queued_after + 2),
                     "first_step_of_hot_segment": int(in_hot["step"].min()) if len(in_hot) else None,
                     "logprob_check": data.get("logprob_check"), "workers": data.get("workers"),
                     "applied_text": applied["text"].iloc[0] if len(applied) else None,
                     "step_s": {"quickstart": median(before["timing_s/step"]), "hot": hot_s, "fresh": fresh_s},
                     # Generation varies from step to step and no training lever touches it (lease 3: gen 5.3-11.4 s
                     # within one plan): the phases themselves say whether the hot switch ran as the fresh plan does.
                     "phase_s": {phase: {"hot": median(in_hot.get(f"timing_s/{phase}", [])),
                                         "fresh": median(fresh.get(f"timing_s/{phase}", []))}
                                 for phase in ("gen", "old_log_prob", "ref", "values", "update_critic",
                                               "update_actor")},
                     "step_minus_gen_s": {side: median(side_steps["timing_s/step"] - side_steps["timing_s/gen"])
                                          if len(side_steps) and "timing_s/gen" in side_steps else None
                                          for side, side_steps in (("hot", in_hot), ("fresh", fresh))},
                     "tokens_per_s_per_gpu": {"quickstart": median(before.get("perf/throughput", [])),
                                              "hot": median(in_hot.get("perf/throughput", [])),
                                              "fresh": median(fresh.get("perf/throughput", []))},
                     "max_memory_allocated_gb": memory, "fresh_segment": fresh_segment,
                     "summaries": {"quickstart": summarize(frame[frame["segment_id"] < hot["segment"]].iloc[1:]),
                                   "hot": summarize(frame[frame["segment_id"] == hot["segment"]])}},
            notes="hot: the autopilot's first round applied between steps in the running workers (no checkpoint, "
                  "no relaunch); fresh: the same plan relaunched from a checkpoint (part b), its first step left "
                  "out; every hot step counts. logprob_check: the runner's recomputation of this step's log-probs "
                  "before and after the switch (max |difference|).",
        )

    # ------------------------------------------------------------------ (b) the same plan restarted
    def control_restart(self, wl: Workload, change: dict[str, Any] | None = None, label: str = "",
                        within_s: float | None = None) -> None:
        """A restart-class change, Apply -> resumed (within `within_s`, else the budget) -> measured steps. Without
        `change`: a change no one-GPU step reads (an NCCL variable), which only new processes take (a relaunch)."""
        s = self.session
        if change is None:
            current = dict(s.knob_values()["nccl_env"])
            change = {"nccl_env": {**current, "NCCL_P2P_DISABLE": "1" if current.get("NCCL_P2P_DISABLE") != "1" else "0"}}
        since = max((r["id"] for r in self.rows("commands")), default=0)
        handle = s.apply(change)
        self.log(f"{wl.name} control restart {label}: {handle!r}")
        handle.wait(timeout=max(60.0, min(self.left(), within_s or self.left())))
        self.log(f"{wl.name} control restart {label} ended: {handle!r}")
        if handle.state != "resumed":
            raise RuntimeError(f"the control restart did not resume: {handle.state} {handle.message}")
        restart = self.rounds(since)[0]
        self.facts[wl.name].update(fresh_segment=restart["segment"], restart=restart)
        self.wait_segment_steps(restart["segment"], 1 + self.measured, f"{wl.name} fresh")
        self.restart_result(wl, restart, label)
        if "hot" in self.facts[wl.name] and not label:
            self.hot_lever_result(wl)

    def restart_result(self, wl: Workload, restart: dict[str, Any], label: str = "") -> None:
        from workbench.startup import parse_startup, read_log, summary

        s = self.session
        steps, segs = s.steps(), s.segments().set_index("id")
        first = steps.groupby("segment_id")["t"].min()
        cold_seg, after = int(segs.index[0]), int(restart["segment"])
        cold = float(first[cold_seg] - self.facts[wl.name]["t_start"])
        value = float(first[after] - restart["t"])
        phases = {}
        for seg in (cold_seg, after):
            path = s.dir / "logs" / f"segment-{seg}.log"
            if path.exists():
                df = parse_startup(read_log(path), launched_at=float(segs.loc[seg, "started_at"]),
                                   first_step_end=float(first[seg]))
                phases[str(seg)] = {"summary": summary(df), "phases": df[["phase", "seconds", "source"]].to_dict("records")}
        events = s.events()
        since = [e for e in events.to_dict("records") if e["t"] >= restart["t"]]
        checkpoint = [e for e in since if e["kind"] == "checkpoint"]
        checkpoint_s = re.search(r"\(([0-9.]+) s", checkpoint[0]["text"]) if checkpoint else None
        launch_t = float(segs.loc[after, "started_at"])
        # the run's checkpoint-and-exit (a relaunch), or its rebuilt segment's launch (in place)
        boundary = [e for e in since if e["kind"] in ("exiting", "launched")]
        launched = [e for e in since if e["kind"] == "launched"]
        ready = [e for e in since if e["kind"] == "started"]
        self.save(
            f"restart_vs_cold_{wl.name}" + (f"_{label}" if label else ""), value=round(value / cold, 3),
            unit="x cold start", goal="<= 0.6",
            repetitions=[{"value": value / cold, "restart_s": value, "cold_s": cold}],
            details={"cold_start_s": cold, "apply_to_first_resumed_step_s": value,
                     "apply_to_step_boundary_s": (boundary[0]["t"] - restart["t"]) if boundary else None,
                     "checkpoint_s": float(checkpoint_s.group(1)) if checkpoint_s else None,
                     "checkpoint_text": checkpoint[0]["text"] if checkpoint else None,
                     "apply_to_relaunch_s": launch_t - restart["t"],
                     "apply_to_verl_ready_s": (ready[0]["t"] - restart["t"]) if ready else None,
                     "relaunch_to_first_step_s": float(first[after]) - launch_t,
                     "changes": restart["changes"], "startup_phases": phases, "restart_env": restart_env_flags(),
                     "in_place": bool(launched and launched[0]["data"].get("in_place")),
                     "keeps": launched[0]["data"].get("keeps") if launched else None,
                     "launched_text": launched[0]["text"] if launched else None,
                     "compile_cache_mb": sum(f.stat().st_size for f in (s.dir / "cache").rglob("*") if f.is_file())
                     / 2**20 if (s.dir / "cache").exists() else None},
            notes="restart: Apply -> the first resumed step's row (waiting for the step boundary, checkpoint, then "
                  "verl rebuilt in place or relaunched, the first step); cold: Session.start -> the first step's row.",
        )

    # ------------------------------------------------------------------ (b2) the sampler's cost, alternating
    def sampler_ab(self, wl: Workload) -> None:
        s = self.session
        rows = []
        self.wait_steps(self.last_step() + 1, "sampler A/B: at a step boundary")
        for on in (False, True) if self.replay else (False, True, False, True):  # a replay has few steps left
            # Switched right after a step's row: the step under way began a moment ago (the sampler starts or
            # stops within ~1 s), so that step is the one measured.
            s.telemetry(on)
            step = self.wait_steps(self.last_step() + 1, f"sampler {'on' if on else 'off'}")
            last = s.steps().iloc[-1]
            rows.append({"value": float(last["timing_s/step"]), "sampler": on, "step": step,
                         **{phase: float(last.get(f"timing_s/{phase}", float("nan")))
                            for phase in ("gen", "old_log_prob", "values", "update_critic", "update_actor")}})
        s.telemetry(True)
        on_s = median(r["value"] for r in rows if r["sampler"])
        off_s = median(r["value"] for r in rows if not r["sampler"])
        self.save(f"sampler_ab_{wl.name}", value=round(on_s / off_s, 4) if on_s and off_s else None,
                  unit="x step time, sampler on / off", goal="<= 1.01", repetitions=rows,
                  details={"on_s": on_s, "off_s": off_s},
                  notes="the NVML sampler (10 Hz, GPM) switched right after a step's row was written (the next step "
                        "had just begun); each figure is that next step; alternating off/on/off/on in one segment. "
                        "On 2026-12-01 every phase ran 9-27 % slower in the session than in plain verl run after it "
                        "(overhead.json): the GPU-side sampler is one suspect, measured here alternating")

    # ------------------------------------------------------------------ ending a session, recordings
    def stop_session(self) -> None:
        s = self.session
        if s is None:
            return
        try:
            if s.state not in ("stopped", "finished", "failed", "lost"):
                s.stop(timeout=240)
        except Exception:
            self.log(f"stop at the boundary failed, stopping now:\n{traceback.format_exc()}")
            s.stop(now=True, timeout=60)
        self.log(f"session {s.id}: {s.state}")

    def pack_recordings(self) -> None:
        import sqlite3

        with tarfile.open(self.out / "recording.tar.gz", "w:gz") as tar:
            for s in self.sessions:
                db = sqlite3.connect(s.dir / "session.sqlite")  # the session has ended: fold the WAL into the file
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                db.close()
                tar.add(s.dir, arcname=s.dir.name, filter=lambda ti: None if any(
                    part in ti.name for part in ("/checkpoints", "/cache")) or ti.name.endswith(".token") else ti)
        self.log(f"recordings packed: {(self.out / 'recording.tar.gz').stat().st_size / 1e6:.1f} MB")

    # ------------------------------------------------------------------ (d) plain verl
    def overhead(self) -> None:
        s = self.sessions[-1]
        seg = int(s.steps()["segment_id"].max())
        n = max(3, min(self.plain_steps, int((self.left() - 270) / 25)))
        self.log(f"plain verl: {n} steps of segment {seg}'s plan of {s.id}")
        overrides = plain_overrides(s.export("overrides", segment=seg), steps=n)
        (self.out / "plain_overrides.txt").write_text("\n".join(overrides) + "\n")
        run = self.out / "plain"
        run.mkdir(exist_ok=True)
        rc = self.run_plain("plain verl", [sys.executable, "-m", "verl.trainer.main_ppo", *overrides], run,
                            {**self.plain_env(), "VERL_FILE_LOGGER_PATH": str(run / "metrics.jsonl")})
        metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()] \
            if (run / "metrics.jsonl").exists() else []
        plain_rows = [m["data"] for m in metrics if m["step"] > 1]
        tuned = segment_steps(per_step(s.steps(), s.samples(), gpus=[0]), seg)
        if not plain_rows or tuned.empty:
            raise RuntimeError(f"no steps to compare (plain {len(plain_rows)}, session {len(tuned)}); rc {rc}")
        fig = overhead_figures(tuned, plain_rows)
        self.save(
            "overhead", value=round(fig["ratio"], 4), unit="x (step - gen) time, session / plain verl", goal="<= 1.01",
            plan_overrides=overrides, repetitions=fig["repetitions"],
            details={**fig["details"], "plain_rc": rc, "plain_start_to_exit_s": time.time() - t0},
            notes="value: median (timing_s/step - timing_s/gen), the session's newest segment / the same plan as "
                  "plain python3 -m verl.trainer.main_ppo, one after the other on the same GPU; the sampler's share "
                  "is measured alternating in sampler_ab_*; first step of each run left out",
        )

    def pack_logs(self) -> None:
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            paths = [p for s in self.sessions for p in sorted((s.dir / "logs").glob("*.log"))]
            for path in paths + [self.out / "plain" / "log.txt"]:
                if path.exists():
                    tail = self.out / f"tail-{path.name}"
                    tail.write_bytes(path.read_bytes()[-4_000_000:])
                    tar.add(tail, arcname=f"{path.parent.parent.name}/{path.name}")
                    tail.unlink()

    # ------------------------------------------------------------------ the order of the parts
    def run(self) -> None:
        self.log(f"campaign on {self.machine} ({self.env.get('gpu')}), budget {self.budget_s:.0f} s, "
                 f"replay={self.replay}, parts {self.parts}")
        if self.parts == "restart":
            return self.restart_only()
        if self.parts == "probe":
            return self.probe_only()
        if self.parts == "overhead":
            return self.overhead_ab()
        a, c = WORKLOADS["1.5b"], WORKLOADS["0.5b"]
        assets_c = self.prepare_assets(c) if c.name in self.workloads else None
        if a.name not in self.workloads:
            self.log(f"a, b skipped: workloads {', '.join(self.workloads)}")
        elif self.part("a1 start 1.5b on quickstart settings", self.start, a):
            self.part("a2 autopilot round 1 (hot fused lever expected)", self.hot_lever, a)
            self.part("b the same plan restarted (control): restart vs cold, hot vs fresh", self.control_restart, a)
            if self.left() > 240:
                self.part("b2 sampler off/on alternating", self.sampler_ab, a)
            if self.left() < C_NEEDS_S and self.left() > ROUND_NEEDS_S:
                self.part("b3 autopilot: further rounds on 1.5b", self.autopilot, a, 5)
        if a.name in self.workloads:
            self.part("stop 1.5b", self.stop_session)
        if c.name not in self.workloads:
            self.log(f"c skipped: workloads {', '.join(self.workloads)}")
        elif self.left() >= C_NEEDS_S or self.replay:
            if assets_c is not None:
                assets_c.join()
            if self.part("c1 start 0.5b on quickstart settings", self.start, c):
                self.part("c2 autopilot on 0.5b", self.second_workload, c)
            self.part("stop 0.5b", self.stop_session)
        else:
            self.log(f"c skipped: {self.left():.0f} s left, it needs {C_NEEDS_S}")
        self.part("pack recordings", self.pack_recordings)
        if self.replay:
            self.log("d skipped: plain verl needs a GPU")
        elif self.left() >= D_NEEDS_S:
            self.part("d overhead vs plain verl", self.overhead)
        else:
            self.log(f"d skipped: {self.left():.0f} s left, plain verl needs {D_NEEDS_S}")
        self.part("pack logs", self.pack_logs)
        self.log("DONE")

    def restart_only(self) -> None:
        """Only (b) on 0.5b, from the autopilot's round-1 plan: cold start -> step 1 -> restart-class changes verl
        takes in place, each keeping less of the run (IN_PLACE_CONTROLS), while the budget lasts -> each one's first
        resumed step against the cold start (`restart_vs_cold_0.5b_<keeps>.json`)."""
        wl = round1_0_5b()
        self.steps_before, self.measured = 1, 1
        if self.part("r1 start 0.5b on the autopilot's round-1 plan", self.start, wl):
            for label, change, needs in IN_PLACE_CONTROLS:
                if self.left() < needs:
                    self.log(f"r2 {label} skipped: {self.left():.0f} s left, it needs {needs}")
                    continue
                if not self.part(f"r2 restart keeping {label}: {change}", self.control_restart, wl, change, label):
                    break
        self.part("stop 0.5b", self.stop_session)
        self.part("pack recordings", self.pack_recordings)
        self.part("pack logs", self.pack_logs)
        self.log("DONE")

    def probe_only(self) -> None:
        """Only (e): the import times of each kind of process, then bench/gpu/inplace_probe.py on 0.5b's round-1 plan
        (plain verl: a cold start, 3 steps, then the trainer rebuilt in the same TaskRunner once per rebuild)."""
        wl = WORKLOADS["0.5b"]
        importing = threading.Thread(target=self.part, args=("e0 import times per process kind", self.import_times),
                                     name="import-times")
        importing.start()  # beside the assets (CPU), before any GPU work: nothing else runs
        self.part("e0 assets 0.5b", self.workload_assets, wl)
        importing.join()
        self.part("e1 in-place rebuild probe", self.inplace_probe, wl)
        self.log("DONE")

    def import_times(self) -> None:
        path = self.results / "import_times.json"
        subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "import_times.py"), str(path)],
                       env=self.plain_env(), cwd=ROOT, timeout=max(60.0, self.left()), check=True)
        self.log("import times: " + json.dumps({k: v["wall_s"] for k, v in json.loads(path.read_text())["imports"].items()}))

    def run_plain(self, what: str, command: list[str], run: Path, env: dict[str, str]) -> int | str:
        """A plain-verl process (its output in run/log.txt) until it exits or the budget is spent; then Ray, which
        it started, is stopped. Returns its exit code ("timeout" when killed)."""
        t0 = time.time()
        with open(run / "log.txt", "wb") as logf:
            proc = subprocess.Popen(command, cwd=run, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=max(60.0, self.left() + 60))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                rc = "timeout"
        self.log(f"{what} exited {rc} after {time.time() - t0:.0f} s")
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True, timeout=60)
        return rc

    def plain_env(self) -> dict[str, str]:
        """Plain verl's environment: verl has no workbench fallback for flash-attn's absence in the critic, the
        staging's does that."""
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
        env["PYTHONPATH"] = os.pathsep.join(p for p in ("/root/site", "/root/fallback", env.get("PYTHONPATH", "")) if p)
        return env

    def inplace_probe(self, wl: Workload) -> None:
        from workbench.assets.plans import offline_overrides
        from workbench.plan import Plan

        plan = Plan.from_verl(overrides=offline_overrides(self.assets / wl.name)).with_changes(
            {**wl.knobs, **ROUND1_0_5B})
        run = self.out / "probe"
        run.mkdir(exist_ok=True)
        command = [sys.executable, str(ROOT / "bench" / "gpu" / "inplace_probe.py"), str(run), "--",
                   *plain_overrides(plan.to_overrides(), steps=3)]
        (self.out / "probe_command.txt").write_text(" ".join(command) + "\n")
        rc = self.run_plain("probe", command, run, self.plain_env())
        data = json.loads((run / "inplace_probe.json").read_text())
        (self.results / "inplace_probe_raw.json").write_text(json.dumps(data, indent=1))
        fig = probe_figures(data)
        self.save("inplace_restart_probe", value=fig["best_ratio"], unit="x cold start (plain verl, same process)",
                  goal="<= 0.6", repetitions=fig["rebuilds"], details={**fig, "rc": rc},
                  notes="each rebuild: its step boundary (checkpoint start) -> the end of the first step after it, "
                        "over the probe's cold start: process start -> the end of step 1. Plain verl 0.9.1 with "
                        "bench/gpu/inplace_probe.py's TaskRunner, no workbench session; the raw stamps are in "
                        "inplace_probe_raw.json")

    def overhead_ab(self) -> None:
        """(o) The session against plain `python3 -m verl.trainer.main_ppo` on the same plan (0.5b, the autopilot's
        round-1 plan), alternating session, plain, session, plain while the budget lasts (issue 17 asks for
        alternating runs): AB_STEPS steps each -> overhead_ab.json, (step - gen) and whole-step medians of all runs
        of a side, and each run's own."""
        wl = round1_0_5b()
        self.steps_before = AB_STEPS
        sessions, plains, overrides = [], [], None
        for number, side in enumerate(("session", "plain", "session", "plain"), start=1):
            if self.left() < AB_RUN_NEEDS_S:
                self.log(f"o{number} {side} skipped: {self.left():.0f} s left, a run needs {AB_RUN_NEEDS_S}")
                break
            if side == "session":
                if not self.part(f"o{number} session, {AB_STEPS} steps", self.start, wl):
                    break
                s = self.session
                overrides = overrides or plain_overrides(s.export("overrides", segment=1), steps=AB_STEPS)
                sessions.append(segment_steps(per_step(s.steps(), s.samples(), gpus=[0]), 1))
                if number > 1 and self.left() >= ROLLOUT_CHANGE_NEEDS_S:  # after the first plain run: its A/B is safe
                    self.part(f"o{number} rollout setting changed in place", self.rollout_change, wl)
                self.part(f"o{number} stop", self.stop_session)
            else:
                run = self.out / f"plain{number}"
                run.mkdir(exist_ok=True)
                rc = self.run_plain(f"o{number} plain verl", [sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
                                    run, {**self.plain_env(), "VERL_FILE_LOGGER_PATH": str(run / "metrics.jsonl")})
                metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()] \
                    if (run / "metrics.jsonl").exists() else []
                plains.append([m["data"] for m in metrics if m["step"] > 1])
                self.log(f"o{number} plain verl: rc {rc}, {len(plains[-1])} steps")
        if not sessions or not any(plains):
            raise RuntimeError(f"nothing to compare: {len(sessions)} session runs, {len(plains)} plain runs")
        (self.out / "plain_overrides.txt").write_text("\n".join(overrides) + "\n")
        fig = overhead_ab_figures(sessions, plains)
        self.save("overhead_ab", value=round(fig["ratio"], 4), unit="x (step - gen) time, session / plain verl",
                  goal="<= 1.01", plan_overrides=overrides, repetitions=fig["repetitions"], details=fig["details"],
                  notes="runs alternating session, plain, session, plain on one GPU, the same exported plan; value: "
                        "median (timing_s/step - timing_s/gen) of all session steps / of all plain verl steps, the "
                        "first step of each run left out; details.runs: each run's own medians")
        self.log("DONE")

    def rollout_change(self, wl: Workload) -> None:
        """The rollout engine's memory share changed in the running session: verl keeps the trainer and rebuilds the
        rollout beside it (knob.KEEPS_TRAINER) -> restart_vs_cold_<wl>_trainer.json, Apply -> first step after it
        over this session's cold start."""
        memory = float(self.session.knob_values()["rollout_gpu_memory"])
        self.measured = 1
        self.control_restart(wl, {"rollout_gpu_memory": round(memory + 0.05, 2)}, "trainer",
                             within_s=ROLLOUT_CHANGE_NEEDS_S)

    def second_workload(self, wl: Workload) -> None:
        rounds = self.autopilot(wl, max_rounds=max(1, int((self.left() - 60) // ROUND_NEEDS_S)))
        for r in rounds:
            if r["mode"] == "hot" and r["state"] == "applied" and "hot" not in self.facts[wl.name]:
                self.facts[wl.name]["hot"] = r
                self.hot_lever_result(wl)
            elif r["mode"] == "restart" and r["state"] == "resumed":
                self.restart_result(wl, r)


def overhead_figures(tuned: pd.DataFrame, plain_rows: list[dict]) -> dict:
    """Session steps (per_step rows) against plain verl's (its file logger's `data` dicts). The runner polls verl's
    V1 replay buffer every 0.05 s where plain verl sleeps 2 s (timing_s/gen on a 2 s grid): an intended speed-up
    inside gen, not overhead. So the figure is step time minus gen; the raw step ratio and the gen ratio are beside
    it."""
    sess_step, plain_step = list(tuned["step_s"]), [r["timing_s/step"] for r in plain_rows]
    sess_rest = list(tuned["step_s"] - tuned["gen_s"])
    plain_rest = [r["timing_s/step"] - r.get("timing_s/gen", 0.0) for r in plain_rows]
    return {
        "ratio": median(sess_rest) / median(plain_rest),
        "repetitions": [{"value": v, "side": "session", "step": int(st), "step_s": t}
                        for v, st, t in zip(sess_rest, tuned["step"], sess_step)]
        + [{"value": v, "side": "plain", "step_s": t} for v, t in zip(plain_rest, plain_step)],
        "details": {"ratio_step_time_raw": median(sess_step) / median(plain_step),
                    "ratio_gen": median(tuned["gen_s"]) / median([r.get("timing_s/gen", float("nan")) for r in plain_rows]),
                    "session_median_step_s": median(sess_step), "plain_median_step_s": median(plain_step),
                    "ran": {"session": len(sess_step), "plain": len(plain_step)}},
    }


def overhead_ab_figures(sessions: list[pd.DataFrame], plains: list[list[dict]]) -> dict:
    """overhead_figures over every run of each side pooled, and each run's medians in the order they ran."""
    fig = overhead_figures(pd.concat(sessions, ignore_index=True), [row for run in plains for row in run])
    runs = []
    for session, plain in itertools.zip_longest(sessions, plains):
        for side, rows in (("session", session), ("plain", plain)):
            if rows is None or not len(rows):
                continue
            if side == "session":
                step, rest = list(rows["step_s"]), list(rows["step_s"] - rows["gen_s"])
            else:
                step = [r["timing_s/step"] for r in rows]
                rest = [r["timing_s/step"] - r.get("timing_s/gen", 0.0) for r in rows]
            runs.append({"side": side, "steps": len(step), "median_step_s": median(step),
                         "median_step_minus_gen_s": median(rest)})
    fig["details"]["runs"] = runs
    return fig


def probe_figures(data: dict) -> dict:
    """inplace_probe.json's stamps as phases: the cold start, and per rebuild its boundary -> first step after it."""
    stamps = [(what, float(t)) for what, t in data.get("stamps", [])]
    steps = sorted(data.get("steps", []), key=lambda row: row["t"])
    if not steps:
        raise RuntimeError(f"the probe ran no step: {data.get('error') or data.get('stamps')}")
    cold = steps[0]["t"] - float(data["process_start"])
    out: dict[str, Any] = {"cold_start_s": cold, "cold_phases_s": _phases(stamps, float(data["process_start"]),
                                                                           steps[0]["t"]),
                           "steps": steps, "rebuilds": [], "error": data.get("error")}
    for number, rebuild in enumerate(data.get("rebuilds", []), start=2):
        begin = next((t for what, t in stamps if what.startswith(f"rebuild {number} (") and what.endswith(": checkpoint")),
                     None)
        after = [row for row in steps if begin is not None and row["t"] > begin]
        row = {"keep": rebuild["keep"], "change": rebuild["change"], "ok": rebuild["ok"],
               "error": rebuild.get("error"), "recovered": bool(rebuild.get("recovered_by_rebuilding_all"))}
        if begin is not None and after and (rebuild["ok"] or row["recovered"]):
            row.update(value=(after[0]["t"] - begin) / cold, boundary_to_first_step_s=after[0]["t"] - begin,
                       phases_s=_phases(stamps, begin, after[0]["t"]),
                       steps_after_s=[r.get("timing_s/step") for r in after[:2]])
        out["rebuilds"].append(row)
    ratios = [r["value"] for r in out["rebuilds"] if "value" in r]
    out["best_ratio"] = round(min(ratios), 3) if ratios else None
    return out


def _phases(stamps: list[tuple[str, float]], begin: float, end: float) -> dict[str, float]:
    """Seconds from each stamp in [begin, end) to the next one (the last one to `end`)."""
    inside = [(what, t) for what, t in stamps if begin <= t < end]
    marks = inside + [("first step done", end)]
    start = [("start", begin)] if not inside or inside[0][1] > begin else []
    marks = start + marks
    return {f"{what} ->": round(nxt - t, 2) for (what, t), (_, nxt) in zip(marks, marks[1:])}


def restart_env_flags() -> dict:
    """What the workbench did to make restarts faster in this run (runner/runtime.py, workbench/ray_cluster.py)."""
    return {k: v for k, v in os.environ.items()
            if k.startswith(("WORKBENCH_RAY", "WORKBENCH_COMPILE", "VLLM_", "TORCHINDUCTOR", "TRITON_CACHE"))}


def plain_overrides(overrides: list[str], steps: int) -> list[str]:
    """The exported plan for `python3 -m verl.trainer.main_ppo`: file logger on, `steps` steps, sdpa without
    flash-attn (what the workbench's runner does on its own). Later keys replace earlier ones: Hydra refuses a key
    given twice."""
    merged: dict[str, str] = {}
    extra = [f"trainer.total_training_steps={steps}", "trainer.logger=[console,file]", "trainer.save_freq=-1"]
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        extra += ["actor_rollout_ref.model.use_remove_padding=False", "critic.model.use_remove_padding=False",
                  "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                  "+critic.model.override_config.attn_implementation=sdpa"]
    for o in [*overrides, *extra]:
        key = o.split("=", 1)[0].lstrip("+")
        merged.pop(key, None)
        merged[key] = o
    return list(merged.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/gpu/campaign.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--replay", action="store_true", help="dry run on replays of real recordings (CPU)")
    p.add_argument("--budget-s", type=float, default=float(os.environ.get("CAMPAIGN_BUDGET_S", "1380")))
    p.add_argument("--steps-before", type=int, default=3, help="steps on quickstart settings before the autopilot")
    p.add_argument("--plain-steps", type=int, default=int(os.environ.get("PLAIN_STEPS", "6")))
    p.add_argument("--assets", type=Path, default=Path(os.environ.get("CAMPAIGN_ASSETS", "/root/assets")))
    p.add_argument("--machine")
    p.add_argument("--workloads", default=os.environ.get("CAMPAIGN_WORKLOADS", ",".join(WORKLOADS)),
                   help="which workloads run, in the campaign's order (default: all; e.g. 0.5b: its autopilot with "
                        "the whole budget, then plain verl)")
    p.add_argument("--parts", choices=PARTS, default=os.environ.get("CAMPAIGN_PARTS", "all"),
                   help="all: the campaign; restart: only the control restart on 0.5b from the autopilot's round-1 "
                        "plan (cold start, step 1, restart, first resumed step)")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    Campaign(a.out, replay=a.replay, budget_s=a.budget_s, steps_before=a.steps_before, plain_steps=a.plain_steps,
             assets=a.assets, machine=a.machine, workloads=tuple(w for w in a.workloads.split(",") if w), parts=a.parts).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
