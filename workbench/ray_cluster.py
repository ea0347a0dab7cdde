"""One Ray cluster per session, kept across its segments (single-node plans; WORKBENCH_RAY_CLUSTER=0 turns it off).

Every segment of a session is its own verl process (verl's `run_ppo` never shuts Ray down; ending the process tree
is what frees the GPUs), and `ray.init()` in each one starts a fresh local Ray head: GCS, raylet, dashboard, log
and autoscaler monitors — 2.5–3.8 s from Ray's first log line to "Started a local Ray instance" on the H200
(bench/results/h200_2026-11-30/startup_phases.json), more on a loaded host. The supervisor can instead start one
head with the plan's GPUs when the session's first run launches, hand every run `RAY_ADDRESS` (verl's `ray.init()`
then connects instead of starting one), and after each run end what that run left in the cluster: the run's actors
die with their driver, but every worker process of the cluster (`ray::…`) and everything under it (vLLM's engine
core) is ended here, and so is any process of the cluster still holding a GPU; the head itself (no GPU memory)
stays, and so do its raylet's two agents, which Ray titles like workers (`ray::DashboardAgent`,
`ray::RuntimeEnvAgent`) but which the raylet can't outlive. Before every launch the supervisor checks the cluster's
GCS and raylet processes and starts a cluster afresh where one is gone (or, where that fails, leaves Ray to the run);
the run itself, just before verl's ray.init, asks the GCS for an alive node and starts Ray itself where there is
none (join_or_own_ray); each is said in an event. A different GPU set, a multi-node plan or an outside
`RAY_ADDRESS` gets no session cluster.

Ray's daemons detach from whoever starts them, so a supervisor killed with SIGKILL would leave the head behind (the
runner's die-with-supervisor guard does not reach it): a watchdog process started with the head
(`python -m workbench.ray_cluster --watch PID --temp-dir DIR --gcs-port PORT`) ends every process of the cluster
within a second of the supervisor's death, and itself when the cluster was stopped. A cluster's processes are those
whose command line names its temp dir, and Ray's client server, which names only the GCS address it proxies
(`--address=HOST:PORT`); the client server gets a free port of its own, not Ray's fixed 10001, so that a session's
restarted cluster (or another session's) never finds it taken. Where the head can't be started, the run starts
Ray itself as before (`failure` says why). The head and its runs authenticate with a token of the cluster's own
(auth_env: Ray 2.60 turns a head's token mode on by itself where ~/.ray/auth_token exists, never a joining driver's). It saves Ray's start-up on every relaunch (2.5–3.8 s on the H200, more on
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
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, MutableMapping

import psutil

from .procs import end

ENABLE_ENV = "WORKBENCH_RAY_CLUSTER"
START_TIMEOUT_S = 180.0
SESSION_ADDRESS_ENV = "WORKBENCH_SESSION_RAY_ADDRESS"  # beside RAY_ADDRESS: that address is the session cluster's
AUTH_MODE_ENV, AUTH_TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH"  # Ray's (ray/_private/authentication)
GCS_ANSWER_S = 20.0  # a GCS that takes longer to list its nodes can't serve a run either
# The raylet's agents retitle themselves as Ray's workers do (ray._private.ray_constants.AGENT_PROCESS_LIST), and the
# raylet exits the moment one of them dies (fate sharing: "The raylet exited immediately because one Ray agent
# failed"). Ending them as a run's leftovers took the head's raylet with them on the H200 (lease 2, 2026-12-01): the
# GCS stayed up with no alive node, and every relaunch's ray.init failed ("No node info found matching attributes").
RAYLET_AGENT_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")
# The raylet's pool of idle workers (`ray::IDLE`, `ray::IDLE_SpillWorker`, ...: ray_constants.WORKER_PROCESS_TYPE_*)
# outlives every run and is Ray's to keep; waiting for it to leave made end_run_processes take its whole grace
# (15 s) before every relaunch. One that holds GPU memory is ended all the same (gpu_processes).
IDLE_WORKER_TITLE = "ray::IDLE"


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
        self.gcs_port: int | None = None  # marks Ray's client server, the one process not naming the temp dir
        self.gpus: list[int] | None = None
        self.log_path = self.session_dir / "logs" / "ray-cluster.log"
        self.failure: str | None = None  # why the last start failed (the run then starts Ray itself)
        self.notices: list[str] = []  # what the last env_for did besides handing out the address, in words

    # ----------------------------------------------------------------- life cycle
    def env_for(self, plan: Any) -> dict[str, str]:
        """The environment a run of `plan` needs to join the session cluster (started or restarted as needed);
        {} where no session cluster applies."""
        self.failure, self.notices = None, []
        if not enabled(plan):
            return {}
        gpus = list(plan.workbench["gpus"])
        unhealthy = None
        if self.address and self.gpus != gpus:
            self.stop()
        elif self.address:
            unhealthy = self.health_problem()
            if unhealthy:
                self.stop()
        if not self.address:
            try:
                self.start(gpus)
            except (RuntimeError, OSError, subprocess.SubprocessError) as error:
                self.failure = str(error)
                self.notices.append(
                    f"the session Ray cluster was unhealthy ({unhealthy}) and a fresh one could not start: verl starts "
                    f"Ray itself: {error}" if unhealthy else f"no session Ray cluster, verl starts Ray itself: {error}")
                return {}
            if unhealthy:
                self.notices.append(f"the session Ray cluster was unhealthy ({unhealthy}): a fresh one was started for "
                                    "this run")
        return {"RAY_ADDRESS": self.address, SESSION_ADDRESS_ENV: self.address, **self.auth_env()}

    def auth_env(self) -> dict[str, str]:
        """How the head and every run authenticate: Ray 2.60's `ray start --head` turns token authentication on
        wherever ~/.ray/auth_token exists (any local ray.init() writes one), while a driver joining by RAY_ADDRESS
        never does, and failed with "InvalidAuthToken". So both are told: token mode with the cluster's own token.
        An auth mode set in the environment is the user's, left to both."""
        if os.environ.get(AUTH_MODE_ENV) is not None:
            return {}
        return {AUTH_MODE_ENV: "token", AUTH_TOKEN_PATH_ENV: str(self.temp_dir / "auth_token")}

    def _write_token(self) -> None:
        """A fresh token for this head, readable by this user alone."""
        path = self.auth_env().get(AUTH_TOKEN_PATH_ENV)
        if path is None:
            return
        self.temp_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.temp_dir.chmod(0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))  # as ray's generate_new_authentication_token

    def start(self, gpus: list[int], attempts: int = 2) -> str:
        """`ray start --head` with these GPUs. Ray gives its raylet a fixed 30 s to register, which a loaded host
        can miss: one more attempt then."""
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus)), "RAY_USAGE_STATS_ENABLED": "0",
               **self.auth_env()}
        env.pop("RAY_ADDRESS", None)
        self._write_token()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, attempts + 1):
            self.gcs_port, client_port = _free_port(), _free_port()
            with open(self.log_path, "ab") as log:
                proc = subprocess.run(
                    [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", f"--port={self.gcs_port}",
                     f"--ray-client-server-port={client_port}", f"--num-gpus={len(gpus)}",
                     f"--temp-dir={self.temp_dir}", "--include-dashboard=false", "--disable-usage-stats"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, timeout=START_TIMEOUT_S,
                    start_new_session=True,
                )
            if proc.returncode == 0:
                self.address, self.gpus = f"127.0.0.1:{self.gcs_port}", list(gpus)
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
                 "--temp-dir", str(self.temp_dir), "--gcs-port", str(self.gcs_port)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )

    def health_problem(self) -> str | None:
        """Why the running cluster can't take a run as far as its processes tell (its GCS or its raylet gone), or
        None. The GCS's own word (an alive node) is asked by the run, just before verl's ray.init (join_or_own_ray):
        it has Ray imported already, where here it would cost a process importing Ray (1-10 s) per launch."""
        programs = {Path(_cmdline(p)[0]).name for p in self.processes() if _cmdline(p)}
        for daemon in ("gcs_server", "raylet"):
            if daemon not in programs:
                return f"its {daemon} is gone"
        return None

    def stop(self) -> None:
        """End every process of the cluster (head included) and remove its temp dir."""
        if self.address is None:
            return
        end(self.processes())
        self.address = self.gpus = self.gcs_port = None
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
        return cluster_processes(self.temp_dir, self.gcs_port)

    def run_processes(self) -> set[psutil.Process]:
        """The cluster's busy worker processes (Ray renames them `ray::<actor or task>`) and their children; never
        the raylet's agents or its idle workers."""
        out: set[psutil.Process] = set()
        for p in self.processes():
            try:
                title = " ".join(p.cmdline())
                if title.startswith("ray::") and not title.startswith((*RAYLET_AGENT_TITLES, IDLE_WORKER_TITLE)):
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


def cluster_processes(temp_dir: str | os.PathLike, gcs_port: int | None = None) -> set[psutil.Process]:
    """Every process whose command line names the cluster's temp dir or, Ray's client server, its GCS address
    (`--address=HOST:PORT`), and all under them (not this one)."""
    mark, me = str(temp_dir), os.getpid()
    proxied = f":{gcs_port}" if gcs_port else None

    def ours(args: list[str]) -> bool:
        return any(mark in arg or (proxied and arg.startswith("--address=") and arg.endswith(proxied))
                   for arg in args)

    out: set[psutil.Process] = set()
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != me and ours(p.info["cmdline"] or []):
            out.add(p)
            try:
                out.update(c for c in p.children(recursive=True) if c.pid != me)
            except psutil.Error:
                continue
    return out


def watch(supervisor_pid: int, temp_dir: str | os.PathLike, gcs_port: int | None = None,
          poll_s: float = WATCH_POLL_S) -> str:
    """Wait until the supervisor is gone (then end the cluster) or the cluster is (then just leave); returns which."""
    try:
        supervisor = psutil.Process(supervisor_pid)
    except psutil.NoSuchProcess:
        supervisor = None
    while True:
        gone = supervisor is None or not supervisor.is_running() or supervisor.status() == psutil.STATUS_ZOMBIE
        if gone:
            end(cluster_processes(temp_dir, gcs_port))
            shutil.rmtree(temp_dir, ignore_errors=True)
            return "the supervisor is gone: cluster ended"
        if not cluster_processes(temp_dir, gcs_port):
            return "the cluster was stopped"
        time.sleep(poll_s)


# ---------------------------------------------------------------------------------------------------- in the run
def gcs_problem(address: str) -> str | None:
    """Why a driver can't join the cluster at `address` (its GCS port closed, no answer, no alive node in its GCS:
    what verl's ray.init failed on, "No node info found matching attributes"), or None. Imports Ray."""
    host, port = address.rsplit(":", 1)
    try:  # first, since Ray's client waits 40 s for a GCS that isn't there
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as error:
        return f"its GCS at {address} does not answer: {error}"
    from ray._raylet import GcsClient
    from ray.core.generated.gcs_pb2 import GcsNodeInfo

    try:
        nodes = GcsClient(address=address).get_all_node_info(timeout=GCS_ANSWER_S,
                                                              state_filter=GcsNodeInfo.GcsNodeState.ALIVE)
    except Exception as error:  # Ray's RpcError and kin: the GCS could not say
        return f"its GCS at {address} did not list its nodes: {error}"
    return None if nodes else f"its GCS at {address} lists no alive node"


def join_or_own_ray(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """In a run, before verl's ray.init: where RAY_ADDRESS is the session cluster's and the cluster can't take a
    driver, drop it, so that verl starts Ray itself and a broken cluster never fails a restart or a rollback.
    Returns what to tell the user, or None (an outside cluster, RAY_ADDRESS of the user's own, is never dropped)."""
    address = environ.get(SESSION_ADDRESS_ENV)
    if not address or environ.get("RAY_ADDRESS") != address:
        return None
    problem = gcs_problem(address)
    if problem is None:
        return None
    del environ["RAY_ADDRESS"]
    token = environ.get(AUTH_TOKEN_PATH_ENV)
    if token and not os.path.exists(token):  # it went with the cluster's temp dir: Ray's own ray.init makes one
        del environ[AUTH_TOKEN_PATH_ENV]
    return f"the session Ray cluster can't take this run ({problem}): it starts Ray itself"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m workbench.ray_cluster", description=watch.__doc__)
    parser.add_argument("--watch", type=int, required=True, help="the supervisor's pid")
    parser.add_argument("--temp-dir", required=True, help="the cluster's Ray temp dir (marks its processes)")
    parser.add_argument("--gcs-port", type=int, help="its GCS port (marks Ray's client server)")
    args = parser.parse_args(argv)
    print(f"ray_cluster watchdog: {watch(args.watch, args.temp_dir, args.gcs_port)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
