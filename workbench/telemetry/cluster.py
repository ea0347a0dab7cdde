"""Multi-node sampling on a Ray cluster: one NodeSampler actor per node, drained by the head into the session store.

NVML only sees the GPUs of its own machine, so each node samples itself into a bounded local buffer; the head
(ClusterSampler, next to the store) drains every actor about once a second and writes all rows in one batch, tagged
with the node they came from. Attribution needs the runner's `workers` rows, which live in the head's store, so the
head hands each node its own pid → role map with every drain.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .nvml import GpuReader, NvmlReader, NvmlUnavailable
from .sampling import EVENT_KIND, Sampler

# A node keeps at most this many seconds of rows the head hasn't drained, so a stalled head can't exhaust its memory.
BUFFER_SECONDS = 600.0
# How often the head looks for nodes that joined (a node that leaves shows up as a failed drain).
RESCAN_EVERY_S = 10.0


class RowBuffer:
    """A sampler sink that keeps rows in memory (bounded, oldest dropped first) until taken."""

    def __init__(self, max_samples: int, max_procs: int):
        self._lock = threading.Lock()
        self._samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_samples)
        self._procs: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_procs)
        self._events: list[tuple[str, str, dict[str, Any]]] = []

    def add_samples(self, rows) -> None:
        with self._lock:
            self._samples.extend(rows)

    def add_procs(self, rows) -> None:
        with self._lock:
            self._procs.extend(rows)

    def add_event(self, kind: str, text: str, data: dict[str, Any] | None = None) -> None:
        with self._lock:
            self._events.append((kind, text, data or {}))

    def take(self) -> dict[str, list]:
        with self._lock:
            taken = {"samples": list(self._samples), "procs": list(self._procs), "events": self._events}
            self._samples.clear()
            self._procs.clear()
            self._events = []
        return taken


class NodeSampler:
    """Samples the GPUs of the node it runs on (as a Ray actor pinned there) into a RowBuffer."""

    def __init__(self, reader_factory: Callable[[], GpuReader], hz: float, node: str):
        self._roles: dict[int, str] = {}
        self._sampler: Sampler | None = None
        try:
            reader = reader_factory()
        except NvmlUnavailable as e:  # a CPU-only node in a GPU cluster: say so, sample nothing
            self._buffer = RowBuffer(0, 0)
            self._buffer.add_event(EVENT_KIND, f"{node}: {e}", {"node": node})
            return
        gpus = max(1, len(reader.gpus()))
        # Process rows come at ~1 Hz, a few per GPU (actor, rollout engine, critic colocated).
        self._buffer = RowBuffer(max_samples=int(BUFFER_SECONDS * hz * gpus), max_procs=int(BUFFER_SECONDS * gpus * 4))
        # Flushing into memory is cheap; flush often so a drain never waits on rows stuck in the sampler.
        self._sampler = Sampler(self._buffer, reader, hz=hz, node=node, flush_every_s=0.2, known_roles=lambda: self._roles)
        self._sampler.start()

    def drain(self, roles: dict[int, str]) -> dict[str, Any]:
        """Rows sampled since the last drain, plus this node's sampler stats; `roles` is this node's pid → role."""
        self._roles = roles
        return {**self._buffer.take(), "stats": self._sampler.stats() if self._sampler else None}

    def stop(self, roles: dict[int, str]) -> dict[str, Any]:
        if self._sampler is not None:
            self._sampler.stop()
        return self.drain(roles)


# num_cpus=0: the sampler must never take a CPU slot a verl worker is waiting for.
_RemoteNodeSampler = ray.remote(num_cpus=0)(NodeSampler)


def node_names(nodes: list[dict[str, Any]]) -> dict[str, str]:
    """Ray node id → the name its rows carry: the hostname, with the node id's start where hostnames repeat
    (several Ray nodes on one machine)."""
    hostnames = collections.Counter(n["NodeManagerHostname"] for n in nodes)
    return {
        n["NodeID"]: n["NodeManagerHostname"] if hostnames[n["NodeManagerHostname"]] == 1 else f"{n['NodeManagerHostname']}/{n['NodeID'][:8]}"
        for n in nodes
    }


class ClusterSampler:
    """Head side: a NodeSampler on every alive Ray node, drained into `store` every `drain_every_s`.

    reader_factory builds each node's reader on that node; it must be picklable (the NvmlReader class, or e.g.
    functools.partial(TraceReader, {...}) to replay recordings). Needs ray.init() done by the caller.
    """

    def __init__(self, store, hz: float = 10.0, reader_factory: Callable[[], GpuReader] = NvmlReader, drain_every_s: float = 1.0):
        self.store = store
        self.hz = hz
        self.reader_factory = reader_factory
        self.drain_every_s = drain_every_s
        self._actors: dict[str, Any] = {}  # Ray node id → NodeSampler actor handle
        self._names: dict[str, str] = {}  # Ray node id → node name in the rows
        self._aliases: dict[str, set[str]] = {}  # Ray node id → every name a workers row may give the node
        self._workers_last_id = 0
        self._workers: dict[str, dict[int, str]] = collections.defaultdict(dict)  # workers row node → pid → role
        self._node_stats: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "ClusterSampler":
        if not ray.is_initialized():
            raise RuntimeError("ClusterSampler needs a running Ray: call ray.init(address=...) first")
        self._add_new_nodes()
        self._thread = threading.Thread(target=self._run, name="cluster-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop every node's sampler and write what they still hold."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._write(self._collect("stop"))
        for actor in self._actors.values():
            ray.kill(actor)
        self._actors.clear()

    def nodes(self) -> dict[str, str]:
        """Ray node id → node name, for every node sampled since start()."""
        return dict(self._names)

    def node_stats(self) -> dict[str, Any]:
        """Node name → that node's sampler stats (as Sampler.stats()) at the last drain."""
        return dict(self._node_stats)

    def _run(self) -> None:
        next_scan = time.monotonic() + RESCAN_EVERY_S
        while not self._stop.wait(self.drain_every_s):
            if time.monotonic() >= next_scan:
                self._add_new_nodes()
                next_scan = time.monotonic() + RESCAN_EVERY_S
            self._write(self._collect("drain"))

    def _add_new_nodes(self) -> None:
        alive = [n for n in ray.nodes() if n["Alive"]]
        names = node_names(alive)
        for n in alive:
            node_id = n["NodeID"]
            if node_id in self._actors:
                continue
            self._names.setdefault(node_id, names[node_id])  # a node keeps its name when a namesake joins later
            self._aliases[node_id] = {self._names[node_id], n["NodeManagerHostname"], n["NodeManagerAddress"], node_id}
            self._actors[node_id] = (
                _RemoteNodeSampler.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))
                .remote(self.reader_factory, self.hz, self._names[node_id])
            )

    def _roles_for(self, node_id: str) -> dict[int, str]:
        for row in self.store.rows("workers", since_id=self._workers_last_id):
            self._workers_last_id = row["id"]
            self._workers[row["node"] or ""][int(row["pid"])] = row["role"]
        roles = dict(self._workers.get("", {}))
        for alias in self._aliases[node_id]:
            roles.update(self._workers.get(alias, {}))
        return roles

    def _collect(self, method: str) -> list[dict[str, Any]]:
        calls = {node_id: getattr(actor, method).remote(self._roles_for(node_id)) for node_id, actor in self._actors.items()}
        batches = []
        for node_id, ref in calls.items():
            name = self._names[node_id]
            try:
                batch = ray.get(ref, timeout=max(30.0, 5 * self.drain_every_s))
            except (ray.exceptions.RayError, TimeoutError) as e:  # node died or hangs: report it, stop asking it
                self.store.add_event(EVENT_KIND, f"{name}: node sampler lost: {e!r}"[:2000], {"node": name})
                del self._actors[node_id]
                continue
            self._node_stats[name] = batch.pop("stats")
            batches.append(batch)
        return batches

    def _write(self, batches: list[dict[str, Any]]) -> None:
        self.store.add_samples([row for b in batches for row in b["samples"]])
        self.store.add_procs([row for b in batches for row in b["procs"]])
        for batch in batches:
            for kind, text, data in batch["events"]:
                self.store.add_event(kind, text, data)
