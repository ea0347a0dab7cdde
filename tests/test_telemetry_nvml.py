"""GPU readers: NVML where a GPU exists (else the clear 'no NVML' message), and the replay of real recordings."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import pytest

from tests.telemetry_traces import QUICKSTART, RUN, TUNED
from workbench.cli.telemetry import CsvSink
from workbench.store import SAMPLE_COLUMNS, Store
from workbench.telemetry.nvml import (
    METRICS,
    NO_NVML_MESSAGE,
    NvmlReader,
    NvmlUnavailable,
    TraceReader,
    counter_delta,
    parse_gpu_list,
    read_recording,
)
from workbench.telemetry.sampler import EXIT_NO_NVML


def _nvml_present() -> bool:
    try:
        NvmlReader().close()
        return True
    except NvmlUnavailable:
        return False


HAS_NVML = _nvml_present()
needs_no_nvml = pytest.mark.skipif(HAS_NVML, reason="this machine has NVML; the no-GPU message can't be seen here")


@needs_no_nvml
def test_no_nvml_raises_a_clear_message():
    with pytest.raises(NvmlUnavailable) as caught:
        NvmlReader()
    message = str(caught.value)
    assert message.startswith(NO_NVML_MESSAGE)
    assert "live telemetry needs a GPU" in message and "replayed samples are shown instead" in message


@pytest.mark.slow
@needs_no_nvml
def test_sampler_process_without_nvml_says_so_and_records_it(tmp_path):
    Store(tmp_path).close()
    done = subprocess.run(
        [sys.executable, "-m", "workbench.telemetry.sampler", "--session", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == EXIT_NO_NVML
    assert NO_NVML_MESSAGE in done.stderr
    events = Store(tmp_path).frame("events")
    assert list(events["kind"]) == ["telemetry"] and NO_NVML_MESSAGE in events["text"].iloc[0]


@pytest.mark.slow
@needs_no_nvml
def test_selftest_without_nvml_prints_json_reason():
    done = subprocess.run([sys.executable, "-m", "workbench.telemetry.selftest"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_NO_NVML
    report = json.loads(done.stdout)
    assert report["nvml"] is False and report["error"].startswith(NO_NVML_MESSAGE)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_NVML, reason="needs NVML (an NVIDIA driver)")
def test_nvml_reader_reads_every_gpu():
    with NvmlReader() as reader:
        rows = reader.read()
        assert [r["gpu"] for r in rows] == reader.gpus()
        for row in rows:
            assert set(METRICS) <= set(row)
            assert row["mem_total"] > 0 and not math.isnan(row["util"])
        # Every NaN has a reason, except GPM's first interval, which may be too short to average.
        reasons = reader.nan_reasons()
        row = reader.read()[0]
        unexplained = [m for m in METRICS if math.isnan(row[m]) and (row["gpu"], m) not in reasons]
        assert unexplained in ([], ["dram_active"])


def test_counter_delta_undoes_one_wrap():
    assert counter_delta(100, 350, 32) == 250
    assert counter_delta(2**32 - 50, 70, 32) == 120
    assert counter_delta(2**64 - 1, 0, 64) == 1


def test_parse_gpu_list():
    assert parse_gpu_list("0,1, 3") == [0, 1, 3]
    assert parse_gpu_list(None) is None and parse_gpu_list("") is None


def test_recording_maps_columns_and_leaves_the_unrecorded_nan():
    frame = read_recording(RUN)
    first = frame.iloc[0]
    # First line of the recording: 1796055672.845,8,1,615,119.6,1980,0.0,0.0,0.0
    assert (first["t"], first["util"], first["mem_used"], first["power_w"], first["sm_clock"]) == (1796055672.845, 8, 615, 119.6, 1980)
    assert first["sm_active"] == 0.0 and first["sm_occupancy"] == 0.0
    for metric in ("mem_total", "tensor_active", "dram_active", "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx"):
        assert frame[metric].isna().all()


def test_trace_reader_replays_by_the_clock_and_loops():
    recording = read_recording(QUICKSTART)
    offsets = recording["t"] - recording["t"].iloc[0]
    frozen_at = 240.0  # speed 0 holds the position, so the row is known
    reader = TraceReader({0: QUICKSTART, 3: TUNED}, speed=0.0, start_s=frozen_at)
    assert reader.gpus() == [0, 3]
    row = reader.read()[0]
    expected = recording[offsets <= frozen_at].iloc[-1]
    assert row["gpu"] == 0 and row["util"] == expected["util"] and row["power_w"] == expected["power_w"]
    assert math.isnan(row["tensor_active"])
    looped = TraceReader({0: QUICKSTART}, speed=0.0, start_s=offsets.iloc[-1] + frozen_at).read()[0]
    assert looped["power_w"] == expected["power_w"]
    assert reader.nan_reasons()[(3, "pcie_rx")] == f"GPU 3: pcie_rx not recorded in {TUNED.name}"
    assert reader.processes() == []


def test_trace_reader_runs_at_the_asked_speed():
    recording = read_recording(RUN)
    offsets = (recording["t"] - recording["t"].iloc[0]).to_numpy()
    now = iter([1000.0, 1000.0, 1002.5, 1010.0])  # construction, then three reads
    reader = TraceReader({0: RUN}, speed=40.0, start_s=100.0, clock=lambda: next(now))
    for wall in (1000.0, 1002.5, 1010.0):
        row = reader.read()[0]
        position = (100.0 + (wall - 1000.0) * 40.0) % offsets[-1]  # 100 s, 200 s, then 500 s into the recording
        expected = recording[offsets <= position].iloc[-1]
        assert row["t"] == wall and row["power_w"] == expected["power_w"] and row["util"] == expected["util"]


def test_sample_csv_replays_through_the_trace_reader(tmp_path):
    rows = [dict(r, node="n") for r in TraceReader({0: QUICKSTART}, speed=0.0, start_s=240.0).read()]
    out = io.StringIO()
    CsvSink(out).add_samples(rows)
    path = tmp_path / "sample.csv"
    path.write_text(out.getvalue())
    assert out.getvalue().splitlines()[0] == ",".join(SAMPLE_COLUMNS)
    replayed = read_recording(path).iloc[0]
    for metric in METRICS:
        assert replayed[metric] == rows[0][metric] or (math.isnan(replayed[metric]) and math.isnan(rows[0][metric]))
