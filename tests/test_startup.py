"""workbench.startup on real H200 logs (tests/data/startup/README.md says where each comes from)."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from workbench.startup import COLUMNS, launches, parse_startup, read_log, summary

DATA = Path(__file__).parent / "data" / "startup"
UTC = timezone.utc


def log(name: str) -> str:
    return read_log(DATA / name)


def test_cold_start_at_info_level_has_every_phase_in_order():
    phases = parse_startup(log("h200_run_2026-11-30_log.txt.gz"), tz=UTC)
    assert list(phases.columns) == COLUMNS
    names = list(phases["phase"])
    for expected in ("Ray start", "TaskRunner, TransferQueue, dataloader", "critic worker: model + FSDP",
                     "actor/ref worker: model + FSDP", "vLLM server: process, imports, config", "vLLM engine core spawn",
                     "vLLM model load", "vLLM memory profiling (KV cache size)", "trainer ready"):
        assert expected in names
    assert names.index("critic worker: model + FSDP") < names.index("vLLM engine core spawn") < names.index("trainer ready")
    assert (phases["seconds"] >= 0).all()
    assert phases["start"].is_monotonic_increasing
    # Figures read by hand from the log's own stamps: Ray up 16:26:28.359, dataloader 16:27:04.546, vLLM server
    # resolved its config at 16:28:26, engine core started 16:28:47.
    by = phases.set_index("phase")["seconds"]
    assert by["TaskRunner, TransferQueue, dataloader"] == pytest.approx(36.19, abs=0.01)
    assert by["vLLM engine core spawn"] == pytest.approx(21.0)
    assert abs(phases["start"].iloc[0] - pd.Timestamp("2026-11-30 16:26:24.586", tz="UTC")) < pd.Timedelta("1ms")


def test_first_step_end_estimate_agrees_with_the_watcher():
    phases = parse_startup(log("h200_run_2026-11-30_log.txt.gz"), tz=UTC)
    last = phases.iloc[-1]
    assert last["phase"].startswith("first step: generation + training (step 1, verl timing 30.4 s")
    assert last["source"] == "estimate"
    landed = [float(x.split()[2]) for x in (DATA / "h200_run_2026-11-30_timeline.txt").read_text().splitlines()
              if x.startswith("T_metrics_line 1 ")][0]
    assert abs(last["end"].timestamp() - landed) < 2.0  # the watcher polled once a second


def test_warn_level_vllm_shows_as_one_engine_phase_and_graph_bars():
    phases = parse_startup(log("h200_quickstart_2026-12-01_log.txt.gz"), tz=UTC)
    names = list(phases["phase"])
    assert any(n.startswith("vLLM engine: spawn, load, compile") for n in names)
    assert "vLLM engine core spawn" not in names
    assert set(phases.attrs["cuda_graph_bars_s"]) == {"mixed prefill-decode, PIECEWISE", "decode, FULL"}
    s = summary(phases)
    assert 140 < s["to_ready_s"] < 150  # Ray 07:13:50.751 -> ready to fit 07:16:17.331
    assert s["total_s"] > s["to_ready_s"]


def test_resumed_segment_with_store_times():
    launched = datetime(2026, 11, 30, 18, 22, 3, 289345, tzinfo=UTC).timestamp()
    first_step = datetime(2026, 11, 30, 18, 25, 1, 939890, tzinfo=UTC).timestamp()
    phases = parse_startup(log("h200_proof_segment3_resumed.log.gz"), launched_at=launched, first_step_end=first_step, tz=UTC)
    assert phases["phase"].iloc[0] == "python imports, config validation"
    assert phases["seconds"].iloc[0] == pytest.approx(11.23, abs=0.01)  # launch -> Ray's first line 18:22:14.524
    assert "resume: load checkpoint" in set(phases["phase"])
    assert phases.iloc[-1]["source"] == "store"
    assert phases.iloc[-1]["phase"].startswith("first step: generation + training (step 14")
    assert summary(phases)["total_s"] == pytest.approx(first_step - launched, abs=0.1)


def test_relaunches_in_one_log_are_split_and_empty_text_is_empty():
    text = log("h200_run_2026-11-30_log.txt.gz")
    assert len(launches(text + "\n" + text)) == 2
    a = parse_startup(text, tz=UTC)
    b = parse_startup(text + "\n" + text, tz=UTC, launch=0)
    pd.testing.assert_frame_equal(a, b)
    assert parse_startup("", tz=UTC).empty
    assert summary(parse_startup("no timestamps here\n", tz=UTC))["total_s"] is None


def test_segments_keep_compile_caches_in_the_session_and_log_vllm_at_info(tmp_path, monkeypatch):
    from tests.test_runtime_config import verl_like_config
    from workbench.runner import runtime

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("WORKBENCH_COMPILE_CACHE", raising=False)
    config, _ = runtime.runtime_config(verl_like_config(), tmp_path)
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env["VLLM_LOGGING_LEVEL"] == "INFO"
    assert env["VLLM_DISABLE_COMPILE_CACHE"] == "0"  # verl's default "1" is overridden: ours merge over verl's
    for key, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton")):
        assert env[key] == str(tmp_path / "cache" / sub)

    monkeypatch.setenv("WORKBENCH_COMPILE_CACHE", "0")
    config, _ = runtime.runtime_config(verl_like_config(), tmp_path)
    env = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert "VLLM_DISABLE_COMPILE_CACHE" not in env and "VLLM_CACHE_ROOT" not in env


def test_session_startup_phases_reads_the_launched_segments_log(tmp_path, monkeypatch):
    """A copy of the real recording h200-proof with segment 3's real log beside it, as its session directory had."""
    import shutil
    import time

    from workbench.session import Session

    monkeypatch.setenv("TZ", "UTC")  # the H200 logged in UTC; a session reads its logs in its machine's time zone
    time.tzset()
    try:
        session_dir = tmp_path / "h200-proof"
        shutil.copytree(Path(__file__).parents[1] / "workbench" / "assets" / "recordings" / "h200-proof", session_dir)
        (session_dir / "logs").mkdir(exist_ok=True)
        (session_dir / "logs" / "segment-3.log").write_text(log("h200_proof_segment3_resumed.log.gz"))
        s = Session.attach(session_dir, read_only=True)
        phases = s.startup_phases()  # newest launched segment with a log: 3 (4 and 5 have none here)
        assert phases.iloc[-1]["source"] == "store"
        assert phases.iloc[-1]["phase"].startswith("first step: generation + training (step 14")
        assert summary(phases)["total_s"] == pytest.approx(178.65, abs=0.1)
        pd.testing.assert_frame_equal(s.startup_phases(segment=3), phases)
        with pytest.raises(FileNotFoundError, match="no segment log up to segment 2"):
            s.startup_phases(segment=2)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_vllm_compile_and_cuda_graph_lines_mark_their_phases():
    """vLLM's own INFO lines for torch.compile (fresh or from the cache) and CUDA graphs, as vLLM 0.2x words them,
    between two real milestones (the lines are written here in vLLM's format; no such INFO-level log was recorded)."""
    base = [
        "2026-12-01 10:00:00,000\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled",
        "2026-12-01 10:00:03,000\tINFO worker.py:2038 -- Started a local Ray instance.",
        "(vLLMHttpServer pid=1) (Worker pid=2) INFO 12-01 10:01:00 [gpu_model_runner.py:5160] Starting to load model /m...",
        "(vLLMHttpServer pid=1) (Worker pid=2) INFO 12-01 10:01:02 [gpu_model_runner.py:5255] Model loading took 0.93 GiB",
        "{compile}",
        "(vLLMHttpServer pid=1) (Worker pid=2) INFO 12-01 10:01:40 [gpu_worker.py:508] Available KV cache memory: 54 GiB",
        "(vLLMHttpServer pid=1) (Worker pid=2) INFO 12-01 10:01:50 [gpu_model_runner.py:4000] Graph capturing finished in 10 secs, took 0.5 GiB",
        "(TaskRunner pid=3) INFO:2026-12-01 10:01:55,000:all initialize finished, ready to fit",
    ]
    fresh = "(vLLMHttpServer pid=1) (Worker pid=2) INFO 12-01 10:01:32 [monitor.py:34] torch.compile takes 30.1 s in total"
    cached = "(vLLMHttpServer pid=1) (Worker pid=2) INFO 12-01 10:01:08 [backends.py:200] Directly load the compiled graph(s) for dynamic shape from the cache, took 5.1 s"
    for line, seconds in ((fresh, 30.0), (cached, 6.0)):
        phases = parse_startup("\n".join(base).replace("{compile}", line), tz=UTC).set_index("phase")["seconds"]
        assert phases["vLLM torch.compile (or loading it from the compile cache)"] == pytest.approx(seconds)
        assert phases["vLLM CUDA graph capture"] == pytest.approx(10.0)


def test_the_workbench_stamps_split_taskrunner_transfer_queue_and_dataloader(capsys):
    """What verl logs as one 44-48 s stretch (Ray up -> worker group) comes apart at the runner's own stamps."""
    from workbench.runner.runtime import milestone
    from workbench.startup import line_time

    milestone("TaskRunner up")
    stamped = capsys.readouterr().out.strip()
    assert re.fullmatch(r"\[workbench\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} TaskRunner up", stamped)
    assert abs(line_time(stamped, None, None) - time.time()) < 5
    runner = "(_WorkbenchTaskRunner pid=4) "
    text = "\n".join([
        "2026-12-01 10:00:00,000\tWARNING authentication_token_setup.py:85 -- Token authentication is enabled",
        "2026-12-01 10:00:03,000\tINFO worker.py:2038 -- Started a local Ray instance.",
        runner + "[workbench] 2026-12-01 10:00:15,000 TaskRunner up",
        runner + "[workbench] 2026-12-01 10:00:30,500 TransferQueue ready",
        runner + "[workbench] 2026-12-01 10:00:40,500 dataloader built",
        runner + "INFO:2026-12-01 10:00:45,000:create worker group dict_keys(['actor_rollout', 'critic'])",
    ])
    phases = parse_startup(text, tz=timezone.utc).set_index("phase")["seconds"].to_dict()
    assert phases == {"Ray start": 3.0, "TaskRunner process: start, imports": 12.0,
                      "TransferQueue: controller, storage units": 15.5,
                      "trainer: tokenizer, datasets, dataloader": 10.0,
                      "worker group (Ray actors for the roles)": 4.5}
