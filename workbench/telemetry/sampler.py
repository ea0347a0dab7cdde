"""The sampler process: samples this machine's GPUs (or every node of a Ray cluster) into a session store until
SIGTERM. The supervisor starts it beside a live run, so its CPU cost shows on its own:

    python -m workbench.telemetry.sampler --session DIR [--hz 10] [--gpus 0,1] [--cluster RAY_ADDRESS]
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import threading

from ..paths import resolve_session_dir
from ..procs import die_with_supervisor
from ..store import Store
from .nvml import NvmlReader, NvmlUnavailable, parse_gpu_list
from .sampling import EVENT_KIND, EXIT_NO_NVML, Sampler


def _sample_cluster(store: Store, address: str, hz: float, stopping: threading.Event) -> int:
    """One NodeSampler actor per node of a running Ray cluster (the one verl runs on), all into this store."""
    import ray

    from .cluster import ClusterSampler

    ray.init(address=address, namespace="workbench-telemetry", log_to_driver=False)
    sampler = ClusterSampler(store, hz=hz).start()
    print(f"telemetry sampler: Ray cluster {address} at {hz} Hz into {store.path}", file=sys.stderr, flush=True)
    while not stopping.wait(1.0):
        pass
    sampler.stop()
    print(f"telemetry sampler stopped: {json.dumps(sampler.node_stats(), default=str)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.telemetry.sampler", description="Sample this machine's GPUs into a session store until SIGTERM.")
    parser.add_argument("--session", required=True, help="session directory or id")
    parser.add_argument("--hz", type=float, default=10.0, help="samples per second (default 10)")
    parser.add_argument("--gpus", default=None, help="GPU indices, e.g. 0,1 (default: all)")
    parser.add_argument("--cluster", metavar="RAY_ADDRESS",
                        help="sample every node of this Ray cluster (one pinned actor per node) instead of this machine")
    args = parser.parse_args(argv)
    die_with_supervisor()  # a supervisor killed with SIGKILL leaves no sampler behind

    try:
        store = Store(resolve_session_dir(args.session))
    except FileNotFoundError as e:
        print(f"telemetry sampler: {e}", file=sys.stderr)
        return 2
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    if args.cluster:
        return _sample_cluster(store, args.cluster, args.hz, stopping)
    try:
        reader = NvmlReader(parse_gpu_list(args.gpus))
    except NvmlUnavailable as e:
        store.add_event(EVENT_KIND, str(e), {"node": socket.gethostname()})
        print(f"telemetry sampler: {e}", file=sys.stderr)
        return EXIT_NO_NVML

    sampler = Sampler(store, reader, hz=args.hz).start()
    print(f"telemetry sampler: GPUs {reader.gpus()} at {args.hz} Hz into {store.path}", file=sys.stderr, flush=True)
    while not stopping.wait(1.0):  # a timed wait lets the signal handler run promptly
        pass
    sampler.stop()
    reader.close()
    print(f"telemetry sampler stopped: {json.dumps(sampler.stats())}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
