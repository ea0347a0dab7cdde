"""GPU readers behind one interface: live NVML (+GPM on Hopper and newer) and a replayed NVML recording.

A reader returns one sample row per GPU (the store's sample columns minus `node`, which the sampler adds), NaN
wherever the GPU can't say, and keeps a reason for every (gpu, metric) it could not read so the sampler can record
each reason once. Tests and machines without a GPU replay a real recording through the same interface.

Measured on an H200 (driver 580, nvidia-ml-py 13.610, 2026-11-30): a whole read of one GPU, every metric, takes
1–2.5 ms (GPM sample + metrics ~0.3 ms of it); the sampler at 10 Hz used 0.085 s of CPU in 11 s. But
nvmlDeviceGetPcieThroughput blocks ~21 ms per direction (it samples a 20 ms window), so PCIe comes from GPM, or from
the cumulative byte counters on GPUs without GPM; both agreed within a few % under a 30 GB/s copy load.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import pandas as pd

from ..store import SAMPLE_COLUMNS

NAN = float("nan")
MIB = 2**20
# Every value a reader reports per GPU (the sample columns except the keys t, node, gpu).
METRICS = tuple(c for c in SAMPLE_COLUMNS if c not in ("t", "node", "gpu"))

NO_NVML_MESSAGE = "no NVIDIA driver/NVML on this machine: live telemetry needs a GPU; replayed samples are shown instead"


class NvmlUnavailable(RuntimeError):
    """NVML can't start here (no driver, no library, no GPU); the message says so in plain words."""


class GpuReader(Protocol):
    """What the sampler needs from a source of GPU readings."""

    def gpus(self) -> list[int]:
        """The GPU indices this reader reports on."""

    def read(self) -> list[dict[str, Any]]:
        """One row per GPU now: t, gpu and every name in METRICS (NaN where the GPU can't say)."""

    def processes(self) -> list[dict[str, Any]]:
        """Compute processes now: one dict per (gpu, pid) with gpu, pid, mem_used (MiB)."""

    def nan_reasons(self) -> dict[tuple[int, str], str]:
        """Why (gpu, metric) is NaN, for every pair that has been; it only grows."""


def parse_gpu_list(text: str | None) -> list[int] | None:
    """'0,1' → [0, 1]; None or '' → None (all GPUs)."""
    if not text:
        return None
    return [int(part) for part in text.split(",") if part.strip()]


# ---------------------------------------------------------------------------------------------------------- NVML


def _start_nvml():
    """Import and initialise pynvml, or raise NvmlUnavailable saying why."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnavailable(f"{NO_NVML_MESSAGE} (the nvidia-ml-py package is not installed)") from e
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise NvmlUnavailable(f"{NO_NVML_MESSAGE} ({e})") from e
    return pynvml


# GPM metric per sample column. GPM averages over the interval between two samples, so at 10 Hz each value covers
# the last ~100 ms rather than an instant. PCIe rates come in MiB/s; the store keeps MB/s.
_GPM_METRICS = {
    "sm_active": ("NVML_GPM_METRIC_SM_UTIL", 1.0),
    "sm_occupancy": ("NVML_GPM_METRIC_SM_OCCUPANCY", 1.0),
    "tensor_active": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 1.0),
    "dram_active": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 1.0),
    "pcie_tx": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB / 1e6),
    "pcie_rx": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB / 1e6),
}
# Cumulative counters read as NVML field values: (field id name, bytes per unit). NVLink throughput counts KiB of
# data (no protocol overhead). The PCIe counters count bytes in 32 bits (H200) and wrap: one wrap between reads is
# undone; two would take over 43 GB/s at 10 Hz. They serve GPUs without GPM.
_NVLINK_FIELDS = {
    "nvlink_tx": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 1024),
    "nvlink_rx": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 1024),
}
_PCIE_FIELDS = {
    "pcie_tx": ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 1),
    "pcie_rx": ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 1),
}


class _Reasons:
    """The reader's (gpu, metric) → reason map; the first reason for a pair is kept."""

    def __init__(self) -> None:
        self.by_metric: dict[tuple[int, str], str] = {}

    def note(self, gpu: int, metrics: Sequence[str], what: str, error: Any) -> None:
        for metric in metrics:
            self.by_metric.setdefault((gpu, metric), f"GPU {gpu}: {metric} not available: {what}: {error}")


def counter_delta(previous: int, current: int, bits: int) -> int:
    """Increase of a counter that wraps at 2**bits (one wrap at most between reads)."""
    return (current - previous) % (1 << bits)


class _FieldCounters:
    """Cumulative NVML field counters → MB/s between consecutive reads (using NVML's own timestamps)."""

    # NVML value type → (union member, width in bits) for the counter types; the H200 reports its PCIe byte
    # counters as unsigned int (32 bit).
    _VALUE_TYPES = {1: ("uiVal", 32), 2: ("ulVal", 64), 3: ("ullVal", 64)}

    def __init__(self, nvml, handle, gpu: int, fields: Mapping[str, tuple[str, int]], what: str, reasons: _Reasons):
        self._nvml, self._handle, self._gpu, self._what, self._reasons = nvml, handle, gpu, what, reasons
        self._fields = {m: (getattr(nvml, name), unit) for m, (name, unit) in fields.items()}
        self._previous: dict[str, tuple[int, int]] = {}
        self.read()  # primes the counters and drops the ones this GPU doesn't have

    @property
    def metrics(self) -> tuple[str, ...]:
        return tuple(self._fields)

    def read(self) -> dict[str, float]:
        if not self._fields:
            return {}
        N = self._nvml
        try:
            values = N.nvmlDeviceGetFieldValues(self._handle, [fid for fid, _ in self._fields.values()])
        except N.NVMLError as e:
            self._reasons.note(self._gpu, list(self._fields), self._what, e)
            return dict.fromkeys(self._fields, NAN)
        out = {}
        for (metric, (_, unit)), value in zip(list(self._fields.items()), values):
            if value.nvmlReturn != N.NVML_SUCCESS:
                self._reasons.note(self._gpu, [metric], self._what, N.NVMLError(value.nvmlReturn))
                del self._fields[metric]  # not supported does not change while the process runs
                continue
            member, bits = self._VALUE_TYPES.get(value.valueType, ("ullVal", 64))
            count, stamp_us = getattr(value.value, member), value.timestamp
            out[metric] = NAN
            if metric in self._previous:
                last_count, last_us = self._previous[metric]
                if stamp_us > last_us:
                    out[metric] = counter_delta(last_count, count, bits) * unit / (stamp_us - last_us)  # B/µs = MB/s
            self._previous[metric] = (count, stamp_us)
        return out


class _Gpm:
    """GPM (Hopper and newer): two samples per GPU; each read averages the metrics over the time since the last read.
    Mirrors the struct handling of the proven reference sampler (shared/gpu/reference/nvml_sampler.py)."""

    def __init__(self, nvml, handle, gpu: int, metrics: Sequence[str], reasons: _Reasons):
        self._nvml, self._handle, self._gpu, self._reasons = nvml, handle, gpu, reasons
        self.metrics = tuple(metrics)
        self._ids = [getattr(nvml, _GPM_METRICS[m][0]) for m in self.metrics]
        self._previous = nvml.nvmlGpmSampleAlloc()
        self._current = nvml.nvmlGpmSampleAlloc()
        nvml.nvmlGpmSampleGet(handle, self._previous)

    def read(self) -> dict[str, float]:
        N = self._nvml
        try:
            N.nvmlGpmSampleGet(self._handle, self._current)
            request = N.c_nvmlGpmMetricsGet_t()
            request.version = N.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self._ids)
            request.sample1 = self._previous
            request.sample2 = self._current
            for i, metric_id in enumerate(self._ids):
                request.metrics[i].metricId = metric_id
            N.nvmlGpmMetricsGet(request)
        except N.NVMLError as e:
            self._reasons.note(self._gpu, self.metrics, "GPM", e)
            return dict.fromkeys(self.metrics, NAN)
        out = {}
        for i, metric in enumerate(self.metrics):
            result = request.metrics[i]
            if result.nvmlReturn == N.NVML_SUCCESS:
                out[metric] = result.value * _GPM_METRICS[metric][1]
            else:
                self._reasons.note(self._gpu, [metric], "GPM", N.NVMLError(result.nvmlReturn))
                out[metric] = NAN
        self._previous, self._current = self._current, self._previous
        return out

    def close(self) -> None:
        for sample in (self._previous, self._current):
            self._nvml.nvmlGpmSampleFree(sample)


class _NvmlGpu:
    """One GPU's handle and the metric sources it supports, chosen once at start."""

    def __init__(self, nvml, index: int, reasons: _Reasons):
        self._nvml, self.index, self._reasons = nvml, index, reasons
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(self.handle)
        self.name = name.decode() if isinstance(name, bytes) else name
        self.mem_total = nvml.nvmlDeviceGetMemoryInfo(self.handle).total / MIB
        self.gpm = self._open_gpm()
        pcie_from_gpm = self.gpm is not None and "pcie_tx" in self.gpm.metrics
        self.pcie = None if pcie_from_gpm else _FieldCounters(nvml, self.handle, index, _PCIE_FIELDS, "PCIe byte counters", reasons)
        self.nvlink = _FieldCounters(nvml, self.handle, index, _NVLINK_FIELDS, "NVLink throughput counters", reasons)

    def _open_gpm(self) -> _Gpm | None:
        N = self._nvml
        gpm_metrics = list(_GPM_METRICS)
        try:
            supported = bool(N.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice)
            if not supported:
                self._reasons.note(self.index, gpm_metrics, "GPM", "not supported on this GPU (needs Hopper or newer)")
                return None
            return _Gpm(N, self.handle, self.index, gpm_metrics, self._reasons)
        except N.NVMLError as e:
            self._reasons.note(self.index, gpm_metrics, "GPM", e)
            return None

    def _guarded(self, metric: str, what: str, read: Callable[[], float]) -> float:
        try:
            return float(read())
        except self._nvml.NVMLError as e:
            self._reasons.note(self.index, [metric], what, e)
            return NAN

    def read(self) -> dict[str, Any]:
        N, h = self._nvml, self.handle
        row: dict[str, Any] = {"t": time.time(), "gpu": self.index, "mem_total": self.mem_total}
        row["util"] = self._guarded("util", "utilization", lambda: N.nvmlDeviceGetUtilizationRates(h).gpu)
        row["mem_used"] = self._guarded("mem_used", "memory", lambda: N.nvmlDeviceGetMemoryInfo(h).used / MIB)
        row["power_w"] = self._guarded("power_w", "power", lambda: N.nvmlDeviceGetPowerUsage(h) / 1000.0)
        row["sm_clock"] = self._guarded("sm_clock", "SM clock", lambda: N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM))
        for source in (self.gpm, self.pcie, self.nvlink):
            if source is not None:
                row.update(source.read())
        for metric in METRICS:
            row.setdefault(metric, NAN)
        return row

    def compute_processes(self) -> list[tuple[int, float]]:
        N = self._nvml
        try:
            procs = N.nvmlDeviceGetComputeRunningProcesses(self.handle)
        except N.NVMLError as e:
            self._reasons.note(self.index, ["processes"], "compute process list", e)
            return []
        # usedGpuMemory is None where the driver can't say (e.g. some containers).
        return [(int(p.pid), p.usedGpuMemory / MIB if p.usedGpuMemory is not None else NAN) for p in procs]

    def describe(self) -> dict[str, Any]:
        return {
            "gpu": self.index,
            "name": self.name,
            "mem_total_mib": self.mem_total,
            "gpm": self.gpm is not None,
            "pcie_source": "GPM" if self.pcie is None else ("byte counters" if self.pcie.metrics else None),
            "nvlink": bool(self.nvlink.metrics),
        }


class NvmlReader:
    """Live readings of this machine's GPUs through NVML. Raises NvmlUnavailable where NVML can't start."""

    def __init__(self, gpus: Sequence[int] | None = None):
        self._nvml = _start_nvml()
        self._reasons = _Reasons()
        try:
            indices = list(gpus) if gpus is not None else list(range(self._nvml.nvmlDeviceGetCount()))
            self._gpus = {i: _NvmlGpu(self._nvml, i, self._reasons) for i in indices}
        except self._nvml.NVMLError as e:
            self._nvml.nvmlShutdown()
            raise NvmlUnavailable(f"NVML started but can't open GPUs {gpus if gpus is not None else 'all'}: {e}") from e

    def gpus(self) -> list[int]:
        return list(self._gpus)

    def read(self) -> list[dict[str, Any]]:
        return [gpu.read() for gpu in self._gpus.values()]

    def compute_processes(self, gpu: int) -> list[tuple[int, float]]:
        """(pid, used MiB) for each compute process on one GPU; MiB is NaN where the driver can't say."""
        return self._gpus[gpu].compute_processes()

    def processes(self) -> list[dict[str, Any]]:
        return [
            {"gpu": gpu, "pid": pid, "mem_used": mem}
            for gpu in self._gpus
            for pid, mem in self.compute_processes(gpu)
        ]

    def nan_reasons(self) -> dict[tuple[int, str], str]:
        return dict(self._reasons.by_metric)

    def describe(self) -> list[dict[str, Any]]:
        """Per GPU: name, memory, and which sources it supports (GPM, PCIe source, NVLink)."""
        return [gpu.describe() for gpu in self._gpus.values()]

    def driver_version(self) -> str:
        version = self._nvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version

    def close(self) -> None:
        for gpu in self._gpus.values():
            if gpu.gpm is not None:
                gpu.gpm.close()
        self._gpus = {}
        self._nvml.nvmlShutdown()

    def __enter__(self) -> "NvmlReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------- replay

# Column names of the reference NVML recordings (shared/gpu/reference/nvml_sampler.py) → sample columns.
# Their mem_util (memory-controller busy %) and gpm_graphics_util have no sample column and are dropped.
_RECORDING_COLUMNS = {
    "gpu_util": "util",
    "mem_used_MiB": "mem_used",
    "power_W": "power_w",
    "sm_clock_MHz": "sm_clock",
    "gpm_sm_util": "sm_active",
    "gpm_sm_occupancy": "sm_occupancy",
}


def read_recording(path: str | Path) -> pd.DataFrame:
    """One GPU's NVML recording as a frame with t and the sample metric columns (NaN where not recorded).
    Reads the reference recorder's CSV and CSVs in the store's own column names alike."""
    frame = pd.read_csv(path).rename(columns=_RECORDING_COLUMNS)
    out = pd.DataFrame({"t": frame["t"].astype("float64")})
    for metric in METRICS:
        out[metric] = frame[metric].astype("float64") if metric in frame else NAN
    return out


class TraceReader:
    """Replays real NVML recordings as if live: GPU g plays recording traces[g], timestamped now.

    Position in the recording follows `clock` (`speed` recorded seconds per second, starting `start_s` into the
    recording), looping at its end. A recording has no process list, so processes() is empty. Picklable, so a Ray
    actor on another node can be handed one (see cluster.py).
    """

    def __init__(
        self,
        traces: Mapping[int, str | Path],
        speed: float = 1.0,
        start_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ):
        self._clock = clock
        self._speed = speed
        self._start_s = start_s
        self._offsets: dict[int, np.ndarray] = {}
        self._values: dict[int, np.ndarray] = {}
        self._reasons: dict[tuple[int, str], str] = {}
        for gpu, path in traces.items():
            frame = read_recording(path)
            self._offsets[int(gpu)] = (frame["t"] - frame["t"].iloc[0]).to_numpy()
            self._values[int(gpu)] = frame[list(METRICS)].to_numpy()
            for metric in METRICS:
                if frame[metric].isna().all():
                    self._reasons[(int(gpu), metric)] = f"GPU {gpu}: {metric} not recorded in {Path(path).name}"
        self._started = clock()

    def gpus(self) -> list[int]:
        return list(self._values)

    def read(self) -> list[dict[str, Any]]:
        now = self._clock()
        position = self._start_s + (now - self._started) * self._speed
        rows = []
        for gpu, offsets in self._offsets.items():
            within = math.fmod(position, offsets[-1]) if offsets[-1] > 0 else 0.0
            index = max(0, int(np.searchsorted(offsets, within, side="right")) - 1)
            row = {"t": now, "gpu": gpu}
            row.update(zip(METRICS, self._values[gpu][index].tolist()))
            rows.append(row)
        return rows

    def processes(self) -> list[dict[str, Any]]:
        return []

    def nan_reasons(self) -> dict[tuple[int, str], str]:
        return dict(self._reasons)
