"""The workbench's proof on a GPU: a real verl 0.9.1 PPO session driven through the Session API.

Phases (each logged to OUT/progress.log; a failed phase is recorded and the next one still runs):
 1. offline assets: Qwen2.5-0.5B-shaped random model, trained tokenizer, synthetic gsm8k-schema data;
 2. telemetry self-test (every NVML/GPM metric once) and a bf16 matmul loop sampled at 10 Hz (SM active ~100%
    expected), with the sampler's own CPU cost measured;
 3. a live session: start; sampler off for a few steps and on again (its cost on the step time, same run);
    hot-apply larger token budgets (4 096 -> 32 768 tokens/GPU); a restart-class change (LoRA critic on + colocate_async) that resumes from
    the checkpoint; an absurd rollout token budget (max_num_batched_tokens) that crashes with OOM; rollback;
    stop. The session directory, without checkpoints, is the recording.
usage (on the GPU machine, repo root): python3 bench/gpu/session_proof.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import traceback
from pathlib import Path

import psutil

from workbench.assets.plans import OFFLINE_KNOBS, offline_overrides

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "/root/proof")
OUT.mkdir(parents=True, exist_ok=True)
ASSETS = Path(os.environ.get("PROOF_ASSETS", "/root/assets"))
os.environ.setdefault("VERL_WORKBENCH_HOME", "/root/wb")
_log = open(OUT / "progress.log", "a", buffering=1)


def log(msg: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {msg}"
    print(line, flush=True)
    _log.write(line + "\n")


def phase(name):
    def wrap(fn):
        def run(*a, **kw):
            log(f"== {name}")
            t0 = time.time()
            try:
                out = fn(*a, **kw)
                log(f"== {name}: ok ({time.time() - t0:.0f} s)")
                return out
            except Exception:
                log(f"== {name}: FAILED ({time.time() - t0:.0f} s)\n{traceback.format_exc()}")
                return None
        return run
    return wrap


@phase("assets")
def make_assets():
    from workbench.assets import generate_assets_apart

    # in a process of its own: its CUDA memory must not stay in this one while the session runs
    info = generate_assets_apart(ASSETS, shape="qwen2.5-0.5b", n_train=2048, n_test=64, device="cuda")
    log(json.dumps({k: v for k, v in info.items() if not k.endswith(("_dir", "_path"))}))
    return info


@phase("telemetry self-test")
def selftest():
    out = subprocess.run([sys.executable, "-m", "workbench.telemetry.selftest"], capture_output=True, text=True, timeout=60)
    (OUT / "selftest.json").write_text(out.stdout)
    log(out.stdout[-3000:] + out.stderr[-2000:])


@phase("matmul under the sampler")
def matmul_sampled(seconds: float = 15.0):
    """A bf16 matmul loop on GPU 0 with the sampler at 10 Hz in its own process; the sampler's CPU share."""
    import torch

    from workbench.store import Store

    session = Path(os.environ["VERL_WORKBENCH_HOME"]) / "matmul"
    shutil.rmtree(session, ignore_errors=True)
    Store(session).set_meta(kind="bench", what="bf16 matmul 8192^3 loop on GPU 0, sampler at 10 Hz")
    sampler = subprocess.Popen([sys.executable, "-m", "workbench.telemetry.sampler", "--session", str(session), "--hz", "10", "--gpus", "0"])
    proc = psutil.Process(sampler.pid)
    time.sleep(3.0)  # NVML init + first GPM sample
    cpu0, wall0 = sum(proc.cpu_times()[:2]), time.time()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0, n = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        n += 20
    elapsed = time.time() - t0
    time.sleep(2.0)  # idle tail
    cpu1, wall1 = sum(proc.cpu_times()[:2]), time.time()
    sampler.terminate()
    sampler.wait(timeout=20)
    store = Store(session)
    samples = store.frame("samples")
    inside = samples[(samples.t > t0 + 1) & (samples.t < t0 + elapsed - 0.5)]
    result = dict(
        machine=os.uname().nodename, gpu=torch.cuda.get_device_name(0), seconds=round(elapsed, 2),
        tflops=round(2 * 8192**3 * n / elapsed / 1e12, 1),
        sampler_cpu_percent_of_one_core=round(100 * (cpu1 - cpu0) / (wall1 - wall0), 2),
        samples_per_s=round(len(samples) / (samples.t.max() - samples.t.min()), 2) if len(samples) > 1 else None,
        inside_matmul={c: round(float(inside[c].mean()), 1) for c in
                       ("util", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "power_w", "pcie_tx", "pcie_rx")
                       if c in inside},
        n_inside=len(inside),
    )
    (OUT / "matmul_sampler.json").write_text(json.dumps(result, indent=1))
    samples.to_csv(OUT / "matmul_samples.csv", index=False)
    log(json.dumps(result))


BASE = offline_overrides(ASSETS)
KNOBS = OFFLINE_KNOBS


def wait_step(s, n, timeout):
    log(f"waiting for step {n} (state {s.state})")
    s.wait_for_step(n, timeout=timeout)
    last = s.steps().iloc[-1]
    log(f"step {int(last['step'])}: step {last.get('timing_s/step', float('nan')):.1f} s, "
        f"throughput {last.get('perf/throughput', float('nan')):.0f} tok/s/GPU")


@phase("live session")
def live_session():
    from workbench.plan import Plan
    from workbench.session import Session

    plan = Plan.from_verl(overrides=BASE).with_changes(KNOBS)
    plan.validate(gpu_count=1)
    (OUT / "plan_overrides.txt").write_text("\n".join(plan.to_overrides()))
    s = Session.start(plan, name="h200-proof")
    (OUT / "session_path.txt").write_text(str(s.dir))
    log(f"session {s.dir}")
    marks = {}
    try:
        wait_step(s, 2, 600)
        s.telemetry(False)
        marks["sampler_off_after_step"] = int(s.steps().step.max())
        log("sampler off")
        wait_step(s, marks["sampler_off_after_step"] + 3, 300)
        s.telemetry(True)
        marks["sampler_on_after_step"] = int(s.steps().step.max())
        log("sampler on")
        wait_step(s, marks["sampler_on_after_step"] + 3, 300)
        # verl's max_memory_* metrics are peaks since start: a raised budget shows as a new peak, a lowered one can't.
        budgets = dict(actor_token_budget=32768, logprob_token_budget=32768, ref_token_budget=32768, critic_token_budget=32768)
        r = s.apply(budgets)
        log(f"hot apply: {r}")
        marks["hot_applied_during_step"] = int(s.steps().step.max()) + 1
        wait_step(s, marks["hot_applied_during_step"] + 3, 300)
        r = s.apply(dict(critic_lora_rank=8, critic_lora_alpha=16, trainer_mode="colocate_async"))
        log(f"restart apply: {r}")
        s.wait_until(lambda x: x.state == "restarting" or len(x.segments()) >= 4, timeout=120)
        cur = int(s.steps().step.max())
        wait_step(s, cur + 5, 600)
        r = s.apply(dict(rollout_max_batched_tokens=8_000_000))
        log(f"absurd rollout budget: {r}")
        s.wait_until(lambda x: x.state == "failed", timeout=420)
        crash = s.events().query("kind == 'crash'").iloc[-1]
        log(f"crash recorded: {crash['text']}\n{crash['data'].get('traceback_tail', '')[-1500:]}")
        seg = s.rollback()
        log(f"rollback: segment {seg}")
        cur = int(s.steps().step.max())
        wait_step(s, cur + 2, 420)
    finally:
        try:
            s.stop(timeout=240)
        except Exception:
            log(f"stop failed:\n{traceback.format_exc()}")
            s.stop(now=True, timeout=60)
        (OUT / "marks.json").write_text(json.dumps(marks))
        log(f"final state {s.state}")
        summarize(s)


def summarize(s):
    segs = s.segments()
    cols = [c for c in ("id", "status", "reason", "resumed_from_step", "steps", "first_step", "last_step",
                        "step_time_s", "throughput", "changed") if c in segs]
    log("segments:\n" + segs[cols].to_string())
    steps = s.steps()
    keep = [c for c in steps.columns if c.startswith(("timing_s/", "perf/", "workbench/", "critic/vf_loss", "critic/perf",
                                                       "actor/perf", "response_length/mean")) or c in ("segment_id", "step", "t")]
    steps[keep].to_csv(OUT / "steps.csv", index=False)
    log("events:\n" + s.events()[["t", "kind", "text"]].to_string())


def pack_recording():
    path = Path((OUT / "session_path.txt").read_text()) if (OUT / "session_path.txt").exists() else None
    if path is None:
        return
    # A recording is the session's store alone (no operator token file, checkpoints or logs), scrubbed of the
    # operator's credentials and of any credential value (workbench/redact.py).
    import sqlite3
    import tempfile

    from workbench.redact import scrub_store
    from workbench.store import STORE_FILE

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / path.name
        copy.mkdir()
        source, target = sqlite3.connect(path / STORE_FILE), sqlite3.connect(copy / STORE_FILE)
        source.backup(target)
        source.close(), target.close()
        scrub_store(copy)
        with tarfile.open(OUT / "recording.tar.gz", "w:gz") as tar:
            tar.add(copy, arcname=path.name)
    log(f"recording packed: {(OUT / 'recording.tar.gz').stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    make_assets()
    selftest()
    matmul_sampled()
    live_session()
    pack_recording()
    log("DONE")
