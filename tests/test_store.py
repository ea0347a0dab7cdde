"""The session store: WAL, incremental reads, DataFrames, atomic command claims, batched writes, read-only."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.store import SAMPLE_COLUMNS, STORE_FILE, Store, StoreError
from workbench.telemetry.nvml import read_recording

REPO = Path(__file__).resolve().parents[1]
NVML_TRACE = REPO / "tests" / "data" / "h200_2026-11-30" / "A_nvml.csv"


def test_wal_lets_a_reader_read_while_a_writer_holds_its_transaction(tmp_path):
    store = Store(tmp_path)
    assert (tmp_path / STORE_FILE).exists()
    store.add_event("note", "committed")
    with sqlite3.connect(store.path) as probe:
        assert probe.execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    writer = sqlite3.connect(store.path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO events(t, kind, text, data_json) VALUES(0, 'note', 'uncommitted', '{}')")
    reader = Store(tmp_path, readonly=True)
    started = time.time()
    assert [r["text"] for r in reader.rows("events")] == ["committed"]
    assert time.time() - started < 10  # a blocked reader would wait for the 30 s busy timeout
    writer.execute("COMMIT")
    assert [r["text"] for r in reader.rows("events")] == ["committed", "uncommitted"]


def test_readers_resume_from_the_last_row_id_they_saw(tmp_path):
    store = Store(tmp_path)
    segment = store.begin_segment("{}", reason="start")
    for step in range(1, 6):
        store.add_step(segment, step, {"timing_s/step": 1.5 * step})
    first = store.rows("steps", limit=2)
    rest = store.rows("steps", since_id=first[-1]["id"])
    assert [r["step"] for r in first + rest] == [1, 2, 3, 4, 5]
    assert rest[-1]["id"] == store.max_id("steps")
    assert store.rows("steps", since_id=store.max_id("steps")) == []
    assert store.frame("steps", since_id=first[-1]["id"])["step"].tolist() == [3, 4, 5]
    assert first[0]["metrics"] == {"timing_s/step": 1.5}
    assert store.frame("steps", since_id=store.max_id("steps")).empty
    with pytest.raises(StoreError, match="unknown table"):
        store.rows("sqlite_master")


def test_frames_expand_json_columns(tmp_path):
    store = Store(tmp_path)
    segment = store.begin_segment("{}")
    store.add_step(segment, 1, {"timing_s/step": 2.0, "perf/throughput": np.float32(1500.5), "actor/lr": 1e-6})
    store.add_step(segment, 2, {"timing_s/step": float("nan"), "perf/throughput": 1600, "only_here": 7})
    steps = store.frame("steps")
    assert "metrics_json" not in steps.columns
    assert steps["perf/throughput"].tolist() == [1500.5, 1600.0]
    assert steps["timing_s/step"].dtype == "float64" and math.isnan(steps["timing_s/step"].iloc[1])
    assert math.isnan(steps["only_here"].iloc[0]) and steps["only_here"].iloc[1] == 7

    store.add_event("applied", "hot", {"from_step": 3, "changes": {"actor_token_budget": 8192}})
    assert store.frame("events")["data"].iloc[0] == {"from_step": 3, "changes": {"actor_token_budget": 8192}}
    store.put_command("apply", {"changes": {"actor_token_budget": 8192}})
    assert store.frame("commands")["payload"].iloc[0] == {"changes": {"actor_token_budget": 8192}}

    # A real NVML trace (5 Hz, one H200) round-trips, NaN where the recorder had no column.
    trace = read_recording(NVML_TRACE).assign(gpu=0, node="h200")
    store.add_samples(trace.to_dict("records"))
    samples = store.frame("samples")
    assert len(samples) == len(trace)
    assert samples["power_w"].tolist() == trace["power_w"].tolist()
    assert samples["t"].tolist() == trace["t"].tolist()
    assert samples["pcie_tx"].isna().all()


CLAIMER = """
import json, sys, time
from workbench.store import Store
store, name = Store(sys.argv[1]), sys.argv[2]
store.set_meta(**{"ready_" + name: True})
claimed = []
while True:
    done = store.meta().get("done")  # read before taking: the take after "done" drains what is left
    claimed += [c["id"] for c in store.take_commands(kinds=["work"], taker=name)]
    if done:
        break
    # Let the other claimer in: SQLite's busy handler backs off, so a claimer that never paused would starve it.
    time.sleep(0.001)
print(json.dumps(claimed))
"""


@pytest.mark.slow
def test_two_processes_never_claim_the_same_command(tmp_path):
    store = Store(tmp_path)
    names = ("left", "right")
    claimers = [
        subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path), name], cwd=REPO, stdout=subprocess.PIPE, text=True)
        for name in names
    ]
    deadline = time.time() + 120
    while not all(store.meta().get(f"ready_{name}") for name in names):
        assert time.time() < deadline and all(p.poll() is None for p in claimers), "claimers did not start"
        time.sleep(0.05)
    other = store.put_command("not_for_them")
    # Bursts of work until both claimers have won some: claims that raced each other.
    work: list[int] = []
    while not set(names) <= {c["state"] for c in store.rows("commands")}:
        assert time.time() < deadline, "one claimer never won a claim"
        work += [store.put_command("work", {"n": len(work)}) for _ in range(10)]
        time.sleep(0.01)
    work += [store.put_command("work", {"n": len(work)}) for _ in range(10)]
    store.set_meta(done=True)
    claimed = [json.loads(p.communicate(timeout=120)[0]) for p in claimers]

    assert not set(claimed[0]) & set(claimed[1])
    assert sorted(claimed[0] + claimed[1]) == work
    states = {c["id"]: c["state"] for c in store.rows("commands")}
    for name, ids in zip(names, claimed):
        assert {states[i] for i in ids} <= {name}
    assert states[other] == "queued"


def test_a_batch_of_rows_is_one_transaction(tmp_path):
    store = Store(tmp_path)
    statements: list[str] = []
    store._db.set_trace_callback(statements.append)
    rows = [{"t": 1000.0 + i / 10, "gpu": gpu, "util": 50.0, "mem_used": 1024.0} for i in range(1000) for gpu in range(8)]
    store.add_samples(rows)
    store.add_samples([])  # nothing to write: no transaction either
    assert statements.count("BEGIN IMMEDIATE") == 1 and statements.count("COMMIT") == 1
    assert store.max_id("samples") == 8000
    frame = store.frame("samples")
    assert list(frame.columns) == ["id", *SAMPLE_COLUMNS] and frame["gpu"].nunique() == 8


def test_read_only_stores_refuse_writes_and_missing_stores_are_not_created(tmp_path):
    for kwargs in ({"readonly": True}, {"create": False}):
        with pytest.raises(StoreError, match="no session store"):
            Store(tmp_path / "missing", **kwargs)
    assert not (tmp_path / "missing").exists()

    Store(tmp_path).add_event("note", "written by the owner")
    viewer = Store(tmp_path, readonly=True)
    writes = (
        lambda: viewer.add_event("note", "from a viewer"), lambda: viewer.put_command("stop"),
        lambda: viewer.set_meta(state="stopped"), lambda: viewer.add_samples([{"t": 1.0, "gpu": 0}]),
        lambda: viewer.take_commands(), lambda: viewer.begin_segment("{}"),
    )
    for write in writes:
        with pytest.raises(StoreError, match="read-only"):
            write()
    assert [r["text"] for r in viewer.rows("events")] == ["written by the owner"]
