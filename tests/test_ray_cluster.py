"""The per-session Ray cluster (workbench/ray_cluster.py): which plans get one, what a finished run leaves in it, its
health before each launch, the watchdog. The slow tests start real Ray heads on the CPU (or stand-in processes)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from tests.plan_fixtures import runnable_plan, tiny_model  # noqa: F401 (fixtures)
from workbench import ray_cluster
from workbench.ray_cluster import SessionRayCluster


def one_node_plan(gpus=(0,)):
    return SimpleNamespace(config=SimpleNamespace(trainer=SimpleNamespace(nnodes=1)), workbench={"gpus": list(gpus)})


def test_session_ray_cluster_applies_to_single_node_plans_only(monkeypatch):
    one_node = one_node_plan()
    two_nodes = SimpleNamespace(config=SimpleNamespace(trainer=SimpleNamespace(nnodes=2)), workbench={"gpus": [0]})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(ray_cluster.ENABLE_ENV, raising=False)
    assert ray_cluster.enabled(one_node) and not ray_cluster.enabled(two_nodes)  # on unless switched off
    monkeypatch.setenv(ray_cluster.ENABLE_ENV, "0")
    assert not ray_cluster.enabled(one_node)
    assert SessionRayCluster("/tmp/x").env_for(one_node) == {}
    assert SessionRayCluster("/tmp/x").end_run_processes() == []  # no cluster: nothing to do
    monkeypatch.setenv(ray_cluster.ENABLE_ENV, "1")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # the user's own cluster: theirs to manage
    assert not ray_cluster.enabled(one_node)


def test_a_session_cluster_that_cannot_start_leaves_ray_to_the_run(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = SessionRayCluster(tmp_path)

    def refuse(gpus, attempts=2):
        raise RuntimeError("ray start --head failed 2 times (exit 1): see ray-cluster.log")

    monkeypatch.setattr(cluster, "start", refuse)
    assert cluster.env_for(one_node_plan()) == {} and "ray start --head failed" in cluster.failure
    assert cluster.notices == ["no session Ray cluster, verl starts Ray itself: ray start --head failed 2 times "
                               "(exit 1): see ray-cluster.log"]


def test_an_unhealthy_cluster_is_restarted_before_a_launch_or_left_to_the_run(tmp_path, monkeypatch):
    """Before every launch the supervisor checks the cluster's daemons: a cluster without one is stopped and started
    afresh, and where that fails the run starts Ray itself; either is said."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cluster = SessionRayCluster(tmp_path)
    started, stopped = [], []

    def start(gpus, attempts=2):
        started.append(gpus)
        cluster.address, cluster.gpus = f"127.0.0.1:{6000 + len(started)}", list(gpus)
        return cluster.address

    def stop():
        stopped.append(cluster.address)
        cluster.address = cluster.gpus = None

    monkeypatch.setattr(cluster, "start", start)
    monkeypatch.setattr(cluster, "stop", stop)
    health = {"problem": None}
    monkeypatch.setattr(cluster, "health_problem", lambda: health["problem"])
    plan = one_node_plan()
    first = {"RAY_ADDRESS": "127.0.0.1:6001", ray_cluster.SESSION_ADDRESS_ENV: "127.0.0.1:6001", **cluster.auth_env()}
    assert cluster.env_for(plan) == first and cluster.notices == []
    assert cluster.env_for(plan) == first and not stopped  # healthy: kept

    health["problem"] = "its raylet is gone"
    assert cluster.env_for(plan)["RAY_ADDRESS"] == "127.0.0.1:6002" and stopped == ["127.0.0.1:6001"]
    assert cluster.notices == ["the session Ray cluster was unhealthy (its raylet is gone): a fresh one was started "
                               "for this run"]

    def refuse(gpus, attempts=2):
        raise RuntimeError("ray start --head failed 2 times (exit 1)")

    monkeypatch.setattr(cluster, "start", refuse)
    assert cluster.env_for(plan) == {} and cluster.address is None
    assert cluster.notices == ["the session Ray cluster was unhealthy (its raylet is gone) and a fresh one could not "
                               "start: verl starts Ray itself: ray start --head failed 2 times (exit 1)"]


def test_the_head_and_its_runs_authenticate_with_the_sessions_own_token(tmp_path, monkeypatch):
    """Ray 2.60's `ray start --head` turns token authentication on where ~/.ray/auth_token exists (any earlier local
    ray.init() writes one), but a driver joining by RAY_ADDRESS never turns it on: every run then failed to connect
    ("InvalidAuthToken"). The head is started in token mode with a token of the cluster's own (0600), and each run is
    handed the same mode and token; an auth mode set in the environment is left to both."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    heads = []

    def ray_start(args, env, **kwargs):
        heads.append(env)
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(ray_cluster.subprocess, "run", ray_start)
    cluster = SessionRayCluster(tmp_path)
    monkeypatch.setattr(cluster, "_start_watchdog", lambda: None)
    try:
        env = cluster.env_for(one_node_plan())
        token = Path(env["RAY_AUTH_TOKEN_PATH"])
        assert env["RAY_AUTH_MODE"] == heads[0]["RAY_AUTH_MODE"] == "token"
        assert heads[0]["RAY_AUTH_TOKEN_PATH"] == str(token) and token.parent == cluster.temp_dir
        assert len(token.read_text()) == 64 and token.stat().st_mode & 0o777 == 0o600
        assert cluster.temp_dir.stat().st_mode & 0o777 == 0o700

        cluster.address = None  # a fresh cluster, with the user's own choice in the environment
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        env = cluster.env_for(one_node_plan())
        assert "RAY_AUTH_MODE" not in env and "RAY_AUTH_TOKEN_PATH" not in env
        assert heads[1]["RAY_AUTH_MODE"] == "disabled" and "RAY_AUTH_TOKEN_PATH" not in heads[1]
    finally:
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)


def test_the_supervisor_says_what_happened_to_the_session_cluster_at_a_launch(tmp_path, runnable_plan, monkeypatch):
    from workbench import control as c
    from workbench.store import Store
    from workbench.supervisor import Supervisor

    class StubRun:
        def poll(self):
            return None

        def kill(self):
            pass

    (tmp_path / c.TOKEN_FILE).write_text("token")
    Store(tmp_path).begin_segment(runnable_plan.to_json(), reason="start")
    supervisor = Supervisor(tmp_path, run_factory=lambda segment, plan, env: StubRun())
    supervisor.ray.notices = ["the session Ray cluster was unhealthy (its raylet is gone): a fresh one was started "
                              "for this run"]
    supervisor.launch(runnable_plan, reason="restart-class change")
    supervisor.warmed.wait(timeout=300)  # its warm-up thread (composing verl's config) ends with this test
    said = [e["text"] for e in supervisor.store.rows("events") if e["kind"] == c.EV_RUNTIME]
    assert said == supervisor.ray.notices


def test_a_run_joins_only_a_session_cluster_that_can_take_it(monkeypatch):
    """The run's own check, just before verl's ray.init: an address that is not the session cluster's (the user's
    RAY_ADDRESS) is never touched; the session cluster's is dropped, so that verl starts Ray itself, where its GCS
    does not answer (here: nothing listens on its port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"  # nothing listens once the socket is closed
    assert ray_cluster.join_or_own_ray({}) is None
    users = {"RAY_ADDRESS": closed}
    assert ray_cluster.join_or_own_ray(users) is None and users == {"RAY_ADDRESS": closed}
    environ = {"RAY_ADDRESS": closed, ray_cluster.SESSION_ADDRESS_ENV: closed}
    said = ray_cluster.join_or_own_ray(environ)
    assert "RAY_ADDRESS" not in environ
    assert said.startswith(f"the session Ray cluster can't take this run (its GCS at {closed} does not answer")
    assert said.endswith("it starts Ray itself")
    # The cluster's token went with its temp dir: the run's own Ray makes one where Ray keeps it (token mode stays).
    environ = {"RAY_ADDRESS": closed, ray_cluster.SESSION_ADDRESS_ENV: closed, "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": "/nonexistent/wb-ray-gone/auth_token"}
    assert ray_cluster.join_or_own_ray(environ) and environ == {ray_cluster.SESSION_ADDRESS_ENV: closed,
                                                                "RAY_AUTH_MODE": "token"}


def test_the_raylets_agents_are_named_as_ray_names_them():
    """The agents' and idle workers' process titles are Ray's own constants (checked here, so a Ray upgrade that renames them fails
    this test instead of killing the raylet)."""
    from ray._private import ray_constants

    assert set(ray_cluster.RAYLET_AGENT_TITLES) == set(ray_constants.AGENT_PROCESS_LIST)
    assert ray_cluster.IDLE_WORKER_TITLE == ray_constants.WORKER_PROCESS_TYPE_IDLE_WORKER
    assert ray_constants.WORKER_PROCESS_TYPE_SPILL_WORKER_IDLE.startswith(ray_cluster.IDLE_WORKER_TITLE)


@pytest.mark.slow
def test_the_raylets_own_agents_are_never_a_runs_leftovers(tmp_path):
    """Ray retitles the raylet's two agents `ray::DashboardAgent` and `ray::RuntimeEnvAgent` as it does its workers,
    and the raylet exits the moment one of them dies. Stand-ins: a 'raylet' naming the cluster's temp dir, with both
    agents, an idle worker of its pool and a busy worker (which has a child of its own) under it: a finished run's
    leftovers are the busy worker and its child, which end_run_processes ends; the agents and the idle worker stay."""
    temp_dir = tmp_path / "wb-ray-standin"
    temp_dir.mkdir()
    raylet_code = (
        "import subprocess, time\n"
        "for title in ('ray::DashboardAgent', 'ray::RuntimeEnvAgent', 'ray::IDLE'):\n"
        "    subprocess.Popen(['bash', '-c', f'exec -a {title} sleep 600'])\n"
        "subprocess.Popen(['bash', '-c', 'exec -a ray::WorkerDict bash -c \"sleep 600 & wait\"'])\n"
        "time.sleep(600)\n"
    )
    raylet = subprocess.Popen([sys.executable, "-c", raylet_code, f"--temp-dir={temp_dir}"], start_new_session=True)
    cluster = SessionRayCluster(tmp_path)
    cluster.temp_dir, cluster.address = temp_dir, "127.0.0.1:1"  # a stand-in: nothing listens there
    try:
        deadline = time.time() + 60
        while len(cluster.processes()) < 6 and time.time() < deadline:  # raylet, 2 agents, 2 workers, a child
            time.sleep(0.2)
        titles = lambda procs: sorted(p.cmdline()[0] for p in procs)  # noqa: E731
        ray_own = [p for p in cluster.processes() if p.cmdline()[0] in ("ray::DashboardAgent", "ray::RuntimeEnvAgent",
                                                                          "ray::IDLE")]
        assert len(ray_own) == 3
        leftovers = cluster.run_processes()
        assert titles(leftovers) == ["ray::WorkerDict", "sleep"]
        assert sorted(cluster.end_run_processes(grace_s=0.5)) == sorted(p.pid for p in leftovers)
        assert all(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ray_own)
        assert not cluster.run_processes()
    finally:
        ray_cluster.end(cluster.processes())
        raylet.wait(timeout=30)


def run_on(env: dict[str, str], code: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


def ran_words(run: subprocess.CompletedProcess) -> str:
    """What a run printed, for a failing assertion: its exit code, stdout and the tail of its stderr."""
    return f"exit {run.returncode}; stdout {run.stdout[-1000:]!r}; stderr:\n{run.stderr[-4000:]}"


# A run as verl's: its driver joins the cluster, starts an actor whose process starts one of its own (vLLM's engine
# core), and exits without cleaning up. Prints the child's pid.
FIRST_RUN = (
    "import ray, subprocess, os\n"
    "ray.init()\n"
    "@ray.remote(num_cpus=0)\n"
    "class A:\n"
    "    def go(self):\n"
    "        self.p = subprocess.Popen(['sleep', '600'])\n"
    "        return self.p.pid\n"
    "a = A.remote()\n"
    "print(ray.get(a.go.remote()), flush=True)\n"
    "os._exit(0)\n"
)
# A relaunch: verl's ray.init joins the cluster at RAY_ADDRESS; one remote call proves the node runs work.
RELAUNCH = (
    "import ray\n"
    "ray.init()\n"
    "print('alive nodes', sum(n['Alive'] for n in ray.nodes()), ray.get(ray.remote(lambda: 'ran').remote()))\n"
)


# The run's check before verl's ray.init, until the GCS has noticed a dead raylet (its health checks take seconds).
RUN_CHECK = (
    "import json, os, time\n"
    "from workbench.ray_cluster import join_or_own_ray\n"
    "deadline = time.time() + 120\n"
    "while (said := join_or_own_ray()) is None and time.time() < deadline:\n"
    "    time.sleep(2)\n"
    "print(json.dumps([said, os.environ.get('RAY_ADDRESS')]))\n"
)


@pytest.mark.slow
def test_a_restart_relaunch_joins_the_cluster_the_first_run_left(tmp_path, monkeypatch):
    """The H200 lease-2 sequence on a real Ray head (CPU): start → a run → the run exits → end_run_processes → the
    relaunch's ray.init connects (there it failed with `No node info found matching attributes: ''`: the raylet's
    agents were ended as the run's leftovers and the raylet died with them). Then a raylet that dies anyway: a run
    handed the cluster starts Ray itself, and the supervisor's check before the next launch restarts the cluster,
    which that relaunch joins. A home holding Ray's default token (any earlier local ray.init() writes one; CI's did):
    the head's token mode is then on, and the runs must authenticate all the same."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv(ray_cluster.ENABLE_ENV, "1")
    (tmp_path / "home" / ".ray").mkdir(parents=True)
    (tmp_path / "home" / ".ray" / "auth_token").write_text("0" * 64)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    plan = one_node_plan()
    cluster = SessionRayCluster(tmp_path)
    ports = []
    try:
        env = cluster.env_for(plan)
        assert env["RAY_ADDRESS"].startswith("127.0.0.1:") and cluster.health_problem() is None
        ports.append(cluster.gcs_port)
        client_server = [p for p in cluster.processes() if "ray.util.client.server" in p.cmdline()]
        assert len(client_server) == 1 and "--port=10001" not in client_server[0].cmdline()  # a port of its own
        first = run_on(env, FIRST_RUN)
        assert first.returncode == 0 and first.stdout.strip(), ran_words(first)
        child = int(first.stdout.strip().splitlines()[-1])
        started = time.time()
        cluster.end_run_processes(grace_s=60)
        # Ray ends the run's actors itself; its agents and idle workers stay and are no reason to wait out the grace
        assert time.time() - started < 45
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        assert not cluster.run_processes()
        relaunch = run_on(env, RELAUNCH)  # as the supervisor would hand it out, unchecked: the lease's sequence
        assert relaunch.returncode == 0, ran_words(relaunch)
        assert "alive nodes 1 ran" in relaunch.stdout
        assert cluster.health_problem() is None
        assert cluster.env_for(plan) == env and cluster.notices == []  # the same cluster for the next run
        cluster.end_run_processes(grace_s=20)

        raylet = next(p for p in cluster.processes() if p.cmdline()[0].endswith("/raylet"))
        raylet.send_signal(signal.SIGKILL)
        raylet.wait(timeout=30)
        # a run handed this cluster (as a race past the supervisor's check would) starts Ray itself instead
        check = run_on(env, RUN_CHECK)
        assert check.returncode == 0 and check.stdout.strip(), ran_words(check)
        said, address = json.loads(check.stdout.strip().splitlines()[-1])
        assert address is None and "lists no alive node" in said
        assert cluster.health_problem() == "its raylet is gone"
        env = cluster.env_for(plan)
        ports.append(cluster.gcs_port)
        assert cluster.notices and "unhealthy (its raylet is gone)" in cluster.notices[0]
        assert env and cluster.health_problem() is None
        relaunch = run_on(env, RELAUNCH)
        assert relaunch.returncode == 0, ran_words(relaunch)
    finally:
        cluster.stop()
    assert not cluster.processes()
    # Ray's client server names no temp dir, only the GCS address it proxies: none of either cluster is left.
    proxies = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if any(
        arg.startswith("--address=") and arg.endswith(tuple(f":{port}" for port in ports))
        for arg in p.info["cmdline"] or [])]
    assert not proxies


@pytest.mark.slow
def test_the_watchdog_ends_the_cluster_when_the_supervisor_is_killed(tmp_path):
    """SIGKILL to the supervisor: Ray's daemons (stood in for by processes naming the cluster's temp dir, one with a
    child, and a client server naming only the GCS address) are ended by the watchdog; a watchdog whose cluster
    was stopped just leaves."""
    temp_dir = tmp_path / "wb-ray-test"
    temp_dir.mkdir()
    sleeper = "import subprocess, sys, time; subprocess.Popen(['sleep', '600']); time.sleep(600)"
    daemons = [subprocess.Popen([sys.executable, "-c", sleeper, f"--temp-dir={temp_dir}"], start_new_session=True)
               for _ in range(2)]
    daemons.append(subprocess.Popen([sys.executable, "-c", sleeper, "--address=192.0.2.2:47001"],
                                    start_new_session=True))
    supervisor = subprocess.Popen(["sleep", "600"])
    watchdog = subprocess.Popen([sys.executable, "-m", "workbench.ray_cluster", "--watch", str(supervisor.pid),
                                 "--temp-dir", str(temp_dir), "--gcs-port", "47001"], stdout=subprocess.PIPE,
                                text=True)
    try:
        time.sleep(3)
        children = [c for d in daemons for c in psutil.Process(d.pid).children(recursive=True)]
        assert children and watchdog.poll() is None
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait()
        assert "cluster ended" in watchdog.communicate(timeout=60)[0]
        for daemon in daemons:
            assert daemon.wait(timeout=30) is not None
        assert all(not c.is_running() or c.status() == psutil.STATUS_ZOMBIE for c in children)
        assert not temp_dir.exists()
    finally:
        for p in (*daemons, supervisor, watchdog):
            if p.poll() is None:
                p.kill()
    alone = subprocess.run([sys.executable, "-m", "workbench.ray_cluster", "--watch", str(os.getpid()),
                            "--temp-dir", str(tmp_path / "no-cluster")], capture_output=True, text=True, timeout=60)
    assert "the cluster was stopped" in alone.stdout
