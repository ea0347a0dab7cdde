"""Prometheus endpoint for a session: latest per-GPU sample values and the latest step's timings and throughput.

A custom collector reads the store at scrape time with the views' own queries (the newest sample per GPU, the newest
step), so a scrape costs the same an hour into a run as a minute in. Serves on loopback unless told otherwise: the session's numbers are not for the
whole network by default.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric

# Sample column → (metric name, help). Units are in the names, as Prometheus asks.
GPU_GAUGES = {
    "util": ("workbench_gpu_utilization_percent", "NVML GPU utilization: share of time a kernel ran"),
    "mem_used": ("workbench_gpu_memory_used_mib", "GPU memory in use (MiB)"),
    "mem_total": ("workbench_gpu_memory_total_mib", "GPU memory size (MiB)"),
    "power_w": ("workbench_gpu_power_watts", "GPU power draw"),
    "sm_clock": ("workbench_gpu_sm_clock_mhz", "SM clock"),
    "sm_active": ("workbench_gpu_sm_active_percent", "GPM: share of SMs busy"),
    "sm_occupancy": ("workbench_gpu_sm_occupancy_percent", "GPM: active warps vs the maximum"),
    "tensor_active": ("workbench_gpu_tensor_active_percent", "GPM: share of time tensor cores were busy"),
    "dram_active": ("workbench_gpu_dram_active_percent", "GPM: DRAM bandwidth used vs the maximum"),
    "pcie_tx": ("workbench_gpu_pcie_tx_mb_per_second", "PCIe traffic from the GPU (MB/s)"),
    "pcie_rx": ("workbench_gpu_pcie_rx_mb_per_second", "PCIe traffic to the GPU (MB/s)"),
    "nvlink_tx": ("workbench_gpu_nvlink_tx_mb_per_second", "NVLink data sent (MB/s)"),
    "nvlink_rx": ("workbench_gpu_nvlink_rx_mb_per_second", "NVLink data received (MB/s)"),
}


class StoreCollector:
    """Prometheus collector over one session store."""

    def __init__(self, store):
        self.store = store

    def _latest_samples(self) -> list[dict[str, Any]]:
        # The views' own query: the newest sample per GPU, from the rows of the last minute (an indexed range).
        return self.store.latest_samples().to_dict("records")

    def collect(self) -> Iterator[Metric]:
        rows = self._latest_samples()
        labels = ["node", "gpu"]
        for column, (name, help_text) in GPU_GAUGES.items():
            gauge = GaugeMetricFamily(name, help_text, labels=labels)
            for row in rows:
                if _known(row[column]):
                    gauge.add_metric([str(row["node"]), str(row["gpu"])], float(row[column]))
            yield gauge
        age = GaugeMetricFamily("workbench_gpu_sample_timestamp_seconds", "When the GPU was last sampled (unix time)", labels=labels)
        for row in rows:
            age.add_metric([str(row["node"]), str(row["gpu"])], float(row["t"]))
        yield age
        yield from self._step_metrics()

    def _step_metrics(self) -> Iterator[Metric]:
        last_id = self.store.max_id("steps")
        steps = self.store.rows("steps", since_id=last_id - 1) if last_id else []
        if not steps:
            return
        step = steps[-1]
        metrics = step["metrics"]
        yield GaugeMetricFamily("workbench_step", "Latest training step logged", value=float(step["step"]))
        timing = GaugeMetricFamily("workbench_step_timing_seconds", "Latest step's verl timing_s/* by phase", labels=["phase"])
        for key, value in metrics.items():
            if key.startswith("timing_s/") and _known(value):
                timing.add_metric([key[len("timing_s/"):]], float(value))
        yield timing
        if _known(metrics.get("perf/throughput")):
            yield GaugeMetricFamily(
                "workbench_step_throughput_tokens_per_second", "Latest step's verl perf/throughput (tokens/s per GPU)",
                value=float(metrics["perf/throughput"]),
            )


def _known(value: Any) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value)


def serve(store, port: int = 0, host: str = "127.0.0.1"):
    """Serve the session's metrics at http://host:port/metrics; port 0 picks a free one.
    Returns (server, port); server.shutdown() stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, server.server_port
