"""The sampler over a replayed real recording into a real store, and process → role attribution on real processes."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.polling import wait_until
from tests.telemetry_traces import QUICKSTART, TUNED
from workbench.store import Store
from workbench.telemetry.nvml import TraceReader
from workbench.telemetry.roles import UNKNOWN_ROLE, RoleAttributor, WorkersTable, classify_title
from workbench.telemetry.sampling import Sampler


class CountingStore(Store):
    """A real store that counts the writes that carry samples (each is one transaction)."""

    sample_writes = 0

    def add_samples(self, rows):
        rows = list(rows)
        self.sample_writes += bool(rows)
        super().add_samples(rows)


class RecordingWithProcesses(TraceReader):
    """A replayed recording plus a given GPU process list (recordings hold no PIDs)."""

    def __init__(self, traces, processes):
        super().__init__(traces, speed=20.0, start_s=200.0)
        self._processes = processes

    def processes(self):
        return self._processes


def _wait_for(predicate, timeout=10.0):
    wait_until(predicate, timeout, every=0.05, what="timed out")


def test_sampler_writes_batches_at_the_asked_rate(tmp_path):
    store = CountingStore(tmp_path)
    reader = TraceReader({0: QUICKSTART, 1: TUNED}, speed=20.0, start_s=200.0)
    sampler = Sampler(store, reader, hz=50.0, node="node-a", flush_every_s=0.25).start()
    time.sleep(1.0)
    sampler.stop()

    stats = sampler.stats()
    samples = store.frame("samples")
    assert len(samples) == 2 * stats["samples"]
    assert 35 <= stats["samples"] <= 60, stats
    assert stats["achieved_hz"] == pytest.approx(50.0, rel=0.3)
    # One transaction per flush (~4 a second here), not one per sample.
    assert store.sample_writes <= 8 and store.sample_writes == stats["flushes"]
    assert set(samples["node"]) == {"node-a"} and set(samples["gpu"]) == {0, 1}
    assert samples["util"].notna().all() and samples["sm_active"].notna().all()
    # The recordings hold no tensor/DRAM activity (GPM metrics the recorder didn't ask for): NaN, stored as NULL.
    assert samples["tensor_active"].isna().all() and samples["dram_active"].isna().all()
    assert 0 < sampler.cpu_seconds() < 1.0
    assert stats["mean_loop_s"] < 0.02


def test_each_nan_reason_is_recorded_once(tmp_path):
    store = Store(tmp_path)
    sampler = Sampler(store, TraceReader({0: QUICKSTART, 1: TUNED}), hz=50.0, flush_every_s=0.1).start()
    time.sleep(0.6)
    sampler.stop()
    events = store.frame("events")
    assert set(events["kind"]) == {"telemetry"}
    keys = [(e["gpu"], e["metric"]) for e in events["data"]]
    assert len(keys) == len(set(keys)) == 2 * 7  # 7 unrecorded metrics on each GPU, each said once
    assert "GPU 1: nvlink_tx not recorded in B_nvml.csv" in set(events["text"])


def test_pause_stops_sampling_and_resume_restarts_it(tmp_path):
    store = Store(tmp_path)
    sampler = Sampler(store, TraceReader({0: QUICKSTART}), hz=50.0, flush_every_s=0.1).start()
    _wait_for(lambda: store.max_id("samples") > 5)
    sampler.pause()
    # A sample in flight may still land (the pause flushes it); then the count holds still.
    paused_at = store.max_id("samples")
    for _ in range(20):
        time.sleep(0.3)
        if store.max_id("samples") == paused_at:
            break
        paused_at = store.max_id("samples")
    time.sleep(0.4)
    assert store.max_id("samples") == paused_at
    sampler.resume()
    _wait_for(lambda: store.max_id("samples") > paused_at + 5)
    sampler.stop()


# ---------------------------------------------------------------------------------------------------------- roles


@pytest.mark.parametrize(
    "title, role",
    [
        ("ray::ActorRolloutRefWorker.generate_sequences", "actor_rollout_ref"),
        ("ray::ActorRolloutRefWorker", "actor_rollout_ref"),
        ("ray::AsyncActorRolloutRefWorker.wake_up", "actor_rollout_ref"),
        ("ray::TrainingWorker.train_mini_batch", "critic"),
        ("VLLM::EngineCore_DP0", "rollout"),
        ("ray::vLLMHttpServer.generate", "rollout"),
        ("ray::SGLangHttpServer.launch_server", "rollout"),
        ("ray::RewardLoopWorker.compute_score", "reward"),
        ("ray::RewardComputeWorker", "reward"),
        ("ray::WorkerDict.actor_rollout_compute_log_prob", None),  # several roles in one process: the runner knows which
        ("ray::IDLE", None),
        ("ray::TaskRunner.run", None),
        ("python3 -m verl.trainer.main_ppo", None),
        ("", None),
    ],
)
def test_title_classification(title, role):
    assert classify_title(title) == role


@pytest.fixture
def child_of_this_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield child
    child.kill()
    child.wait()


@pytest.mark.slow
def test_child_of_a_registered_worker_takes_its_role(tmp_path, child_of_this_process):
    store = Store(tmp_path)
    node = socket.gethostname()
    store.add_worker(os.getpid(), "actor", node)
    store.add_worker(999_999_999, "critic", "another-node")  # other nodes' PIDs mean nothing here
    roles = RoleAttributor(WorkersTable(store, node))
    assert roles.role_of(child_of_this_process.pid) == "actor"
    assert roles.role_of(os.getpid()) == "actor"
    assert RoleAttributor(WorkersTable(store, "another-node")).role_of(child_of_this_process.pid) == UNKNOWN_ROLE


@pytest.fixture
def titled_parent_with_child():
    """Starts a real process with a given title (as Ray and vLLM set them) and a child under it; yields the child."""
    started = []

    def start(title: str) -> psutil.Process:
        parent = subprocess.Popen(["bash", "-c", f'exec -a "{title}" bash -c "sleep 60 & wait"'])
        started.append(parent)
        _wait_for(lambda: psutil.Process(parent.pid).children())
        return psutil.Process(parent.pid).children()[0]

    yield start
    for parent in started:
        for process in psutil.Process(parent.pid).children(recursive=True):
            process.kill()
        parent.kill()
        parent.wait()


@pytest.mark.slow
def test_unregistered_process_is_classified_by_its_ancestors_title(titled_parent_with_child):
    gpu_process = titled_parent_with_child("ray::TrainingWorker.train_mini_batch")
    roles = RoleAttributor(lambda: {})
    assert roles.role_of(gpu_process.pid) == "critic"
    assert roles.role_of(os.getpid()) == UNKNOWN_ROLE
    assert roles.role_of(2**22 + 12345) == UNKNOWN_ROLE  # gone (or in another PID namespace)


@pytest.mark.slow
def test_the_walk_stops_at_the_raylet(titled_parent_with_child):
    # A Ray worker nobody registered sits under the raylet, which sits under the (registered) driver in a
    # one-machine run; the driver's role must not leak down to it.
    worker_under_raylet = titled_parent_with_child("/opt/ray/core/src/ray/raylet/raylet --node_ip_address=127.0.0.1")
    roles = RoleAttributor(lambda: {os.getpid(): "driver"})
    assert roles.role_of(worker_under_raylet.pid) == UNKNOWN_ROLE


@pytest.mark.slow
def test_sampler_writes_attributed_processes_about_once_a_second(tmp_path, child_of_this_process):
    store = Store(tmp_path)
    node = socket.gethostname()
    store.add_worker(os.getpid(), "actor", node)
    reader = RecordingWithProcesses(
        {0: QUICKSTART, 1: TUNED},
        [{"gpu": 0, "pid": child_of_this_process.pid, "mem_used": 1514.0}, {"gpu": 1, "pid": 2**22 + 12345, "mem_used": math.nan}],
    )
    sampler = Sampler(store, reader, hz=20.0, flush_every_s=0.2, procs_every_s=0.5).start()
    time.sleep(1.3)
    sampler.stop()
    procs = store.frame("procs")
    samples_taken = sampler.stats()["samples"]
    rounds = len(procs) // 2
    assert 2 <= rounds <= 4 and samples_taken >= 20  # procs every 0.5 s, samples at 20 Hz
    mine = procs[procs["pid"] == child_of_this_process.pid]
    assert set(mine["role"]) == {"actor"} and set(mine["gpu"]) == {0} and set(mine["node"]) == {node}
    assert set(procs[procs["gpu"] == 1]["role"]) == {UNKNOWN_ROLE}
