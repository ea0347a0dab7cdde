"""Fault injection on replayed sessions (issue 10): whatever dies, every session ends in a final state with its reason,
no process of it is left, and no step or event that was written is lost.

- kill -9 of the supervisor, of the kernel (the process holding the Session) and of the runner, each at a random step
  (seeded: SEED). A replay's run is a thread of its supervisor, so "the runner dies" is the replay's injected crash at
  that step (`crash_at_step`, exit code 1, the supervisor's crash path), followed by a stop;
- start-up failures: the Prometheus port in use, bad supervisor arguments, an unwritable store (the supervisor runs as
  `nobody` on a store it can't write), a full disk (a small tmpfs filled up) and a file size limit (RLIMIT_FSIZE).

Each run is short (the bundled 8-step recording at REPLAY_SPEED); RUNS_AT_ONCE run side by side. The counts are
printed at the end (pytest -s shows them).
"""

from __future__ import annotations

import errno
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from workbench import control as c
from workbench import verl_config
from workbench.paths import new_session_dir
from workbench.plan import Plan
from workbench.procs import process_alive
from workbench.recordings import recorded_plans
from workbench.session import HANDLE_FINAL, Session, resolve_recording
from workbench.store import Store, StoreError

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SEED = 20261201
RECORDING = "h200-lora-critic-sync"  # 8 steps; start-up 175 s and a step every ~12 s, recorded
REPLAY_SPEED = 300  # start-up ~0.6 s, a step every ~40 ms
STARTUP_SPEED = 300  # for the slower replays: verl's recorded start-up in about a second, their steps at their pace
LAST_STEP = 8
KILLS = {"supervisor": 8, "kernel": 7, "runner": 7}
RUNS_AT_ONCE = 3
TIMEOUT = 120.0
GONE_S = 60.0  # how long the processes of an ended session may take to go (a loaded machine)


@dataclass
class Outcome:
    case: str
    session_dir: Path
    state: str = ""
    reason: str = ""
    at_step: int | None = None
    left_processes: list[str] = field(default_factory=list)
    lost_rows: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class Watcher:
    """Reads a session's store read-only while it runs and remembers every step and event row it saw."""

    def __init__(self, session_dir: Path):
        self.dir = session_dir
        self.steps: dict[int, tuple] = {}
        self.events: dict[int, tuple] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        store = None
        while not self._done.is_set():
            try:
                store = store or Store(self.dir, readonly=True)
                self._read(store)
            except (StoreError, Exception):  # noqa: BLE001 — a store that is being written or full: try again
                pass
            self._done.wait(0.02)
        if store is not None:
            store.close()

    def _read(self, store: Store) -> None:
        for row in store.rows("steps", since_id=max(self.steps, default=0)):
            self.steps[row["id"]] = (row["segment_id"], row["step"])
        for row in store.rows("events", since_id=max(self.events, default=0)):
            self.events[row["id"]] = (row["kind"], row["text"])

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=10)

    def lost(self) -> list[str]:
        """Rows it saw that the store no longer holds (or holds changed)."""
        store = Store(self.dir, readonly=True)
        try:
            steps = {r["id"]: (r["segment_id"], r["step"]) for r in store.rows("steps")}
            events = {r["id"]: (r["kind"], r["text"]) for r in store.rows("events")}
        finally:
            store.close()
        return ([f"step row {i} {v}" for i, v in self.steps.items() if steps.get(i) != v]
                + [f"event row {i} {v}" for i, v in self.events.items() if events.get(i) != v])


def session_processes(session_dir: Path) -> list[str]:
    """Processes that belong to a session: any whose command line names its directory (supervisor, runner,
    sampler), or whose environment does (verl's Ray workers)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if str(session_dir) in " ".join(proc.info["cmdline"] or ()):
                found.append(f"{proc.pid} {' '.join(proc.info['cmdline'])[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def steps_in_order(session_dir: Path) -> list[str]:
    """Each step once, one after another (a relaunch resumes after the step its checkpoint holds)."""
    store = Store(session_dir, readonly=True)
    try:
        steps = [r["step"] for r in store.rows("steps")]
    finally:
        store.close()
    return [f"step {b} after {a}" for a, b in zip(steps, steps[1:]) if b != a + 1]


def finish(outcome: Outcome, watcher: Watcher | None) -> Outcome:
    """Read the ended session as a new operator kernel would, and check what is left of it."""
    if watcher is not None:
        watcher.stop()
    session = Session.attach(outcome.session_dir)  # an operator attach: the watchdog's reader with write access
    try:
        session.wait_until(lambda s: s.state in c.ENDED_STATES, timeout=TIMEOUT, poll=0.1)
        outcome.state = session.state
        outcome.reason = session.failure or _last_life_event(session)
    finally:
        session.close()
    deadline = time.time() + GONE_S
    while session_processes(outcome.session_dir) and time.time() < deadline:
        time.sleep(0.2)
    outcome.left_processes = session_processes(outcome.session_dir)
    if watcher is not None:
        outcome.lost_rows = watcher.lost()
    outcome.problems += steps_in_order(outcome.session_dir)
    if not outcome.reason:
        outcome.problems.append("no reason given for the final state")
    return outcome


def _last_life_event(session: Session) -> str:
    events = session.events()
    life = events[events["kind"].isin([c.EV_CRASH, c.EV_STOPPED, c.EV_FINISHED, "failed", c.LOST])]
    return life["text"].iloc[-1] if len(life) else ""


def wait_step(session_dir: Path, step: int) -> int:
    deadline = time.time() + TIMEOUT
    store = None
    while time.time() < deadline:
        try:
            store = store or Store(session_dir, readonly=True)
            last = store.last_step()
            if last is not None and last >= step:
                store.close()
                return last
        except StoreError:
            pass
        time.sleep(0.01)
    raise TimeoutError(f"{session_dir}: no step {step} within {TIMEOUT:.0f} s")


# ------------------------------------------------------------------------------------------------ kills at a step
def kill_supervisor(step: int) -> Outcome:
    session = Session.replay(RECORDING, speed=REPLAY_SPEED, follow=False)
    watcher = Watcher(session.dir)
    outcome = Outcome("kill -9 supervisor", session.dir)
    outcome.at_step = wait_step(session.dir, step)
    os.kill(int(session.meta["supervisor_pid"]), signal.SIGKILL)
    session.close()
    return finish(outcome, watcher)


KERNEL = """
import sys, time
from workbench.session import Session
s = Session.replay(sys.argv[1], speed=float(sys.argv[2]), follow=True)
print(s.dir, flush=True)
time.sleep(600)
"""


def kill_kernel(step: int) -> Outcome:
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, RECORDING, str(REPLAY_SPEED)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    session_dir = Path(kernel.stdout.readline().strip())
    watcher = Watcher(session_dir)
    outcome = Outcome("kill -9 kernel", session_dir)
    outcome.at_step = wait_step(session_dir, step)
    kernel.kill()
    kernel.wait()
    return finish(outcome, watcher)  # the run goes on without its kernel and ends with the recorded stop


def kill_runner(step: int) -> Outcome:
    session = Session.replay(RECORDING, speed=REPLAY_SPEED, follow=False, crash_at_step=step)
    watcher = Watcher(session.dir)
    outcome = Outcome("runner dies", session.dir, at_step=step)
    session.wait_until(lambda s: s.state == c.FAILED, timeout=TIMEOUT, poll=0.05)
    session.stop()  # stopped, although it crashed: the supervisor waiting for a rollback ends
    outcome.problems += [] if not process_alive(int(session.meta["supervisor_pid"])) else ["stop left the supervisor"]
    session.close()
    return finish(outcome, watcher)


def test_kill_at_random_steps(home):
    rng = random.Random(SEED)
    plan = [(kind, rng.randint(1, LAST_STEP - 1)) for kind, count in KILLS.items() for _ in range(count)]
    rng.shuffle(plan)
    act = {"supervisor": kill_supervisor, "kernel": kill_kernel, "runner": kill_runner}
    with ThreadPoolExecutor(RUNS_AT_ONCE) as pool:
        outcomes = list(pool.map(lambda job: act[job[0]](job[1]), plan))
    _report(outcomes)
    assert len(outcomes) >= 20
    for outcome in outcomes:
        assert outcome.state in c.ENDED_STATES, outcome
        assert outcome.reason, outcome
        assert not outcome.left_processes, outcome
        assert not outcome.lost_rows, outcome
        assert not outcome.problems, outcome
    kinds = Counter((o.case, o.state) for o in outcomes)
    assert all(state == c.LOST for (case, state) in kinds if case == "kill -9 supervisor")
    assert all(state == c.STOPPED for (case, state) in kinds if case == "kill -9 kernel")
    assert all(state in (c.STOPPED, c.FAILED) for (case, state) in kinds if case == "runner dies")


def _report(outcomes: list[Outcome]) -> None:
    counts = Counter((o.case, o.state) for o in outcomes)
    print(f"\nfault runs: {len(outcomes)} (seed {SEED})")
    for (case, state), count in sorted(counts.items()):
        print(f"  {case:22s} → {state:9s} × {count}")
    print(f"  processes left: {sum(len(o.left_processes) for o in outcomes)}; rows lost: "
          f"{sum(len(o.lost_rows) for o in outcomes)}; other problems: {sum(len(o.problems) for o in outcomes)}")


# ------------------------------------------------------------------------------------------------ start-up failures
def _ends_failed_at_once(session: Session, words: str) -> Outcome:
    """wait_for_step and stop return at once naming the reason; the session lists as failed."""
    outcome = Outcome(words, session.dir)
    with pytest.raises(RuntimeError, match=words):
        session.wait_for_step(1, timeout=TIMEOUT)
    started = time.time()
    said = session.stop()
    assert time.time() - started < 5, "stop() waited for a session that had failed"
    assert words in (said or ""), said
    listed = Session.list().set_index("id")
    assert listed.loc[session.id, "state"] == c.FAILED
    return finish(outcome, None)


def test_prometheus_port_in_use(home):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        session = Session.replay(RECORDING, speed=REPLAY_SPEED, prometheus_port=port)
        outcome = _ends_failed_at_once(session, f"port {port}")
    assert outcome.state == c.FAILED and not outcome.left_processes


def _prepared(home: Path) -> Path:
    """A session directory as Session.replay prepares it, before its supervisor starts."""
    recording = resolve_recording(RECORDING)
    recorded = Store(recording, readonly=True)
    plan_json = recorded.rows("segments")[0]["plan_json"]
    recorded.close()
    directory = new_session_dir("faults")
    (directory / c.TOKEN_FILE).write_text(c.new_token())
    (directory / c.LOG_DIR).mkdir()
    store = Store(directory)
    store.set_meta(created=time.time(), initial_plan=Plan.from_json(plan_json).to_json(), state=c.STARTING,
                   kind="replay", recording=str(recording))
    store.close()
    return directory


def _supervisor(directory: Path, *args: str, prefix: tuple[str, ...] = ()) -> int:
    """Run a supervisor on a prepared session the way Session.start does (its pid recorded); its exit code."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}
    with open(directory / c.LOG_DIR / "supervisor.log", "ab") as log:
        supervisor = subprocess.Popen([*prefix, sys.executable, "-m", "workbench.supervisor", "--session",
                                       str(directory), *args], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    store = Store(directory)
    store.set_meta(supervisor_pid=supervisor.pid)
    store.close()
    return supervisor.wait(timeout=TIMEOUT)


@pytest.mark.parametrize("args, words", [
    (["--replay", "RECORDING", "--speed", "0"], "speed must be positive"),
    (["--replay", "/nonexistent/recording"], "/nonexistent/recording"),
    (["--speed", "fast"], "--speed"),
])
def test_bad_supervisor_arguments(home, args, words):
    directory = _prepared(home)
    args = [str(resolve_recording(RECORDING)) if a == "RECORDING" else a for a in args]
    assert _supervisor(directory, *args) != 0
    outcome = _ends_failed_at_once(Session.attach(directory), words)
    assert outcome.state == c.FAILED


def test_unwritable_store(home):
    """The supervisor runs as nobody on a store nobody can't write (its directory it can): the reason goes into the
    failure file the handle reads."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run the supervisor as another user")
    shared = Path(tempfile.mkdtemp(prefix="wb-unwritable-"))  # pytest's tmp_path is root's alone
    try:
        os.environ["VERL_WORKBENCH_HOME"] = str(shared)
        directory = _prepared(shared)
        for path in (shared, directory.parent, directory, directory / c.LOG_DIR):
            os.chmod(path, 0o777)
        for path in (directory / c.TOKEN_FILE, directory / "session.sqlite"):
            os.chmod(path, 0o644)
        code = _supervisor(directory, "--replay", str(resolve_recording(RECORDING)),
                           prefix=("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"))
        assert code != 0
        outcome = _ends_failed_at_once(Session.attach(directory), "readonly database")
        assert outcome.state == c.FAILED
    finally:
        os.environ["VERL_WORKBENCH_HOME"] = str(home)
        shutil.rmtree(shared, ignore_errors=True)


def _mount_tmpfs(path: Path, size: str) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def _fill(path: Path) -> None:
    """Fill the disk to its last byte; it may be full already (a session's own rows can get there first)."""
    try:
        with open(path, "wb") as filler:
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise


def test_full_disk(tmp_path, monkeypatch):
    """The session's disk fills up while it runs (a 16 MB tmpfs, filled after step 2)."""
    mount = Path(tempfile.mkdtemp(prefix="wb-full-"))
    if not _mount_tmpfs(mount, "16m"):
        mount.rmdir()
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN); the file size limit test covers the path")
    try:
        monkeypatch.setenv("VERL_WORKBENCH_HOME", str(mount))
        session = Session.replay(RECORDING, speed=REPLAY_SPEED / 10, follow=False)
        watcher = Watcher(session.dir)
        wait_step(session.dir, 2)
        _fill(mount / "filler")
        session.wait_until(lambda s: s.state in c.ENDED_STATES, timeout=TIMEOUT, poll=0.1)
        (mount / "filler").unlink()
        outcome = finish(Outcome("full disk", session.dir), watcher)
        session.close()
        assert outcome.state == c.FAILED, outcome
        assert "full" in outcome.reason, outcome
        assert not outcome.left_processes and not outcome.lost_rows, outcome
    finally:
        for pid_line in session_processes(mount):
            os.kill(int(pid_line.split()[0]), signal.SIGKILL)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        shutil.rmtree(mount, ignore_errors=True)


def test_file_size_limit(home):
    """Writes past RLIMIT_FSIZE fail (EFBIG) in the supervisor: it ends failed and says why."""
    session = Session.replay(RECORDING, speed=REPLAY_SPEED / 10, follow=False)
    watcher = Watcher(session.dir)
    wait_step(session.dir, 2)
    pid = int(session.meta["supervisor_pid"])
    size = (session.dir / "session.sqlite").stat().st_size
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (size, size))
    session.wait_until(lambda s: s.state in c.ENDED_STATES, timeout=TIMEOUT, poll=0.1)
    outcome = finish(Outcome("file size limit", session.dir), watcher)
    session.close()
    assert outcome.state == c.FAILED, outcome
    assert not outcome.left_processes and not outcome.lost_rows, outcome


# ------------------------------------------------------------------------------------------------ a live run's tree
FAKE_SUPERVISOR = """
import os, subprocess, sys, time
from workbench.control import SUPERVISOR_PID_ENV
run = subprocess.Popen([sys.executable, "-c", sys.argv[1]], start_new_session=True,
                       env={**os.environ, SUPERVISOR_PID_ENV: str(os.getpid())})
print(run.pid, flush=True)
time.sleep(600)
"""
FAKE_RUN = """
import subprocess, sys, time
from workbench.procs import die_with_supervisor
die_with_supervisor()
print("ready", flush=True)
time.sleep(600)
"""


def test_a_run_dies_with_its_supervisor():
    """A live run sits in its own process session (signals to the supervisor's don't reach it): when the supervisor
    is killed with SIGKILL, the kernel ends the run (PR_SET_PDEATHSIG), so no GPU stays held."""
    supervisor = subprocess.Popen([sys.executable, "-c", FAKE_SUPERVISOR, FAKE_RUN], cwd=REPO, stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    run_pid = int(supervisor.stdout.readline())
    assert supervisor.stdout.readline().strip() == "ready"  # the run's output comes through the same pipe
    assert process_alive(run_pid) and os.getsid(run_pid) != os.getsid(supervisor.pid)
    supervisor.kill()
    supervisor.wait()
    deadline = time.time() + 10
    while process_alive(run_pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not process_alive(run_pid)


def test_a_run_whose_supervisor_is_gone_does_not_start():
    done = subprocess.run([sys.executable, "-c", FAKE_RUN], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "PYTHONPATH": str(REPO), "WORKBENCH_SUPERVISOR_PID": "1"})
    assert done.returncode != 0 and "is gone: not starting" in done.stderr


# ------------------------------------------------------------------------------------------------ commands can't vanish
HOT_CHANGE = {name: 32768 for name in ("actor_token_budget", "logprob_token_budget", "ref_token_budget",
                                       "critic_token_budget")}  # h200-proof's recorded hot change
# h200-proof's recorded restart (from the plan before its hot change: both at once, a restart-class change)
RESTART_CHANGE = {**HOT_CHANGE, "critic_lora_rank": 8, "trainer_mode": "colocate_async"}


def _change_then(then: str, change: dict) -> tuple[str, str, str]:
    """Apply a change to a replay of h200-proof, then do `then` to the session; the change's final state and words."""
    crash = {"crash": 3}.get(then)
    # 10×: a step every ~1.2 s, 9 steps in the first recorded segment: time to act before the run ends.
    session = Session.replay("h200-proof", speed=10, follow=False, crash_at_step=crash, startup_speed=STARTUP_SPEED)
    try:
        session.wait_for_step(2, timeout=TIMEOUT)
        # A crash may come before the supervisor answers: then it refuses (no run), which is an answer too.
        handle = session.apply(change)
        if not crash:  # a loaded machine may take its time to check the change: TIMEOUT, not apply's 30 s
            handle.wait(timeout=TIMEOUT, until=("accepted", "restarting", *HANDLE_FINAL))
        if then == "stop now":
            session.stop(now=True)
        elif then == "stop":
            session.stop()
        elif then == "kill -9 supervisor":
            os.kill(int(session.meta["supervisor_pid"]), signal.SIGKILL)
            session.wait_until(lambda s: s.state == c.LOST, timeout=TIMEOUT, poll=0.05)  # the watchdog's look
        handle.wait(timeout=TIMEOUT)
        return then, handle.state, handle.message
    finally:
        session.stop(now=True)
        session.close()


def test_an_accepted_change_ends_applied_or_not_applied_with_the_reason(home):
    """Whatever happens after a change was accepted, its handle ends applied (with the step) or not_applied (with
    why): never accepted for ever."""
    # This process's change checks import verl and compose the recording's plans now (seconds each on a loaded
    # machine, beside the supervisors' first checks), not while the replays' steps run: ~8 s after step 2 each ends.
    verl_config.warm()
    recorded_plans(resolve_recording("h200-proof")).knobs  # noqa: B018 (read for its cost)
    jobs = [(then, HOT_CHANGE) for then in ("nothing", "stop now", "stop", "crash", "kill -9 supervisor")]
    jobs += [(then, RESTART_CHANGE) for then in ("nothing", "kill -9 supervisor")]
    with ThreadPoolExecutor(RUNS_AT_ONCE) as pool:
        results = list(pool.map(lambda job: (job[1] is RESTART_CHANGE, *_change_then(*job)), jobs))
    print("\nchanges:", *(f"{'restart' if restart else 'hot'} + {then}: {state} ({message})"
                         for restart, then, state, message in results), sep="\n  ")
    reasons = {"stop now": "stop", "stop": "stop", "crash": "crash", "kill -9 supervisor": "gone"}
    for restart, then, state, message in results:
        assert state in ("applied", "resumed", "not_applied") or (then, state) == ("crash", "refused"), (then, message)
        if then == "nothing":
            assert state == ("resumed" if restart else "applied"), (then, state, message)
        if then == "kill -9 supervisor":
            assert state == "not_applied", (then, state, message)
        if state in ("not_applied", "refused"):
            assert reasons[then] in message or "no run" in message, (then, message)


def test_a_stop_that_meets_a_crash_ends_stopped(home):
    """stop() sent just before a step that crashes: the session ends stopped (the crash in its events) and its
    supervisor exits, instead of waiting for a rollback for ever."""
    session = Session.replay("h200-proof", speed=10, follow=False, crash_at_step=3, startup_speed=STARTUP_SPEED)
    try:
        session.wait_for_step(2, timeout=TIMEOUT)
        said = session.stop(timeout=TIMEOUT)
        assert session.state == c.STOPPED, said
        assert not process_alive(int(session.meta["supervisor_pid"]))
        assert c.EV_CRASH in set(session.events()["kind"])
    finally:
        session.close()
