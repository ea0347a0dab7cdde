"""The Prometheus endpoint serves a store's latest GPU samples and latest step."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.telemetry_traces import QUICKSTART, TUNED
from workbench.store import Store
from workbench.telemetry.nvml import TraceReader
from workbench.telemetry.prometheus import serve


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _fill(store: Store, reader: TraceReader, reads: int) -> list[dict]:
    rows = []
    for _ in range(reads):
        rows = [dict(r, node="h200") for r in reader.read()]
        store.add_samples(rows)
    return rows


def test_metrics_show_latest_samples_and_step(tmp_path):
    store = Store(tmp_path)
    latest = _fill(store, TraceReader({0: QUICKSTART, 1: TUNED}, speed=0.0, start_s=240.0), reads=20)
    store.add_step(1, 1, {"timing_s/step": 9.0, "timing_s/gen": 4.0, "perf/throughput": 1000.0})
    store.add_step(1, 2, {"timing_s/step": 8.5, "timing_s/gen": 3.5, "timing_s/update_actor": 2.0, "perf/throughput": 1234.5})
    server, port = serve(store, port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        metrics = _scrape(port)
        for row in latest:
            labels = (("gpu", str(row["gpu"])), ("node", "h200"))
            assert metrics[("workbench_gpu_utilization_percent", labels)] == row["util"]
            assert metrics[("workbench_gpu_power_watts", labels)] == row["power_w"]
            assert metrics[("workbench_gpu_sm_active_percent", labels)] == row["sm_active"]
            assert ("workbench_gpu_pcie_rx_mb_per_second", labels) not in metrics  # NaN: not recorded, not shown
        assert metrics[("workbench_step", ())] == 2
        assert metrics[("workbench_step_timing_seconds", (("phase", "gen"),))] == 3.5
        assert metrics[("workbench_step_timing_seconds", (("phase", "update_actor"),))] == 2.0
        assert metrics[("workbench_step_throughput_tokens_per_second", ())] == 1234.5

        # A later scrape sees rows written since.
        newer = _fill(store, TraceReader({0: QUICKSTART, 1: TUNED}, speed=0.0, start_s=0.0), reads=1)
        metrics = _scrape(port)
        assert metrics[("workbench_gpu_power_watts", (("gpu", "0"), ("node", "h200")))] == newer[0]["power_w"]
    finally:
        server.shutdown()
        server.server_close()


def test_empty_store_serves_no_values(tmp_path):
    server, port = serve(Store(tmp_path))
    try:
        assert _scrape(port) == {}
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_session_serves_its_metrics_for_prometheus(home):
    import time
    import urllib.request

    from workbench.session import Session

    session = Session.replay("h200-lora-critic-sync", speed=100, follow=False, prometheus_port=0)
    session.wait_for_step(2, timeout=120)
    deadline = time.time() + 30
    while "prometheus_url" not in session.meta and time.time() < deadline:
        time.sleep(0.2)
    url = session.meta["prometheus_url"]
    assert url.startswith("http://127.0.0.1:")
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'workbench_gpu_utilization_percent{' in text
    assert 'workbench_step_timing_seconds{phase="update_actor"}' in text
    assert "workbench_step_throughput_tokens_per_second" in text
    session.stop(now=True)
