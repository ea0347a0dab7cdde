"""`verl-workbench plan …`: show, validate, diff and export, through main(argv) and one real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.plan_fixtures import runnable_overrides, tiny_model  # noqa: F401 (fixture)
from workbench.cli import COMMANDS, build_parser, main
from workbench.knobs import KNOBS
from workbench.plan import Plan

REPOSITORY = Path(__file__).resolve().parents[1]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_plan_commands_come_from_the_command_modules():
    assert COMMANDS["plan"][0] == "workbench.cli.plan"
    assert build_parser(["plan", "show"]).parse_args(["plan", "show"]).func is not None


def test_show_lists_every_knob_with_value_default_and_apply_class(capsys):
    status, out, _ = run(capsys, "plan", "show", "--overrides", "data.train_batch_size=64",
                         "--set", "gpus=0,1", "--set", "actor_token_budget=8192")
    assert status == 0
    for name in KNOBS:
        assert f" {name} " in out
    assert "* gpus                        [0, 1]               [0]                  restart" in out
    assert "* train_batch_size            64                   1024                 restart" in out
    assert "* actor_token_budget          8192                 16384                hot" in out


def test_validate_passes_a_runnable_plan(capsys, tiny_model):  # noqa: F811
    status, out, _ = run(capsys, "plan", "validate", "--gpu-count", "1",
                         "--overrides", *runnable_overrides(tiny_model))
    assert (status, out.strip()) == (0, "plan is valid")


def test_validate_exits_2_listing_every_problem(capsys):
    status, out, err = run(capsys, "plan", "validate", "--gpu-count", "1", "--set", "gpus=0,4",
                           "--set", "rollout_tp=3")
    assert status == 2 and out == ""
    assert err.startswith("plan problems:\n")
    assert "  gpus: GPU 4 is not on this machine (it has 1 GPU)" in err
    assert "  rollout_tp: 3 GPUs per rollout replica do not divide the actor pool's 2 GPUs" in err
    assert "  actor_micro_batch: needs a value" in err


@pytest.mark.parametrize("argv, words", [
    (["--set", "warp=9"], "warp: unknown knob"),
    (["--set", "train_batch_size=lots"], "train_batch_size: cannot read 'lots' as an integer"),
    (["--set", "train_batch_size"], "expected KNOB=VALUE"),
    (["--set", "rollout_gpu_memory=2"], "rollout_gpu_memory: 2.0 is above its range"),
    (["--overrides", "data.no_such_key=1"], "overrides: verl's config does not compose"),
    (["--yaml", "/nonexistent/plan.yaml"], "yaml: cannot read /nonexistent/plan.yaml"),
])
def test_bad_inputs_exit_2_naming_what_is_wrong(capsys, argv, words):
    status, _, err = run(capsys, "plan", "export", *argv)
    assert status == 2
    assert words in err


def test_export_formats(capsys):
    inputs = ["--overrides", "data.train_batch_size=64", "--set", "gpus=1,2", "--set", "critic_token_budget=4096"]
    status, out, _ = run(capsys, "plan", "export", *inputs)
    assert status == 0
    assert out.splitlines() == ["data.train_batch_size=64", "trainer.n_gpus_per_node=2",
                                "+critic.ppo_infer_max_token_len_per_gpu=4096", "critic.ppo_max_token_len_per_gpu=4096"]
    _, command, _ = run(capsys, "plan", "export", "--format", "command", *inputs)
    assert command.startswith(
        "CUDA_VISIBLE_DEVICES=1,2 python3 -m verl.trainer.main_ppo \\\n    data.train_batch_size=64")
    _, yaml_text, _ = run(capsys, "plan", "export", "--format", "yaml", *inputs)
    assert "ppo_infer_max_token_len_per_gpu: 4096" in yaml_text
    _, json_text, _ = run(capsys, "plan", "export", "--format", "json", *inputs)
    assert Plan.from_json(json_text).workbench["gpus"] == [1, 2]


def test_export_reads_a_yaml_and_adds_overrides(capsys, tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text("data:\n  train_batch_size: 32\n")
    status, out, _ = run(capsys, "plan", "export", "--yaml", str(path), "--overrides", "trainer.total_epochs=2")
    assert status == 0
    assert out.splitlines() == ["data.train_batch_size=32", "trainer.total_epochs=2", "trainer.n_gpus_per_node=1"]


def test_diff_between_plan_files(capsys, tmp_path):
    old = tmp_path / "old.json"
    old.write_text(Plan.from_verl(["data.train_batch_size=64"]).to_json())
    new = tmp_path / "new.yaml"
    new.write_text(Plan.from_verl(["data.train_batch_size=64"]).with_changes(
        {"actor_token_budget": 4096}).to_yaml())
    status, out, _ = run(capsys, "plan", "diff", str(old), str(new))
    assert status == 0
    assert out.splitlines() == ["actor_token_budget: 16384 -> 4096  [hot]",
                                "logprob_token_budget: 16384 -> 4096  [hot]",
                                "ref_token_budget: 16384 -> 4096  [hot]",
                                "apply: hot"]


def test_diff_of_settings_against_the_inputs(capsys):
    status, out, _ = run(capsys, "plan", "diff", "--set", "rollout_tp=1", "--overrides", "trainer.total_epochs=2")
    assert status == 0
    assert out.splitlines() == ["rollout_tp: 2 -> 1  [restart]", "apply: restart"]
    status, _, err = run(capsys, "plan", "diff", "only-one.json")
    assert status == 2 and "two plan files" in err


@pytest.mark.slow
def test_console_entry_runs_in_its_own_process():
    completed = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "plan", "export", "--format", "command", "--set", "gpus=0,1"],
        capture_output=True, text=True, cwd=REPOSITORY, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("CUDA_VISIBLE_DEVICES=0,1 python3 -m verl.trainer.main_ppo")
