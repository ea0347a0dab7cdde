"""Multi-node sampling on a real local Ray cluster of two nodes; each node replays a real recording instead of NVML."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

from tests.telemetry_traces import QUICKSTART, RUN, TUNED
from workbench.store import Store
from workbench.telemetry.nvml import TraceReader

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from workbench.telemetry.cluster import ClusterSampler  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def two_node_cluster(monkeypatch):
    # Ray's worker processes must import workbench, installed or not.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"node_b": 1})
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_rows_arrive_from_every_node_tagged_by_node(tmp_path, two_node_cluster):
    store = Store(tmp_path)
    replay = functools.partial(TraceReader, {0: QUICKSTART, 1: TUNED, 2: RUN}, speed=20.0, start_s=200.0)
    sampler = ClusterSampler(store, hz=10.0, reader_factory=replay, drain_every_s=0.5).start()
    try:
        deadline = time.monotonic() + 45
        while store.frame("samples").groupby("node").size().ge(20).sum() < 2:
            assert time.monotonic() < deadline, "no rows from both nodes in 45 s"
            time.sleep(0.5)
    finally:
        sampler.stop()

    samples = store.frame("samples")
    names = sampler.nodes()
    assert len(names) == 2 and set(samples["node"]) == set(names.values())
    for node in names.values():
        assert set(samples[samples["node"] == node]["gpu"]) == {0, 1, 2}
    # One sampler per node, placed by node: the nodes sampled are the ones holding node_a and node_b.
    holders = {n["NodeID"] for n in ray.nodes() if n["Alive"] and {"node_a", "node_b"} & set(n["Resources"])}
    assert set(names) == holders
    # Each node says once per GPU and metric what its recording lacks.
    events = store.frame("events")
    assert set(events["kind"]) == {"telemetry"}
    assert events["data"].map(lambda d: d["node"]).value_counts().to_dict() == {node: 3 * 7 for node in names.values()}
    assert {node: stats["achieved_hz"] for node, stats in sampler.node_stats().items()} == pytest.approx(
        {node: 10.0 for node in names.values()}, rel=0.3
    )
