"""Session: what a notebook holds. A handle on a session directory whose supervisor process owns the run.

    s = Session.start(Plan.from_verl(overrides=[...]))   # live verl run on this machine's GPUs
    s = Session.replay("h200-proof", speed=20)            # a recorded H200 session played back (no GPU needed)
    s = Session.attach(path_or_id)                         # from any kernel; read-only without the operator token
    s.apply({"actor_token_budget": 8192})                  # hot at the next step, or checkpoint -> restart -> resume
    s.steps(), s.samples(), s.events(), s.segments()      # pandas DataFrames

The handle itself holds no run: kernels can come and go, the supervisor and the verl run go on.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import psutil

from .advisor import Finding, advise, findings_frame
from .paths import resolve_session_dir, sessions_root
from .plan import Plan, PlanError
from .store import STORE_FILE, Store
from .supervisor import ANSWERED, TOKEN_FILE, signed

ACTIVE_STATES = ("starting", "running", "paused", "restarting", "stopping")
COMMAND_TIMEOUT_S = 30.0


class ReadOnlySession(PermissionError):
    pass


@dataclass(frozen=True)
class ApplyResult:
    """What an accepted change will do: `mode` is "hot" (next step boundary, same process) or "restart"."""

    mode: str
    changes: dict[str, Any]
    command_id: int

    def __str__(self) -> str:
        what = ", ".join(f"{k}={v!r}" for k, v in self.changes.items())
        if self.mode == "hot":
            return f"{what}: applied hot at the next step boundary"
        return f"{what}: checkpoint at the next step boundary, then restart and resume"


def new_session_dir(name: str | None = None, root: Path | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    session_id = f"{stamp}-{name or uuid.uuid4().hex[:6]}"
    path = (root or sessions_root()) / session_id
    path.mkdir(parents=True, exist_ok=False)
    return path


def gpu_count() -> int | None:
    """GPUs NVML sees on this machine, or None without a driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


class Session:
    def __init__(self, directory: str | os.PathLike, token: str | None = None, *, read_only: bool = False):
        self.dir = Path(directory)
        self.store = Store(self.dir, create=False)
        if read_only:
            token = None
        elif token is None:
            try:
                token = (self.dir / TOKEN_FILE).read_text().strip()
            except (PermissionError, FileNotFoundError):
                token = None
        self._token = token

    # ----------------------------------------------------------------- creating and finding sessions
    @classmethod
    def start(
        cls, plan: Plan, *, name: str | None = None, root: Path | None = None, prometheus_port: int | None = None,
    ) -> "Session":
        """Validate the plan against this machine and start a live verl run under a new supervisor.

        prometheus_port: also serve the session's metrics for Prometheus at http://127.0.0.1:PORT/metrics
        (0 picks a free port; `session.meta["prometheus_url"]` says which)."""
        gpus = gpu_count()
        if not gpus:
            raise RuntimeError(
                "no NVIDIA GPU on this machine: a verl PPO run needs CUDA GPUs. "
                "Use Session.replay(...) to explore a recorded H200 session instead."
            )
        plan.validate(gpu_count=gpus)
        meta = {"kind": "live", "gpu_count": gpus, "prometheus_port": prometheus_port}
        return cls._spawn(plan, name=name, root=root, meta=meta, args=[])

    @classmethod
    def replay(
        cls, recording: str | os.PathLike, *, speed: float = 1.0, follow: bool = True, crash_at_step: int | None = None,
        root: Path | None = None, prometheus_port: int | None = None,
    ) -> "Session":
        """Play a recorded session (a session directory, or the name of a bundled one) as a run: the no-GPU demo
        and the CPU test double.

        follow=True re-issues the recorded operator's commands (changes, telemetry, rollback, stop) where the
        recording gave them, so the replay tells the whole recorded story; any command of yours takes control from
        it for good. follow=False leaves every command to you."""
        recording = resolve_recording(recording)
        recorded = Store(recording, readonly=True)
        first = recorded.rows("segments")[0]
        recorded_meta = recorded.meta()
        # What the recording says about its machine (gpu_count, …) carries over; its life cycle does not.
        meta = {k: v for k, v in recorded_meta.items() if k not in ("state", "supervisor_pid", "initial_plan", "created")}
        meta.update(
            kind="replay", recording=str(recording), recorded_at=recorded_meta.get("created"), speed=speed, follow=follow,
            prometheus_port=prometheus_port,
        )
        recorded.close()
        args = ["--replay", str(recording), "--speed", str(speed)]
        if not follow:
            args.append("--no-follow")
        if crash_at_step is not None:
            args += ["--crash-at-step", str(crash_at_step)]
        return cls._spawn(Plan.from_json(first["plan_json"]), name=f"replay-{recording.name}", root=root, meta=meta, args=args)

    @classmethod
    def _spawn(cls, plan: Plan, *, name, root, meta: dict[str, Any], args: list[str]) -> "Session":
        directory = new_session_dir(name, root)
        token = secrets.token_hex(16)
        token_path = directory / TOKEN_FILE
        token_path.touch(mode=0o600)
        token_path.write_text(token)
        store = Store(directory)
        store.set_meta(created=time.time(), initial_plan=plan.to_json(), state="starting", **meta)
        (directory / "logs").mkdir(exist_ok=True)
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
        with open(directory / "logs" / "supervisor.log", "ab") as log:
            # A new process session: the supervisor outlives the kernel (and page reloads) that started it.
            subprocess.Popen(
                [sys.executable, "-m", "workbench.supervisor", "--session", str(directory), *args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )
        store.close()
        return cls(directory, token)

    @classmethod
    def attach(
        cls, path_or_id: str | os.PathLike | None = None, token: str | None = None, *, read_only: bool = False,
    ) -> "Session":
        """Attach to a session by directory or id (newest if None). Without the operator token it is read-only;
        read_only=True makes a view that can't control the session even where the token file is readable."""
        return cls(resolve_session_dir(path_or_id), token, read_only=read_only)

    @classmethod
    def list(cls, root: Path | None = None) -> pd.DataFrame:
        rows = []
        for store_path in sorted((root or sessions_root()).glob(f"*/{STORE_FILE}")):
            store = Store(store_path, readonly=True)
            meta = store.meta()
            rows.append(
                dict(
                    id=store_path.parent.name, path=str(store_path.parent), kind=meta.get("kind"),
                    state=_effective_state(meta), created=pd.to_datetime(meta.get("created"), unit="s"),
                    segments=store.max_id("segments"), steps=store.max_id("steps"),
                )
            )
            store.close()
        return pd.DataFrame(rows, columns=["id", "path", "kind", "state", "created", "segments", "steps"])

    # ----------------------------------------------------------------- state
    @property
    def id(self) -> str:
        return self.dir.name

    @property
    def is_operator(self) -> bool:
        return self._token is not None

    @property
    def meta(self) -> dict[str, Any]:
        return self.store.meta()

    @property
    def state(self) -> str:
        return _effective_state(self.meta)

    @property
    def plan(self) -> Plan:
        """The plan in force: the newest segment's (or the initial plan before the first segment)."""
        last = self.store.last_segment()
        return Plan.from_json(last["plan_json"] if last else self.meta["initial_plan"])

    def __repr__(self) -> str:
        role = "operator" if self.is_operator else "read-only"
        return f"<Session {self.id} {self.state} ({role}) steps={self.store.max_id('steps')}>"

    # ----------------------------------------------------------------- control
    def _command(self, kind: str, payload: dict[str, Any] | None = None, wait: bool = True) -> dict[str, Any]:
        if not self.is_operator:
            raise ReadOnlySession(
                f"session {self.id} is attached read-only: control needs its operator token "
                f"({self.dir / TOKEN_FILE}, readable by the user who started it)"
            )
        if not self._supervisor_alive():
            raise RuntimeError(self._no_supervisor(kind))
        command_id = self.store.put_command(kind, signed(self._token, kind, payload or {}))
        if not wait:
            return {"id": command_id}
        deadline = time.time() + COMMAND_TIMEOUT_S
        while time.time() < deadline:
            alive = self._supervisor_alive()  # before reading the command: it may answer, then exit
            cmd = self.store.command(command_id)
            if cmd["state"] in ANSWERED:
                result = json.loads(cmd["result"]) if cmd["result"] else None
                if cmd["state"] != "done":
                    raise RuntimeError(f"{kind} {cmd['state']}: {result}")
                return {"id": command_id, "result": result}
            if not alive:
                raise RuntimeError(self._no_supervisor(kind))
            time.sleep(0.1)
        raise TimeoutError(f"{kind}: the supervisor did not answer within {COMMAND_TIMEOUT_S:.0f} s")

    def _supervisor_alive(self) -> bool:
        pid = self.meta.get("supervisor_pid")
        return pid is None or process_alive(int(pid))  # None: it is still starting

    def _no_supervisor(self, kind: str) -> str:
        if self.state == "lost":
            return f"{kind}: the supervisor of session {self.id} is gone (see {self.dir / 'logs'})"
        return f"{kind}: session {self.id} is {self.state} and its supervisor has exited: nothing runs to control"

    def apply(self, changes: dict[str, Any]) -> ApplyResult:
        """Validate the whole new plan first (nothing is queued if it is invalid), then apply it."""
        if not self.is_operator:
            self._command("apply")  # raises ReadOnlySession
        new = self.plan.with_changes(changes)
        meta = self.meta
        # A replayed plan names model paths of the machine it was recorded on: verl's own check can't load them here.
        new.validate(gpu_count=meta.get("gpu_count"), with_verl=meta.get("kind") != "replay")
        reply = self._command("apply", {"changes": changes, "gpu_count": meta.get("gpu_count")})
        result = reply["result"]
        return ApplyResult(mode=result["mode"], changes=result["changes"], command_id=reply["id"])

    def pause(self) -> None:
        self._command("pause")

    def resume(self) -> None:
        self._command("resume")

    def stop(self, *, now: bool = False, checkpoint: bool = False, wait: bool = True, timeout: float = 180.0) -> None:
        """Stop at the next step boundary (or at once with now=True) and free the GPUs."""
        if self.is_operator and self.state in ("stopped", "finished") and not self._supervisor_alive():
            return  # it has ended already
        self._command("stop", {"now": now, "checkpoint": checkpoint})
        if wait:
            self.wait_until(lambda s: s.state in ("stopped", "finished", "failed", "lost"), timeout=timeout)

    def telemetry(self, on: bool = True) -> None:
        """Turn the NVML sampler off or on (e.g. to measure what it costs)."""
        self._command("telemetry", {"on": on})

    def rollback(self) -> int:
        """After a crash: relaunch the last plan that ran good steps, resuming from the newest checkpoint."""
        return self._command("rollback")["result"]["segment"]

    def wait_until(self, predicate: Callable[["Session"], bool], timeout: float = 600.0, poll: float = 0.5) -> "Session":
        deadline = time.time() + timeout
        while not predicate(self):
            if time.time() > deadline:
                raise TimeoutError(f"session {self.id}: condition not met within {timeout:.0f} s (state {self.state})")
            time.sleep(poll)
        return self

    def wait_for_step(self, step: int, timeout: float = 600.0) -> "Session":
        def reached(s: "Session") -> bool:
            if s.state in ("failed", "lost", "stopped", "finished"):
                raise RuntimeError(f"session {s.id} is {s.state} before step {step}")
            last = s.store.last_step()
            return last is not None and last >= step

        return self.wait_until(reached, timeout=timeout)

    # ----------------------------------------------------------------- data (pandas, one call away)
    def steps(self, since_id: int = 0) -> pd.DataFrame:
        return self.store.frame("steps", since_id)

    def samples(self, since_id: int = 0) -> pd.DataFrame:
        return self.store.frame("samples", since_id)

    def procs(self, since_id: int = 0) -> pd.DataFrame:
        return self.store.frame("procs", since_id)

    def workers(self) -> pd.DataFrame:
        return self.store.frame("workers")

    def events(self, since_id: int = 0) -> pd.DataFrame:
        return self.store.frame("events", since_id)

    def commands(self) -> pd.DataFrame:
        return self.store.frame("commands")

    def segments(self) -> pd.DataFrame:
        """Every applied plan with what it measured: steps, mean step time, throughput (tokens/s/GPU)."""
        segments = self.store.frame("segments")
        steps = self.steps()
        if len(steps):
            per = steps.groupby("segment_id").agg(
                steps=("step", "count"), first_step=("step", "min"), last_step=("step", "max"),
                step_time_s=("timing_s/step", "mean"), throughput=("perf/throughput", "mean"),
            )
            segments = segments.merge(per, left_on="id", right_index=True, how="left")
        segments["changed"] = [", ".join(Plan.from_json(p).changed_knobs()) for p in segments["plan_json"]]
        return segments

    def export(self, format: str = "overrides", segment: int | None = None) -> str | list[str]:
        """The plan of a segment (default: the one in force) as Hydra overrides, YAML or a command line."""
        plan = Plan.from_json(self.store.segment(segment)["plan_json"]) if segment else self.plan
        exporters = {"overrides": plan.to_overrides, "yaml": plan.to_yaml, "command": plan.to_command}
        if format not in exporters:
            raise ValueError(f"unknown export format {format!r}: choose one of {', '.join(exporters)}")
        return exporters[format]()

    def knob_values(self, segment: int | None = None) -> dict[str, Any]:
        """Every knob's value in a segment's plan (default: the one in force), defaults included."""
        plan = Plan.from_json(self.store.segment(segment)["plan_json"]) if segment else self.plan
        return plan.knob_values()

    def advice_findings(self, segment_id: int | None = None) -> list[Finding]:
        """The advisor's findings for a segment (default: the newest), judged against that segment's plan."""
        return advise(self.steps(), self.samples(), self.knob_values(segment_id), segment_id=segment_id,
                      procs=self.procs())

    def advice(self, segment_id: int | None = None) -> pd.DataFrame:
        """advice_findings as a table: one row per finding, most severe first."""
        return findings_frame(self.advice_findings(segment_id))


def _effective_state(meta: dict[str, Any]) -> str:
    """The recorded state, or "lost" when it says active but its supervisor process is gone."""
    state = meta.get("state", "starting")
    pid = meta.get("supervisor_pid")
    if state in ACTIVE_STATES and pid is not None and not process_alive(int(pid)):
        return "lost"
    return state


def process_alive(pid: int) -> bool:
    """Whether a process runs. An exited child that its parent has not reaped yet (a zombie: the kernel that
    spawned a supervisor stays its parent) has ended all the same."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def resolve_recording(recording: str | os.PathLike) -> Path:
    """A recording by path or by name under workbench/assets/recordings/."""
    path = Path(recording)
    if (path / STORE_FILE).exists():
        return path
    bundled = Path(__file__).resolve().parent / "assets" / "recordings" / str(recording)
    if (bundled / STORE_FILE).exists():
        return bundled
    raise FileNotFoundError(f"{recording}: no recorded session there (expected {STORE_FILE})")


__all__ = ["Session", "ApplyResult", "ReadOnlySession", "PlanError", "new_session_dir", "gpu_count"]
