"""Which verl role a GPU process belongs to.

NVML names the PIDs on each GPU; the runner records its workers' PIDs (store table `workers`). A GPU process is
often not a registered PID itself but a child of one (a compile worker under a trainer), and some are never
registered but carry a telling title (vLLM's engine core, Ray actors). So we walk up from the process, nearest
first, and take the first evidence: a registered PID, else a title that names a role.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

import psutil

# Process title (Ray sets `ray::<ActorClass>[.<method>]`; vLLM and SGLang name their engine processes) → role, in
# the runner's role names (workbench/runner/trainer.py records the same roles in `workers`).
# The first pattern that matches wins.
ROLE_BY_TITLE: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"VLLM::EngineCore|vLLMHttpServer|SGLangHttpServer|sglang::|TRTLLMHttpServer"), "rollout"),
    (re.compile(r"ray::\w*ActorRolloutRefWorker"), "actor_rollout_ref"),
    (re.compile(r"ray::\w*TrainingWorker"), "critic"),  # verl V1 runs its standalone critic as a TrainingWorker
    (re.compile(r"ray::\w*Reward\w*"), "reward"),
)
UNKNOWN_ROLE = "other"


def classify_title(title: str) -> str | None:
    """The role a process title names, or None."""
    for pattern, role in ROLE_BY_TITLE:
        if pattern.search(title):
            return role
    return None


def _title(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline()) or process.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _chain(pid: int) -> list[psutil.Process]:
    """The process and its ancestors, nearest first; empty if it is gone or in another PID namespace."""
    try:
        process = psutil.Process(pid)
        return [process, *process.parents()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def _is_raylet(title: str) -> bool:
    return title.split(" ", 1)[0].endswith("raylet")


class RoleAttributor:
    """pid → role: the nearest of the process and its ancestors that is registered (known_roles() maps pid → role)
    or whose title names a role; else "other"."""

    def __init__(self, known_roles: Callable[[], Mapping[int, str]]):
        self._known_roles = known_roles

    def role_of(self, pid: int) -> str:
        known = self._known_roles()
        if pid in known:
            return known[pid]
        for process in _chain(pid):
            if process.pid in known:
                return known[process.pid]
            title = _title(process)
            # Ray starts every worker under a raylet, and a one-machine run starts the raylet under the driver:
            # above the raylet the chain says nothing about which worker this is.
            if _is_raylet(title):
                break
            role = classify_title(title)
            if role is not None:
                return role
        return UNKNOWN_ROLE


class WorkersTable:
    """pid → role from the runner's `workers` rows for one node, read incrementally by row id.

    Rows with an empty node count for every node (a single-machine runner may not name one)."""

    def __init__(self, store, node: str):
        self._store = store
        self._node = node
        self._last_id = 0
        self._roles: dict[int, str] = {}

    def __call__(self) -> dict[int, str]:
        for row in self._store.rows("workers", since_id=self._last_id):
            self._last_id = row["id"]
            if row["node"] in (self._node, None, ""):
                self._roles[int(row["pid"])] = row["role"]
        return self._roles
