"""Supervisor pieces that need no run: ending a process tree, reading a crash, what a restart can't carry over."""

import subprocess
import sys
import time

import psutil
import pytest

from workbench.procs import end_child, end_process_session, kill_tree, process_alive, session_members
from workbench.runs import looks_like_oom, traceback_tail

# A session leader that leaves an orphan behind (re-parented to init), like a crashed Ray driver leaves its workers.
ORPHAN_MAKER = """
import subprocess, sys, time
orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
print(orphan.pid, flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_kill_tree_ends_children_and_reparented_orphans():
    leader = subprocess.Popen([sys.executable, "-c", ORPHAN_MAKER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    orphan_pid = int(leader.stdout.readline())
    assert psutil.pid_exists(orphan_pid)
    kill_tree(leader.pid, grace_s=5)
    leader.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline and psutil.pid_exists(orphan_pid):
        try:
            if psutil.Process(orphan_pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    gone = not psutil.pid_exists(orphan_pid) or psutil.Process(orphan_pid).status() == psutil.STATUS_ZOMBIE
    assert gone


@pytest.mark.slow
def test_kill_tree_of_a_finished_process_is_harmless():
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    done.wait()
    kill_tree(done.pid, grace_s=1)


def test_traceback_tail_starts_at_the_last_traceback(tmp_path):
    log = tmp_path / "segment-1.log"
    log.write_text(
        "step 1\nTraceback (most recent call last):\n  old\nValueError: first\nstep 2\n"
        "Traceback (most recent call last):\n  File \"x.py\"\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 80 GiB\n"
    )
    tail = traceback_tail(log)
    assert tail.startswith("Traceback") and "first" not in tail
    assert looks_like_oom(tail)
    assert not looks_like_oom("ValueError: batch size")
    assert traceback_tail(tmp_path / "missing.log") == ""


def test_commands_are_signed_and_a_copied_signature_is_refused():
    from workbench.control import SignatureCheck, signed

    token = "operator-secret"
    check = SignatureCheck(token)
    payload = signed(token, "pause", {})
    assert token not in str(payload)
    assert check.verify("pause", dict(payload))
    assert not check.verify("pause", dict(payload)), "a signature must not work twice"
    assert not check.verify("stop", dict(signed(token, "pause", {}))), "signed for another kind"
    assert not check.verify("pause", dict(signed("a viewer's guess", "pause", {})))
    tampered = signed(token, "apply", {"changes": {"actor_token_budget": 8192}})
    tampered["changes"] = {"actor_token_budget": 10**9}
    assert not check.verify("apply", tampered)
    assert not check.verify("pause", {})


def test_restart_environment_says_what_a_relaunch_cannot_carry_over(tmp_path):
    from workbench.plan import Plan
    from workbench.control import ACTOR_HF_ENV, SKIP_CRITIC_RESUME_ENV, STEP_OFFSET_ENV
    from workbench.runs import restart_environment

    base = Plan.from_verl(["trainer.n_gpus_per_node=2"]).with_changes({"gpus": [0, 1]})
    same_shape = base.with_changes({"trainer_mode": "colocate_async"})
    assert restart_environment(base, same_shape, tmp_path, 12) == ({}, [])

    lora = base.with_changes({"critic_lora_rank": 8})
    env, losses = restart_environment(base, lora, tmp_path, 12)
    assert env == {SKIP_CRITIC_RESUME_ENV: "1"}
    assert "LoRA rank 0 → 8" in losses[0] and "actor, data position and step count are resumed" in losses[0]

    critic_alone = base.with_changes({"critic_gpus": 1})  # the actor goes from 2 GPUs to 1
    env, losses = restart_environment(base, critic_alone, tmp_path, 12)
    assert env[ACTOR_HF_ENV] == str(tmp_path / "checkpoints" / "global_step_12" / "actor" / "huggingface")
    assert env[STEP_OFFSET_ENV] == "12" and env[SKIP_CRITIC_RESUME_ENV] == "1"
    assert "optimizer state, critic state, data position" in losses[-1]


@pytest.mark.slow
def test_a_child_that_ignores_sigterm_is_killed_and_reaped():
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; "
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(300)"],
                                stdout=subprocess.PIPE, text=True)
    stubborn.stdout.readline()  # SIGTERM is ignored from here on
    started = time.time()
    end_child(stubborn, grace_s=0.5)
    assert stubborn.returncode is not None and time.time() - started < 10
    assert not process_alive(stubborn.pid)


@pytest.mark.slow
def test_ending_a_process_session_leaves_other_sessions_alone():
    leader = subprocess.Popen([sys.executable, "-c", ORPHAN_MAKER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    orphan_pid = int(leader.stdout.readline())
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    try:
        assert {p.pid for p in session_members(leader.pid)} == {leader.pid, orphan_pid}
        assert set(end_process_session(leader.pid, grace_s=5)) == {leader.pid, orphan_pid}
        leader.wait(timeout=10)
        assert process_alive(bystander.pid)
        assert not [p for p in session_members(leader.pid) if process_alive(p.pid)]  # a zombie has ended too
    finally:
        end_child(bystander, grace_s=1)
