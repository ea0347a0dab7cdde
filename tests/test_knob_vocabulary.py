"""The knob table as the one vocabulary: every hot knob has a runner path the live runner implements, every knob a
what-if group (or says it has none), and the lists other modules use are derived from the table."""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from workbench import advisor, knobs, predict
from workbench import knob as knob_module
from workbench.knob import UNMODELLED, Knob, RunnerPath, call_budget
from workbench.knobs import KNOBS
from workbench.runner import trainer as runner_trainer


@functools.cache
def _verl_trainer_calls() -> dict[str, list[str]]:
    """verl 0.9.1's V1 PPOTrainer methods and their parameters, read from its source (importing the module needs
    transfer_queue, a GPU-side package)."""
    source = Path(importlib.util.find_spec("verl").origin).parent / "trainer/ppo/v1/trainer_base.py"
    trainer = next(node for node in ast.parse(source.read_text()).body
                   if isinstance(node, ast.ClassDef) and node.name == "PPOTrainer")
    return {node.name: [arg.arg for arg in node.args.args] for node in trainer.body
            if isinstance(node, ast.FunctionDef)}


def _runner_implements(knob: Knob) -> list[str]:
    """What is missing for the live runner to apply `knob` (nothing for a path it implements)."""
    path = knob.runner
    if path.kind not in runner_trainer.HOT_PATH_KINDS:
        return [f"{knob.name}: the runner implements no {path.kind!r} path (HOT_PATH_KINDS)"]
    missing = []
    if path.kind == "call":
        for call in path.calls:
            if call not in _verl_trainer_calls():
                missing.append(f"{knob.name}: verl's V1 trainer has no call {call}")
            if call not in vars(runner_trainer.WorkbenchTrainerMixin):
                missing.append(f"{knob.name}: the workbench trainer does not override {call}")
    if path.kind == "worker" and not callable(getattr(runner_trainer.WorkbenchTrainerMixin, path.method, None)):
        missing.append(f"{knob.name}: the runner has no worker method {path.method}")
    return missing


@pytest.mark.parametrize("name", knobs.HOT_KNOBS)
def test_every_hot_knob_has_a_runner_path_the_runner_implements(name):
    assert _runner_implements(KNOBS[name]) == []


def test_a_hot_knob_on_a_path_the_runner_lacks_is_caught():
    unreachable = Knob("x", ("a.b",), "int", "hot", "g", "help", roles=("actor",), phases=("gen",),
                       runner=RunnerPath("worker", method="no_such_worker_method"), model_group="batching")
    assert _runner_implements(unreachable)


def test_a_knob_must_say_its_model_group_and_a_hot_knob_its_runner_path():
    fields = dict(roles=("actor",), phases=("gen",))
    with pytest.raises(ValueError, match="model_group"):
        Knob("x", ("a.b",), "int", "restart", "g", "help", **fields)
    with pytest.raises(ValueError, match="runner path"):
        Knob("x", ("a.b",), "int", "hot", "g", "help", model_group="batching", **fields)
    with pytest.raises(ValueError, match="runner path"):  # a restart knob says what an in-place rebuild keeps
        Knob("x", ("a.b",), "int", "restart", "g", "help", model_group="batching", **fields)
    with pytest.raises(ValueError, match="runner path"):
        Knob("x", ("a.b",), "int", "restart", "g", "help", model_group="batching",
             runner=call_budget("_update_actor"), **fields)
    with pytest.raises(ValueError, match="phases"):
        Knob("x", ("a.b",), "int", "restart", "g", "help", model_group="batching", roles=("actor",),
             phases=("timing_s/gen",))


@pytest.mark.parametrize("name", list(KNOBS))
def test_every_knob_has_a_model_group_the_what_if_model_knows(name):
    group = KNOBS[name].model_group
    assert group == UNMODELLED or group in predict.MODEL_GROUPS, f"{name}: what-if group {group!r} is unknown"


def test_every_what_if_group_models_some_knob():
    assert set(predict.MODEL_GROUPS) == {k.model_group for k in KNOBS.values()} - {UNMODELLED}


def test_an_unmodelled_knob_is_said_to_be_unmodelled():
    assert "rollout_tp" not in knobs.model_groups() and KNOBS["rollout_tp"].model_group == UNMODELLED
    assert knobs.model_groups()["critic_lora_alpha"] == "critic_lora"


def test_the_derived_lists_keep_their_members_and_order():
    assert knobs.TOKEN_BUDGET_KNOBS == advisor.BUDGET_KNOBS == (
        "actor_token_budget", "logprob_token_budget", "ref_token_budget", "critic_token_budget")
    assert knobs.MICRO_BATCH_KNOBS == advisor.MICRO_BATCH_KNOBS == (
        "actor_micro_batch", "logprob_micro_batch", "ref_micro_batch", "critic_micro_batch")
    assert advisor.OFFLOAD_KNOBS == ("actor_param_offload", "actor_optimizer_offload", "ref_param_offload",
                                     "critic_param_offload", "critic_optimizer_offload")
    assert set(knobs.knobs_of_role("critic")) == {
        "critic_gpus", "critic_token_budget", "critic_micro_batch", "critic_lora_rank", "critic_lora_alpha",
        "critic_lora_targets", "critic_param_offload", "critic_optimizer_offload"}
    assert knobs.knobs_of_role("ref") == ("ref_token_budget", "ref_param_offload", "ref_micro_batch")
    assert knobs.knobs_of_role("reward") == ("reward_gpus",)


def test_each_trainer_call_reads_the_budget_of_its_phase():
    assert runner_trainer.BUDGET_OF_CALL == {
        "_update_actor": "actor_token_budget", "_compute_old_log_prob": "logprob_token_budget",
        "_compute_ref_log_prob": "ref_token_budget", "_compute_values": "critic_token_budget",
        "_update_critic": "critic_token_budget"}
    for call in runner_trainer.BUDGET_OF_CALL:  # the overrides pass (batch, metrics) on, as verl declares them
        assert _verl_trainer_calls()[call] == ["self", "batch", "metrics"], call


def test_a_trainer_call_gets_its_live_budget_then_runs_verls_call():
    class VerlTrainer:  # stands in for verl's trainer: records what each call was handed
        def _compute_values(self, batch, metrics):
            return ("values", dict(batch.extra_info))

        def _update_actor(self, batch, metrics):
            return ("update_actor", dict(batch.extra_info))

    trainer = object.__new__(runner_trainer.workbench_trainer(VerlTrainer))
    trainer.config = OmegaConf.create({
        "actor_rollout_ref": {"actor": {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 7000,
                                        "ppo_micro_batch_size_per_gpu": None}},
        "critic": {"ppo_infer_max_token_len_per_gpu": 5000, "ppo_micro_batch_size_per_gpu": None}})
    assert trainer._compute_values(SimpleNamespace(extra_info={}), {}) == (
        "values", {"use_dynamic_bsz": True, "max_token_len_per_gpu": 5000})
    assert trainer._update_actor(SimpleNamespace(extra_info={}), {}) == (
        "update_actor", {"use_dynamic_bsz": True, "max_token_len_per_gpu": 7000})


@pytest.mark.parametrize("name", list(KNOBS))
def test_every_knob_names_its_roles_and_phases(name):
    knob = KNOBS[name]
    assert knob.roles and set(knob.roles) <= set(knob_module.ROLES)
    assert knob.phases and set(knob.phases) <= set(knob_module.PHASES) == set(predict.PHASES)
