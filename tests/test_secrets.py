"""Credentials never leave the process that needs them (issue 10, item 1).

A plan given a credential (an API key in a Ray env var, a password, a token) keeps its value apart: every export,
its repr and its JSON (which the store keeps as segments.plan_json and meta.initial_plan) show a placeholder, and
the run gets the value through its environment (workbench/redact.py says how). The bundled recordings hold no
operator token. TEST_SECRET is made up for these tests.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from workbench import redact
from workbench.plan import Plan
from workbench.runner.runtime import runtime_config

REPO = Path(__file__).resolve().parents[1]
RECORDINGS = REPO / "workbench" / "assets" / "recordings"
TEST_SECRET = "abc123secret-not-a-real-key"
ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY"
SECRET_OVERRIDES = {
    "an env var API key": [f"+{ENV_KEY}={TEST_SECRET}"],
    "a quoted token": [f'+ray_kwargs.ray_init.runtime_env.env_vars.HF_TOKEN="{TEST_SECRET}"'],
    "a dict of env vars": [f"+ray_kwargs.ray_init.runtime_env.env_vars={{WANDB_API_KEY:{TEST_SECRET},NCCL_DEBUG:WARN}}"],
    "a password in a kwargs mapping": [f"+actor_rollout_ref.model.override_config.hub_password={TEST_SECRET}"],
}


def exports(plan: Plan) -> dict[str, str]:
    return {"overrides": "\n".join(plan.to_overrides()), "yaml": plan.to_yaml(), "command": plan.to_command(),
            "json": plan.to_json(), "repr": repr(plan), "str": str(plan)}


@pytest.mark.parametrize("name", ["WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "OPENAI_API_KEY",
                                  "hub_password", "client_secret", "hf_token", "api_key", "GITHUB_PAT"])
def test_names_of_credentials_are_recognised(name):
    assert redact.is_secret_name(name)


@pytest.mark.parametrize("name", ["data.prompt_key", "prompt_key", "reward_fn_key", "NCCL_DEBUG", "HF_HOME",
                                  "max_num_batched_tokens", "profile_token_start", "tokenizer_path",
                                  "ppo_max_token_len_per_gpu", "PYTHONPATH"])
def test_verl_keys_and_plain_env_vars_are_not_credentials(name):
    assert not redact.is_secret_name(name.rsplit(".", 1)[-1])


@pytest.mark.parametrize("case", SECRET_OVERRIDES)
def test_no_export_or_repr_of_a_plan_holds_its_secret(case):
    plan = Plan.from_verl(SECRET_OVERRIDES[case])
    for form, text in exports(plan).items():
        assert TEST_SECRET not in text, f"{case}: the secret is in the plan's {form}"
    assert TEST_SECRET in plan.secrets.values()
    assert redact.SECRET_PLACEHOLDER in plan.to_json()


def test_the_placeholder_marks_the_key_and_the_command_says_what_is_left_out():
    plan = Plan.from_verl(SECRET_OVERRIDES["an env var API key"])
    assert OmegaConf.select(plan.config, ENV_KEY) == redact.SECRET_PLACEHOLDER
    assert plan.secrets == {ENV_KEY: TEST_SECRET}
    assert "WANDB_API_KEY" in plan.to_command().splitlines()[0]  # a comment line names the credential left out


def test_secrets_survive_changes_and_other_values_stay_verbatim():
    plan = Plan.from_verl(SECRET_OVERRIDES["a dict of env vars"] + ["trainer.total_training_steps=3"])
    changed = plan.with_changes({"train_batch_size": 64})
    assert changed.secrets == {ENV_KEY: TEST_SECRET}
    assert OmegaConf.select(changed.config, "ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG") == "WARN"
    assert "trainer.total_training_steps=3" in changed.to_overrides()


def test_a_plan_read_back_from_its_json_holds_no_secret():
    plan = Plan.from_json(Plan.from_verl(SECRET_OVERRIDES["an env var API key"]).to_json())
    assert plan.secrets == {}
    assert plan.secrets_env() == {}


def test_a_secret_in_a_plan_yaml_is_kept_apart(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(f"ray_kwargs:\n  ray_init:\n    runtime_env:\n      env_vars:\n        WANDB_API_KEY: {TEST_SECRET}\n")
    plan = Plan.from_yaml(path)
    assert plan.secrets == {ENV_KEY: TEST_SECRET}
    assert all(TEST_SECRET not in text for text in exports(plan).values())


def test_the_run_gets_the_secret_through_its_environment(tmp_path, monkeypatch):
    """What the supervisor inherits (secrets_env) is what the runner puts into the config verl runs, in memory;
    it does not spread into the Ray workers' WORKBENCH_* variables."""
    plan = Plan.from_verl(SECRET_OVERRIDES["an env var API key"])
    for name, value in plan.secrets_env().items():
        monkeypatch.setenv(name, value)
    config, _ = runtime_config(plan.config, tmp_path)
    env_vars = config.ray_kwargs.ray_init.runtime_env.env_vars
    assert env_vars.WANDB_API_KEY == TEST_SECRET
    assert redact.SECRETS_ENV not in env_vars


def test_a_run_without_its_secret_says_so(tmp_path, monkeypatch):
    monkeypatch.delenv(redact.SECRETS_ENV, raising=False)
    plan = Plan.from_verl(SECRET_OVERRIDES["an env var API key"])
    with pytest.raises(ValueError, match="WANDB_API_KEY"):
        runtime_config(plan.config, tmp_path)


# ------------------------------------------------------------------------------------------------ recordings
def _bundled_files() -> list[Path]:
    return [p for p in RECORDINGS.rglob("*") if p.is_file()]


@pytest.mark.parametrize("recording", sorted(p.name for p in RECORDINGS.iterdir() if p.is_dir()))
def test_bundled_recordings_hold_no_operator_credentials(recording):
    db = sqlite3.connect(f"file:{RECORDINGS / recording / 'session.sqlite'}?mode=ro", uri=True)
    try:
        payloads = [json.loads(p) for (p,) in db.execute("SELECT payload_json FROM commands")]
        assert payloads, "the recording's commands are what a replay follows"
        for payload in payloads:
            assert not set(payload) & set(redact.CREDENTIAL_FIELDS), payload
    finally:
        db.close()


def test_scrubbing_a_store_removes_credentials_from_its_file(tmp_path):
    """What pack_recording runs on a session before it becomes a recording: the bytes are gone from the file, not only
    from the rows (SQLite keeps deleted text in free pages until VACUUM)."""
    from workbench.store import Store

    token = "0123456789abcdef0123456789abcdef"
    plan = Plan.from_verl(["trainer.total_training_steps=3"])
    store = Store(tmp_path)
    store.put_command("stop", {"now": False, "token": token, "nonce": "n", "signature": "s" * 64})
    store.begin_segment(plan.to_json().replace("trainer.total_training_steps=3",
                                               f"+{ENV_KEY}={TEST_SECRET}"))
    store.set_meta(initial_plan=plan.to_json())
    store.close()
    removed = redact.scrub_store(tmp_path)
    assert removed >= 2
    data = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert token.encode() not in data and TEST_SECRET.encode() not in data
    db = sqlite3.connect(f"file:{tmp_path / 'session.sqlite'}?mode=ro", uri=True)
    (payload,) = db.execute("SELECT payload_json FROM commands").fetchone()
    assert json.loads(payload) == {"now": False}
    # A recording is read by replays and viewers: in WAL mode every reader would leave -shm/-wal files beside it.
    assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    db.close()


def test_no_bundled_file_holds_a_credential_in_plain_text():
    """The recordings' old operator tokens (32 hex digits in a 'token' field) are gone from the bytes too."""
    import re

    pattern = re.compile(rb'"(?:token|signature|nonce)": "[0-9a-f]{16,}"')
    for path in _bundled_files():
        assert not pattern.search(path.read_bytes()), path


# ------------------------------------------------------------------------------------------------ a test session
def _owner_only(directory: Path) -> list[str]:
    """Paths under `directory` (itself included) that others could read or enter."""
    found = []
    for path in [directory, *directory.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            found.append(f"{path.relative_to(directory.parent)} {oct(mode)}")
    return found


@pytest.mark.slow
def test_a_session_writes_no_secret_and_no_token_and_keeps_to_its_owner(home, monkeypatch):
    """A session started the way Session.start starts one, from a plan that holds a credential (the recorded plan of
    h200-lora-critic-sync plus an API key, so that it replays on a CPU): no file it writes holds the credential,
    none but the token file holds the operator token, and every file and directory is its owner's alone."""
    from workbench import control as c
    from workbench.lifecycle import resolve_recording, spawn_supervisor
    from workbench.session import Session

    recording = resolve_recording("h200-lora-critic-sync")
    db = sqlite3.connect(f"file:{recording / 'session.sqlite'}?mode=ro", uri=True)
    (plan_json,) = db.execute("SELECT plan_json FROM segments ORDER BY id LIMIT 1").fetchone()
    db.close()
    document = json.loads(plan_json)
    document["overrides"].append(f"+{ENV_KEY}={TEST_SECRET}")
    plan = Plan.from_json(json.dumps(document))
    assert plan.secrets == {ENV_KEY: TEST_SECRET}
    monkeypatch.setenv("WANDB_API_KEY", TEST_SECRET)  # and one in the kernel's environment, as a user may have
    session = Session(*spawn_supervisor(plan, name="secret", root=None,
                                        meta={"kind": "replay", "recording": str(recording)},
                                        args=["--replay", str(recording), "--speed", "400"]))
    assert session.plan.secrets == {}  # what the store holds is the redacted plan
    session.wait_until(lambda s: s.state in c.ENDED_STATES and not s.supervisor_alive(), timeout=120, poll=0.1)
    token = (session.dir / c.TOKEN_FILE).read_text().strip()
    session.export("command"), session.export("yaml")
    session.close()
    written = [p for p in session.dir.rglob("*") if p.is_file()]
    assert {p.name for p in written} >= {"session.sqlite", "supervisor.log", c.TOKEN_FILE}
    for path in written:
        data = path.read_bytes()
        assert TEST_SECRET.encode() not in data, path
        if path.name != c.TOKEN_FILE:
            assert token.encode() not in data, path
    assert _owner_only(session.dir) == []


def test_bundled_files_hold_no_test_secret_and_no_token():
    """Everything the package ships (workbench/, widgets/, notebooks/): no credential of these tests, no session's
    operator token (the recordings' old ones are scrubbed)."""
    pattern = re.compile(rb'"(?:token|signature)": "[0-9a-f]{16,}"')
    shipped = [p for top in ("workbench", "widgets", "notebooks") for p in (REPO / top).rglob("*")
               if p.is_file() and "__pycache__" not in p.parts]
    assert len(shipped) > 20
    for path in shipped:
        data = path.read_bytes()
        assert TEST_SECRET.encode() not in data, path
        assert not pattern.search(data), path
