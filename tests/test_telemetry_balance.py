"""Balance verdicts over real recordings: they fire where GPUs are unevenly loaded and stay silent where not."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest

from tests.telemetry_traces import QUICKSTART, RUN, STARTUP, STEADY, TUNED, stretch
from workbench.cli.telemetry import add_telemetry_commands, step_start_time
from workbench.store import Store
from workbench.telemetry.balance import THRESHOLDS, balance_frame, balance_verdicts


def balanced() -> pd.DataFrame:
    """Two GPUs both in steady PPO steps (quickstart and tuned plans): ~54% and ~56% busy."""
    return pd.concat([stretch(QUICKSTART, 0, STEADY), stretch(TUNED, 1, STEADY)])


def imbalanced() -> pd.DataFrame:
    """GPU 0 in steady PPO steps while GPU 1 sits idle (the start-up of another recording)."""
    return pd.concat([stretch(QUICKSTART, 0, STEADY), stretch(RUN, 1, STARTUP)])


def test_balance_frame_summarises_each_gpu():
    frame = balance_frame(balanced())
    assert list(frame[["node", "gpu"]].itertuples(index=False, name=None)) == [("h200", 0), ("h200", 1)]
    steady = stretch(QUICKSTART, 0, STEADY)
    row = frame.iloc[0]
    assert row["samples"] == len(steady)
    assert row["util_mean"] == pytest.approx(steady["util"].mean())
    assert row["util_p90"] == pytest.approx(steady["util"].quantile(0.9))
    assert row["idle_share"] == pytest.approx((steady["util"] == 0).mean())
    assert row["mem_used_max"] == steady["mem_used"].max()
    assert row["sm_active_mean"] == pytest.approx(steady["sm_active"].mean())
    assert pd.isna(row["mem_total"]) and pd.isna(row["pcie_rx_mean"])  # not recorded


def test_verdicts_silent_on_a_balanced_run():
    assert balance_verdicts(balance_frame(balanced())) == []


def test_verdicts_fire_on_an_imbalanced_run():
    verdicts = balance_verdicts(balance_frame(imbalanced()))
    assert len(verdicts) == 2
    assert verdicts[0].startswith("utilization spread ") and f"> {THRESHOLDS.util_spread_points:.0f}: imbalanced" in verdicts[0]
    assert verdicts[1].startswith("GPU 1 idle ") and verdicts[1].endswith("% of the time")


def two_phases(t0: float = 0.0) -> pd.DataFrame:
    """130 s with GPU 1 idle while GPU 0 works, then 130 s with both working (starting at t0 + 130)."""
    phase = STEADY[1] - STEADY[0]
    return pd.concat([
        stretch(QUICKSTART, 0, STEADY, t0=t0), stretch(RUN, 1, (0.0, phase), t0=t0),
        stretch(QUICKSTART, 0, STEADY, t0=t0 + phase), stretch(TUNED, 1, STEADY, t0=t0 + phase),
    ])


def test_window_limits_the_verdicts():
    samples = two_phases()
    assert len(balance_verdicts(balance_frame(samples, t0=0, t1=129.9))) == 2
    assert balance_verdicts(balance_frame(samples, t0=130)) == []


def test_pcie_and_memory_verdicts():
    # The recordings hold no PCIe or memory total, so this frame is made up: one GPU saturating PCIe RX, one full.
    frame = pd.DataFrame({
        "node": ["a", "b"], "gpu": [0, 0], "util_mean": [50.0, 52.0], "idle_share": [0.1, 0.1],
        "mem_used_max": [60_000.0, 140_000.0], "mem_total": [143_771.0, 143_771.0],
        "mem_used_share": [60_000 / 143_771, 140_000 / 143_771],
        "pcie_tx_p90": [1_000.0, 1_000.0], "pcie_rx_p90": [55_000.0, 1_000.0],
    })
    verdicts = balance_verdicts(frame)
    assert verdicts == [
        "PCIe RX (to GPU) near saturation on a GPU 0: 55 GB/s at the 90th percentile > 50 GB/s",
        "b GPU 0 memory 97% full at peak (136.7 of 140.4 GiB): little headroom",
    ]


def _session_with_steps(tmp_path) -> Store:
    """Step 1 (t 1000–1130): GPU 1 idle; step 2 (t 1130–1260): both GPUs busy."""
    store = Store(tmp_path)
    store.add_samples(two_phases(t0=1000.0).to_dict("records"))
    store.add_step(1, 1, {"timing_s/step": 130.0}, t=1130.0)
    store.add_step(1, 2, {"timing_s/step": 130.0}, t=1260.0)
    return store


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_telemetry_commands(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_balance_command_prints_table_and_verdicts(tmp_path, capsys):
    _session_with_steps(tmp_path)
    assert _cli(["balance", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "util_mean" in out and "idle_share" in out
    assert "- GPU 1 idle 53% of the time" in out  # idle through all of step 1: half the session

    assert _cli(["balance", str(tmp_path), "--since-step", "2"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("no imbalance found")

    assert _cli(["balance", str(tmp_path), "--since-step", "7"]) == 2
    assert "no step 7 in this session (steps logged: 1..2)" in capsys.readouterr().err

    assert _cli(["balance", str(tmp_path / "nowhere")]) == 2
    assert "not a session directory" in capsys.readouterr().err


def test_step_start_time_uses_the_step_duration(tmp_path):
    steps = _session_with_steps(tmp_path).frame("steps")
    assert step_start_time(steps, 2) == 1130.0
    assert step_start_time(steps, 1) == 1000.0
