"""One Ray cluster per session, kept across its segments (single-node plans; WORKBENCH_RAY_CLUSTER=0 turns it off).

Every segment of a session is its own verl process (verl's `run_ppo` never shuts Ray down; ending the process tree
is what frees the GPUs), and `ray.init()` in each one starts a fresh local Ray head: GCS, raylet, dashboard, log
and autoscaler monitors — 2.5–3.8 s from Ray's first log line to "Started a local Ray instance" on the H200
(bench/results/h200_2026-11-30/startup_phases.json), more on a loaded host. The supervisor can instead start one
head with the plan's GPUs when the session's first run launches, hand every run `RAY_ADDRESS` (verl's `ray.init()`
then connects instead of starting one), and after each run end what that run left in the cluster: the run's actors
die with their driver, but every worker process of the cluster (`ray::…`) and everything under it (vLLM's engine
core) is ended here, and so is any process of the cluster still holding a GPU; the head itself (no GPU memory)
stays. A different GPU set, a multi-node plan or an outside `RAY_ADDRESS` gets no session cluster.

Ray's daemons detach from whoever starts them, so a supervisor killed with SIGKILL would leave the head behind (the
runner's die-with-supervisor guard does not reach it): a watchdog process started with the head
(`python -m workbench.ray_cluster --watch PID --temp-dir DIR`) ends every process of the cluster within a second of
the supervisor's death, and itself when the cluster was stopped. Where the head can't be started, the run starts
Ray itself as before (`failure` says why). It saves Ray's start-up on every relaunch (2.5–3.8 s on the H200, more on
a loaded host).

The supervisor's hook (workbench/supervisor.py):

    self.ray = SessionRayCluster(session_dir)             # Supervisor.__init__
    LiveRun(..., ray=self.ray)                            # Supervisor._live_run; LiveRun adds env_for(plan) to the
                                                          # run's environment and calls end_run_processes() in kill()
    self.ray.stop()                                       # Supervisor.loop's finally
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from .procs import end

ENABLE_ENV = "WORKBENCH_RAY_CLUSTER"
START_TIMEOUT_S = 180.0


def enabled(plan: Any = None) -> bool:
    """Whether a session cluster applies: not switched off, no outside cluster, one node."""
    if os.environ.get(ENABLE_ENV, "1") == "0" or os.environ.get("RAY_ADDRESS"):
        return False
    nnodes = getattr(getattr(getattr(plan, "config", None), "trainer", None), "nnodes", 1) if plan is not None else 1
    return int(nnodes or 1) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SessionRayCluster:
    def __init__(self, session_dir: str | os.PathLike):
        self.session_dir = Path(session_dir)
        # Ray's socket paths live under the temp dir and must stay short (AF_UNIX: 107 bytes): not the session dir.
        tag = hashlib.sha1(str(self.session_dir.resolve()).encode()).hexdigest()[:10]
        self.temp_dir = Path(tempfile.gettempdir()) / f"wb-ray-{tag}"
        self.address: str | None = None
        self.gpus: list[int] | None = None
        self.log_path = self.session_dir / "logs" / "ray-cluster.log"
        self.failure: str | None = None  # why the last start failed (the run then starts Ray itself)

    # ----------------------------------------------------------------- life cycle
    def env_for(self, plan: Any) -> dict[str, str]:
        """The environment a run of `plan` needs to join the session cluster (started or restarted as needed);
        {} where no session cluster applies."""
        if not enabled(plan):
            return {}
        gpus = list(plan.workbench["gpus"])
        if self.address and (self.gpus != gpus or not self.alive()):
            self.stop()
        if not self.address:
            try:
                self.start(gpus)
            except (RuntimeError, OSError, subprocess.SubprocessError) as error:
                self.failure = str(error)
                return {}
        self.failure = None
        return {"RAY_ADDRESS": self.address}

    def start(self, gpus: list[int], attempts: int = 2) -> str:
        """`ray start --head` with these GPUs. Ray gives its raylet a fixed 30 s to register, which a loaded host
        can miss: one more attempt then."""
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            port = _free_port()
            with open(self.log_path, "ab") as log:
                proc = subprocess.run(
                    [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={port}",
                     f"--num-gpus={len(gpus)}", f"--temp-dir={self.temp_dir}", "--include-dashboard=false",
                     "--disable-usage-stats"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, timeout=START_TIMEOUT_S,
                    start_new_session=True,
                )
            if proc.returncode == 0:
                self.address, self.gpus = f"127.0.0.1:{port}", list(gpus)
                self._start_watchdog()
                return self.address
            end(self.processes())  # what the failed attempt left
        raise RuntimeError(f"ray start --head failed {attempts} times (exit {proc.returncode}): see {self.log_path}")

    def _start_watchdog(self) -> None:
        """The process that ends the cluster if this (the supervisor's) process dies; its command line names the
        temp dir, so `stop()` ends it with the rest."""
        with open(self.log_path, "ab") as log:
            subprocess.Popen(
                [sys.executable, "-m", "workbench.ray_cluster", "--watch", str(os.getpid()),
                 "--temp-dir", str(self.temp_dir)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def alive(self) -> bool:
        return any("gcs_server" in " ".join(_cmdline(p)) for p in self.processes())

    def stop(self) -> None:
        """End every process of the cluster (head included) and remove its temp dir."""
        if self.address is None:
            return
        end(self.processes())
        self.address = self.gpus = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    # ----------------------------------------------------------------- after a run
    def end_run_processes(self, grace_s: float = 15.0) -> list[int]:
        """End what a finished run left in the cluster: its worker processes (`ray::…`) with everything under them
        (after `grace_s` for Ray to end them itself), and any process of the cluster that still holds a GPU.
        Returns the pids that had to be ended."""
        if self.address is None:
            return []
        deadline = time.time() + grace_s
        while True:
            left = self.run_processes() | self.gpu_processes()
            if not left or time.time() >= deadline:
                break
            time.sleep(0.5)
        return end(left)

    def processes(self) -> set[psutil.Process]:
        """Every process of this cluster: its own (their command line names its temp dir) and all under them."""
        return cluster_processes(self.temp_dir)

    def run_processes(self) -> set[psutil.Process]:
        """The cluster's worker processes (Ray renames them `ray::<actor or task>`) and their children."""
        out: set[psutil.Process] = set()
        for p in self.processes():
            try:
                if " ".join(p.cmdline()).startswith("ray::"):
                    out.add(p)
                    out.update(p.children(recursive=True))
            except psutil.Error:
                continue
        return out

    def gpu_processes(self) -> set[psutil.Process]:
        """Processes of the cluster that hold memory on any GPU (NVML); none without a driver."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:
            return set()
        try:
            pids = set()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        finally:
            pynvml.nvmlShutdown()
        return {p for p in self.processes() if p.pid in pids}


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


# ---------------------------------------------------------------------------------------------------- watchdog
WATCH_POLL_S = 0.5


def cluster_processes(temp_dir: str | os.PathLike) -> set[psutil.Process]:
    """Every process whose command line names the cluster's temp dir, and all under them (not this one)."""
    mark, me = str(temp_dir), os.getpid()
    out: set[psutil.Process] = set()
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != me and any(mark in arg for arg in (p.info["cmdline"] or [])):
            out.add(p)
            try:
                out.update(c for c in p.children(recursive=True) if c.pid != me)
            except psutil.Error:
                continue
    return out


def watch(supervisor_pid: int, temp_dir: str | os.PathLike, poll_s: float = WATCH_POLL_S) -> str:
    """Wait until the supervisor is gone (then end the cluster) or the cluster is (then just leave); returns which."""
    try:
        supervisor = psutil.Process(supervisor_pid)
    except psutil.NoSuchProcess:
        supervisor = None
    while True:
        gone = supervisor is None or not supervisor.is_running() or supervisor.status() == psutil.STATUS_ZOMBIE
        if gone:
            end(cluster_processes(temp_dir))
            shutil.rmtree(temp_dir, ignore_errors=True)
            return "the supervisor is gone: cluster ended"
        if not cluster_processes(temp_dir):
            return "the cluster was stopped"
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m workbench.ray_cluster", description=watch.__doc__)
    parser.add_argument("--watch", type=int, required=True, help="the supervisor's pid")
    parser.add_argument("--temp-dir", required=True, help="the cluster's Ray temp dir (marks its processes)")
    args = parser.parse_args(argv)
    print(f"ray_cluster watchdog: {watch(args.watch, args.temp_dir)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
