"""A live verl session on this machine's GPU through the Session API (skipped without CUDA and vLLM).

The full proof, with restarts, a crash and rollback, is bench/gpu/session_proof.py; this is the short version a GPU
server's CI can afford (~4 min: verl's start-up dominates).
"""

import importlib.util

import pytest

from workbench.session import Session, gpu_count

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not gpu_count(), reason="needs an NVIDIA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install -e '.[gpu]')"),
]


def test_live_session_hot_applies_a_token_budget(home):
    from workbench.assets import generate_assets_apart
    from workbench.assets.plans import offline_plan

    assets = home / "assets"
    generate_assets_apart(assets, shape="qwen2.5-0.5b", n_train=512, device="cuda")  # the shape proven with vLLM
    session = Session.start(offline_plan(assets))
    try:
        session.wait_for_step(2, timeout=900)
        result = session.apply({"actor_token_budget": 8192}, wait=True)
        assert result.mode == "hot"
        applied = session.wait_until(lambda s: (s.events().kind == "applied").any(), timeout=300).events()
        from_step = applied[applied.kind == "applied"].iloc[-1]["data"]["from_step"]
        session.wait_for_step(from_step, timeout=300)
        steps = session.steps()
        assert steps.loc[steps.step >= from_step, "workbench/budget/actor_token_budget"].eq(8192).all()
        assert steps.loc[steps.step < from_step, "workbench/budget/actor_token_budget"].eq(4096).all()
        assert len(session.samples()) > 0, "the NVML sampler records beside a live run"
    finally:
        session.stop(now=True)
