"""The dashboard's live tick reads only what is new and draws exactly what a full computation draws.

Stores here are SYNTHETIC (made-up samples written by the tests). Each incremental or position-based computation is
compared with a straightforward one: pandas groupby over the raw rows, or over the bucket frame.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from widgets.charts import TimeAxis
from widgets.events import balance_table
from widgets.feed import STEP_METRICS, WINDOW_METRICS, Buckets, Feed
from widgets.placement import gpu_memory
from widgets.step_breakdown import StepBreakdownPanel
from widgets.utilization import METRICS, utilization_figure
from workbench.session import Session
from workbench.store import Store

T0 = 1_000_000.0
NODES = ("node-b", "node-a")  # written out of order: lines and rows come sorted by node, then GPU
HZ = 10


def synthetic_rows(start: int, count: int) -> list[dict]:
    """SYNTHETIC samples number start .. start+count-1 at 10 Hz on 2 nodes x 2 GPUs; power unknown on every third,
    SM activity on every fifth (a GPU that couldn't say)."""
    rows = []
    for i in range(start, start + count):
        for n, node in enumerate(NODES):
            for gpu in (0, 1):
                k = i * 4 + n * 2 + gpu
                rows.append({"t": T0 + i / HZ, "node": node, "gpu": gpu, "util": float((k * 37) % 101),
                             "sm_active": None if i % 5 == 0 else float((k * 13) % 97),
                             "mem_used": 1000.0 + k % 50, "mem_total": 80000.0 + n,
                             "power_w": None if i % 3 == 0 else 100.0 + k % 7})
    return rows


@pytest.fixture
def live(tmp_path):
    """(read-only Session, writer Store) of a SYNTHETIC session store."""
    writer = Store(tmp_path / "synthetic")
    yield Session(tmp_path / "synthetic", read_only=True), writer
    writer.close()


def reference_buckets(raw: pd.DataFrame, every_s: float, window_s: float, metrics) -> pd.DataFrame:
    """The window computed the plain way: every raw row grouped per (bucket, node, gpu); the buckets that start at
    most window_s before the newest one."""
    raw = raw.assign(bucket=np.trunc(raw["t"] / every_s).astype(np.int64))
    grouped = raw.groupby(["bucket", "node", "gpu"], sort=True)
    out = grouped.size().rename("n").to_frame()
    for m in metrics:
        out[m], out[f"{m}_min"], out[f"{m}_max"] = grouped[m].mean(), grouped[m].min(), grouped[m].max()
    out = out.reset_index()
    out.insert(0, "t", out.pop("bucket") * every_s)
    return out[out["t"] >= out["t"].max() - window_s].reset_index(drop=True)


@pytest.mark.parametrize("every_s, window_s, metrics", [(1.0, 4.0, WINDOW_METRICS), (0.4, 2.0, STEP_METRICS)])
def test_a_window_kept_current_tick_by_tick_equals_a_fresh_read_and_the_plain_computation(live, every_s, window_s,
                                                                                          metrics):
    session, writer = live
    writer.add_samples(synthetic_rows(0, 35))
    window = Buckets(every_s, metrics)
    window.read(session, window_s)
    # Ticks of 0.5 s of samples, some ending inside a bucket still filling; one tick with nothing new.
    for start, count in ((35, 5), (40, 3), (43, 0), (43, 7), (50, 12), (62, 1)):
        writer.add_samples(synthetic_rows(start, count))
        held = window.read(session, window_s)
        fresh = Buckets(every_s, metrics).read(session, window_s)
        pd.testing.assert_frame_equal(held, fresh)  # what a page opened now would show, to the bit
        expected = reference_buckets(session.samples(), every_s, window_s, metrics)  # every raw row
        assert held[["t", "node", "gpu", "n"]].astype({"node": object}).equals(
            expected[["t", "node", "gpu", "n"]].astype({"node": object}))
        for m in metrics:
            assert np.allclose(held[m], expected[m], rtol=1e-12, equal_nan=True), m  # SQL's and numpy's sums
            for extreme in (f"{m}_min", f"{m}_max"):
                assert np.array_equal(held[extreme], expected[extreme], equal_nan=True), extreme
    assert held["t"].is_monotonic_increasing and held["t"].iloc[-1] == np.trunc((T0 + 62 / HZ) / every_s) * every_s


def test_a_grown_window_is_read_whole_again(live):
    session, writer = live
    writer.add_samples(synthetic_rows(0, 100))
    window = Buckets(1.0, STEP_METRICS)
    assert len(window.read(session, 2.0)) == 3 * 4  # 3 whole buckets x 4 GPUs
    grown = window.read(session, 6.0)
    pd.testing.assert_frame_equal(grown, Buckets(1.0, STEP_METRICS).read(session, 6.0))
    assert len(grown) == 7 * 4 and grown["n"].iloc[0] == HZ  # the oldest bucket whole, not cut by the window


def bucket_frame(live) -> pd.DataFrame:
    session, writer = live
    writer.add_samples(synthetic_rows(0, 300))
    frame = session.samples(every_s=3.0, metrics=WINDOW_METRICS)
    frame.loc[frame.index % 7 == 0, ["util", "mem_used_max"]] = np.nan
    return frame


def one_node(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[frame["node"] == "node-a"].reset_index(drop=True)


@pytest.mark.parametrize("nodes", ["two", "one"])
@pytest.mark.parametrize("metric", list(METRICS))
def test_the_utilization_chart_draws_each_gpus_own_buckets(live, nodes, metric):
    frame = bucket_frame(live) if nodes == "two" else one_node(bucket_frame(live))
    axis = TimeAxis(T0)
    data, _ = utilization_figure(frame, None, None, metric, 0, axis)
    lines = [trace for trace in data if trace["name"] != "events"]
    multi = nodes == "two"
    expected = list(frame.groupby(["node", "gpu"] if multi else ["gpu"], sort=True))
    assert [trace["name"] for trace in lines] == [
        f"{key[0]}:GPU {key[1]}" if multi else f"GPU {key[0]}" for key, _ in expected]
    scale = METRICS[metric][2]
    for trace, (_, group) in zip(lines, expected):  # fewer buckets than points per line: no downsampling
        assert np.array_equal(trace["x"], axis.minutes(group["t"]))
        assert np.array_equal(trace["y"], group[metric].to_numpy() * scale, equal_nan=True)


@pytest.mark.parametrize("nodes", ["two", "one"])
def test_the_balance_table_and_the_planners_memory_summarise_each_gpu(live, nodes):
    frame = bucket_frame(live) if nodes == "two" else one_node(bucket_frame(live))
    rows, notes = balance_table(frame)
    groups = list(frame.groupby(["node", "gpu"], sort=True))
    assert [row[0] for row in rows] == [f"{node}:{gpu}" if nodes == "two" else gpu for (node, gpu), _ in groups]
    for row, (_, group) in zip(rows, groups):
        ok = group["util"].notna()
        assert row[1] == pytest.approx(np.average(group["util"][ok], weights=group["n"][ok]))
        peak, total = group["mem_used_max"].max() / 1024, group["mem_total"].max() / 1024
        assert row[4] == f"{peak:.3g} / {total:.3g}"
    assert notes and notes[-1].startswith("mean utilization across GPUs")
    newest = frame.sort_values("t", kind="stable").groupby("gpu").tail(1)
    assert gpu_memory(frame) == {int(r.gpu): (r.mem_used, r.mem_total) for r in newest.itertuples()}


def test_rows_without_a_node_are_left_out_of_per_node_summaries(live):
    frame = bucket_frame(live)
    frame.loc[frame["node"] == "node-b", "node"] = None
    rows, _ = balance_table(frame)
    assert [row[0] for row in rows] == [0, 1]  # node-a's GPUs only, as pandas' groupby leaves them


def test_the_step_chart_is_sent_again_only_when_a_shown_step_moved():
    """SYNTHETIC steps of 10 s and per-second utilization buckets."""
    panel = StepBreakdownPanel(ctx=None)
    ends = T0 + 10.0 * np.arange(1, 4)
    steps = pd.DataFrame({"segment_id": 1, "step": [1, 2, 3], "t": ends, "timing_s/step": 10.0, "timing_s/gen": 6.0})
    seconds = pd.DataFrame({"t": T0 + np.arange(30.0), "util": 50.0, "n": 10})
    feed = SimpleNamespace(steps=steps, step_samples=seconds)
    panel.show(panel.prepare(feed, {"steps", "step_samples"}))
    drawn = panel.chart.revision
    feed.step_samples = pd.concat([seconds, pd.DataFrame({"t": [T0 + 31.0], "util": [99.0], "n": [10]})])
    assert panel.prepare(feed, {"step_samples"}) is None  # a sample after the last step: nothing moved
    feed.step_samples = seconds.assign(util=np.where(seconds["t"] >= T0 + 25.0, 100.0, 50.0))
    panel.show(panel.prepare(feed, {"step_samples"}))  # the last step's bucket still filled: its share moved
    assert panel.chart.revision == drawn + 1
    busy = panel.chart.trace("GPU busy %")["y"]
    assert busy.tolist() == [50.0, 50.0, 75.0]  # half of the third step's seconds at 100 %


def test_a_tick_never_waits_for_the_advice_reading_the_store(live, monkeypatch):
    """The advice reads every sample of a session (seconds on a long one): on a connection of its own, a tick's
    reads go on meanwhile."""
    session, writer = live
    writer.add_samples(synthetic_rows(0, 20))
    reading, release = threading.Event(), threading.Event()

    def long_advice(handle, *_):  # holds its store connection as a long read does
        with handle._store._lock:
            reading.set()
            release.wait(60)
        return []

    monkeypatch.setattr(Session, "advice_findings", long_advice)
    monkeypatch.setattr(Feed, "_derive", lambda self, changed: set())  # no derived reads (knob table: verl)
    feed = Feed(session, window_min=1)
    try:
        feed.read()  # starts the advice
        assert reading.wait(30)
        writer.add_samples(synthetic_rows(20, 5))
        tick = threading.Thread(target=feed.read, daemon=True)
        tick.start()
        tick.join(10)
        assert not tick.is_alive(), "the tick waited for the advice's read"
        assert feed.samples["t"].iloc[-1] == pytest.approx(T0 + 24 / HZ)  # its news read: the newest bucket
    finally:
        release.set()
        feed.wait_for_advice()
