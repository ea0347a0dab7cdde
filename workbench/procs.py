"""Ending processes, written once: terminate → wait → kill, and the scan for a process session's members.

A live run is started as a process-session leader (`start_new_session=True`), so everything it starts (Ray's GCS,
raylet, workers, vLLM engines) keeps its session id even after a crash re-parents it to init, still holding GPU
memory: the session scan finds those where a walk of the process tree cannot.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Iterable

import psutil

from .control import SUPERVISOR_PID_ENV

KILL_WAIT_S = 5.0  # after SIGKILL: the kernel ends a process at once, this only covers reaping
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def session_members(sid: int) -> list[psutil.Process]:
    """Every process whose session id is `sid` (this process left out)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and os.getsid(proc.pid) == sid:
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
            continue
    return found


def tree(pid: int) -> list[psutil.Process]:
    """A process and all its descendants; empty when it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def end(procs: Iterable[psutil.Process], grace_s: float = 10.0) -> list[int]:
    """SIGTERM each process, give them `grace_s` to exit, SIGKILL the rest; returns the pids asked to end.
    This process is never among them."""
    unique = {p.pid: p for p in procs if p.pid != os.getpid()}
    for proc in unique.values():
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(unique.values()), timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=KILL_WAIT_S)
    return sorted(unique)


def kill_tree(pid: int, grace_s: float = 10.0) -> list[int]:
    """End a session leader and everything it started: its process tree and its session's re-parented orphans."""
    return end([*tree(pid), *session_members(pid)], grace_s)


def end_process_session(sid: int, grace_s: float = 5.0) -> list[int]:
    """End every process of a process session (a live run whose supervisor is gone, and what it started)."""
    return end(session_members(sid), grace_s)


def end_child(child: subprocess.Popen, grace_s: float = 10.0) -> None:
    """End a child this process started, and reap it (no zombie left behind)."""
    if child.poll() is None:
        try:
            end([psutil.Process(child.pid)], grace_s)
        except psutil.NoSuchProcess:
            pass
    child.wait()


def process_alive(pid: int) -> bool:
    """Whether a process runs. An exited child that its parent has not reaped yet (a zombie: the kernel that
    spawned a supervisor stays its parent) has ended all the same."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Wait up to `timeout_s` for a process to end; whether it has."""
    try:
        _, alive = psutil.wait_procs([psutil.Process(pid)], timeout=timeout_s)
    except psutil.NoSuchProcess:
        return True
    return not alive


def die_with_supervisor() -> None:
    """Have the kernel SIGKILL this process (a run, a sampler) the moment the supervisor that started it dies (Linux
    PR_SET_PDEATHSIG), and end now if it is gone already: a supervisor killed with SIGKILL must not leave a verl run
    holding the GPUs. The run sits in a process session of its own, out of reach of signals to the supervisor's;
    Ray's processes share the fate of their driver, the run. Elsewhere (no prctl) the watchdog ends the run
    (Session marks it lost)."""
    expected = os.environ.get(SUPERVISOR_PID_ENV)
    if not expected or not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(expected):
        raise SystemExit(f"the supervisor (pid {expected}) that started this run is gone: not starting")
