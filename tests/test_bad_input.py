"""Bad input gets one clear line (issue 10, item 6): every case as a row of one table.

Each row builds the bad input, names the error it must raise and words the one-line message must hold. One line: no
raw parser error, no chain of tracebacks to read through — the message names what was wrong and where.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Callable

import pytest

from workbench.plan import Plan, PlanError, UnreadKeyWarning
from workbench import paths


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def _home(monkeypatch, value: str) -> None:
    monkeypatch.setenv("VERL_WORKBENCH_HOME", value)


def _file_as_home(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a directory")
    _home(monkeypatch, str(tmp_path / "a-file"))
    return paths.new_session_dir("x")


def _home_under_a_file(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a directory")
    _home(monkeypatch, str(tmp_path / "a-file" / "home"))
    return paths.new_session_dir("x")


def _empty_home(tmp_path, monkeypatch):
    _home(monkeypatch, "")
    return paths.new_session_dir("x")


def _sessions_is_a_file(tmp_path, monkeypatch):
    _home(monkeypatch, str(tmp_path))
    (tmp_path / "sessions").write_text("in the way")
    return paths.new_session_dir("x")


# name -> (make the bad input and act on it, error type, words the message holds)
CASES: dict[str, tuple[Callable, type[BaseException], tuple[str, ...]]] = {
    "plan YAML with bad syntax": (
        lambda tmp_path, mp: Plan.from_yaml(_yaml(tmp_path, "data:\n  train_batch_size: [1, 2\ntrainer: {a: 1\n")),
        PlanError, ("plan.yaml", "not valid YAML", "line 3")),
    "plan YAML that is a list": (
        lambda tmp_path, mp: Plan.from_yaml(_yaml(tmp_path, "- a\n- b\n")), PlanError, ("plan.yaml", "mapping")),
    "plan YAML that is missing": (
        lambda tmp_path, mp: Plan.from_yaml(tmp_path / "nowhere.yaml"), PlanError, ("nowhere.yaml",)),
    "+key in a section verl does not have": (
        lambda tmp_path, mp: Plan.from_verl(["+foo.bar=1"]), PlanError, ("foo.bar", "verl never reads it")),
    "+key that verl's dataclass lacks": (
        lambda tmp_path, mp: Plan.from_verl(["+actor_rollout_ref.actor.ppo_mini_batch=4"]), PlanError,
        ("actor_rollout_ref.actor.ppo_mini_batch", "FSDPActorConfig", "ppo_mini_batch_size")),
    "+key in a plan YAML that verl does not have": (
        lambda tmp_path, mp: Plan.from_yaml(_yaml(tmp_path, "foo:\n  bar: 1\n")), PlanError, ("foo.bar",)),
    "an override that does not parse": (
        lambda tmp_path, mp: Plan.from_verl(["trainer.nnodes=[1,"]), PlanError, ("trainer.nnodes",)),
    "plan JSON that is not JSON": (
        lambda tmp_path, mp: Plan.from_json("{not json"), PlanError, ("json",)),
    "plan JSON of another kind": (
        lambda tmp_path, mp: Plan.from_json('{"format": "verl-workbench-plan/1"}'), PlanError, ("json", "overrides")),
    "VERL_WORKBENCH_HOME is a file": (_file_as_home, paths.WorkbenchHomeError, ("VERL_WORKBENCH_HOME", "not a directory")),
    "VERL_WORKBENCH_HOME under a file": (_home_under_a_file, paths.WorkbenchHomeError, ("VERL_WORKBENCH_HOME", "a-file")),
    "VERL_WORKBENCH_HOME empty": (_empty_home, paths.WorkbenchHomeError, ("VERL_WORKBENCH_HOME", "empty")),
    "VERL_WORKBENCH_HOME where nothing can be made": (
        lambda tmp_path, mp: (_home(mp, "/proc/verl-workbench-home"), paths.new_session_dir("x")),
        paths.WorkbenchHomeError, ("VERL_WORKBENCH_HOME", "cannot create /proc/verl-workbench-home")),
    "sessions folder is a file": (_sessions_is_a_file, paths.WorkbenchHomeError, ("sessions", "not a directory")),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_gets_one_clear_line(case, tmp_path, monkeypatch):
    act, error_type, words = CASES[case]
    with pytest.raises(error_type) as caught:
        act(tmp_path, monkeypatch)
    message = str(caught.value)
    assert "\n" not in message.strip(), f"{case}: more than one line:\n{message}"
    for word in words:
        assert word in message, f"{case}: {word!r} not in {message!r}"
    assert "Traceback" not in message


def test_an_added_key_in_a_plain_section_is_taken_with_a_clear_warning():
    """verl reads some optional keys of its plain sections with config.get(name): `+trainer.x` may be one of those,
    so it is taken, with a warning that names it."""
    with pytest.warns(UnreadKeyWarning, match=r"trainer\.not_a_verl_key"):
        plan = Plan.from_verl(["+trainer.not_a_verl_key=1"])
    assert "+trainer.not_a_verl_key=1" in plan.to_overrides()


@pytest.mark.parametrize("override", [
    "+critic.ppo_infer_max_token_len_per_gpu=4096",  # a dataclass field verl's YAML lacks
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",  # a mapping verl hands on as it is
    "+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=WARN",  # Ray's runtime_env
    "+ray_kwargs.ray_init.include_dashboard=false",  # ray.init's own keyword arguments
])
def test_added_keys_verl_reads_are_taken_without_a_word(override):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert override in Plan.from_verl([override]).to_overrides()


def test_session_ids_made_in_one_second_do_not_collide(tmp_path, monkeypatch):
    """Two replays of one recording started in the same second got one id (FileExistsError)."""
    monkeypatch.setattr(paths.time, "strftime", lambda *_: "20261201-093000")
    made = [paths.new_session_dir("replay-h200-proof", root=tmp_path) for _ in range(20)]
    assert len({p.name for p in made}) == 20
    assert all(p.name.startswith("20261201-093000-replay-h200-proof-") for p in made)


def test_session_dirs_are_owner_only(tmp_path, monkeypatch):
    _home(monkeypatch, str(tmp_path / "home"))
    made = paths.new_session_dir("x")
    for directory in (made, made.parent, made.parent.parent):
        assert directory.stat().st_mode & 0o777 == 0o700, directory
    assert os.access(made, os.W_OK)


# ------------------------------------------------------------------------------------------------ a running session
@pytest.mark.slow
def test_bad_input_to_a_session_gets_one_clear_line(home):
    """Every case against one replayed session (so the table costs one start-up): each raises its error at once, in
    one line, and nothing is queued."""
    from workbench import control as c
    from workbench.session import Session

    session = Session.replay("h200-proof", speed=20, startup_speed=200, follow=False)  # its start-up in <1 s
    try:
        session.wait_for_step(1, timeout=120)
        budget = session.knob_values()["actor_token_budget"]
        cases = {
            "apply(None)": (lambda: session.apply(None), PlanError, ("no change",)),
            "apply([1])": (lambda: session.apply([1]), PlanError, ("dict",)),
            "apply({})": (lambda: session.apply({}), PlanError, ("no change",)),
            "a no-op change": (lambda: session.apply({"actor_token_budget": budget}), PlanError, ("no change",)),
            "an unknown knob": (lambda: session.apply({"actor_token_budgt": 8192}), PlanError,
                                ("actor_token_budgt", "actor_token_budget")),
            "a value of the wrong type": (lambda: session.apply({"actor_token_budget": "lots"}), PlanError,
                                          ("actor_token_budget",)),
            "a recording that is not there": (lambda: Session.replay("no-such-recording"), FileNotFoundError,
                                              ("no-such-recording",)),
            "replay(speed=0)": (lambda: Session.replay("h200-proof", speed=0), ValueError, ("speed",)),
            "replay(speed='fast')": (lambda: Session.replay("h200-proof", speed="fast"), ValueError, ("speed",)),
            "a session that is not there": (lambda: Session.attach("no-such-session"), FileNotFoundError,
                                            ("no-such-session",)),
        }
        failed = []
        for case, (act, error_type, words) in cases.items():
            try:
                act()
                failed.append(f"{case}: no error")
                continue
            except error_type as error:
                message = str(error)
            except Exception as error:  # noqa: BLE001 — the wrong kind of error is a failure of this case
                failed.append(f"{case}: {type(error).__name__}: {error}")
                continue
            if "\n" in message.strip() or not all(word in message for word in words):
                failed.append(f"{case}: {message!r}")
        assert not failed, "\n".join(failed)
        assert session.commands().query("kind == @c.APPLY").empty  # nothing was queued
        assert len(Session.list()) == 1  # no session was made by the bad replays
    finally:
        session.stop(now=True)
        session.close()
