"""Plan: composition round trips, the quickstart import, every kind of bad plan, diffs and exports."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import ReadonlyConfigError

from tests.plan_fixtures import default_plan, runnable_overrides, runnable_plan, tiny_model  # noqa: F401 (fixtures)
from workbench import plan as plan_module
from workbench.knobs import KNOBS, WORKBENCH_KNOBS
from workbench.plan import Plan, PlanError
from workbench import verl_config

HOME = os.path.expanduser("~")
# verl's docs/start/quickstart.rst: PPO on one GPU with Qwen2.5-0.5B-Instruct (the shell expands $HOME).
QUICKSTART = [
    f"data.train_files={HOME}/data/gsm8k/train.parquet",
    f"data.val_files={HOME}/data/gsm8k/test.parquet",
    "data.train_batch_size=256",
    "data.max_prompt_length=512",
    "data.max_response_length=512",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "actor_rollout_ref.actor.optim.lr=1e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=64",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-5",
    "critic.model.path=Qwen/Qwen2.5-0.5B-Instruct",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "trainer.logger=console",
    "trainer.val_before_train=False",
    "trainer.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.save_freq=10",
    "trainer.test_freq=10",
    "trainer.total_epochs=15",
]

EVERY_KNOB_CHANGED = {
    "gpus": [0, 1, 2, 3, 4], "critic_gpus": 1, "reward_gpus": 1, "rollout_gpus": 1,
    "use_dynamic_bsz": True, "actor_token_budget": 4096, "logprob_token_budget": 3072,
    "ref_token_budget": 2048, "critic_token_budget": 8192,
    "critic_lora_rank": 8, "critic_lora_alpha": 32, "critic_lora_targets": ["q_proj", "v_proj"],
    "trainer_mode": "separate_async", "hybrid_switch": True,
    "rollout_gpu_memory": 0.3, "rollout_tp": 1, "rollout_max_batched_tokens": 4096,
    "actor_param_offload": True, "actor_optimizer_offload": True, "ref_param_offload": True,
    "critic_param_offload": True, "critic_optimizer_offload": True, "gradient_checkpointing": False,
    "train_batch_size": 8, "ppo_mini_batch_size": 2, "actor_micro_batch": 1, "logprob_micro_batch": 1,
    "ref_micro_batch": 1, "critic_micro_batch": 1, "max_prompt_length": 256, "max_response_length": 128,
    "nccl_env": {"NCCL_DEBUG": "INFO"},
    "fused_kernels": True, "fused_kernel_backend": "liger", "remove_padding": False, "rollout_enforce_eager": True,
    "rollout_max_num_seqs": 64, "agent_workers": 2, "rollout_logprob_bypass": True,
}


def written(config) -> dict:
    """A config as written (interpolations unresolved): equal dicts mean equal configs."""
    return OmegaConf.to_container(config, resolve=False)


def verl_knob_values(plan: Plan) -> dict:
    return {name: value for name, value in plan.knob_values().items() if name not in WORKBENCH_KNOBS}


@pytest.fixture(scope="module")
def every_knob_plan(tiny_model) -> Plan:  # noqa: F811 (fixture argument)
    # The reward model and a weight-sending checkpoint engine make separate_async with its pools runnable.
    base = Plan.from_verl(runnable_overrides(tiny_model) + [
        "reward.reward_model.enable=true", f"reward.reward_model.model_path={tiny_model}",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl"])
    return base.with_changes(EVERY_KNOB_CHANGED)


# ----------------------------------------------------------------------------------------------- round trips
def test_every_knob_is_changed_in_the_every_knob_plan(every_knob_plan):
    assert set(EVERY_KNOB_CHANGED) == set(KNOBS)
    assert set(every_knob_plan.changed_knobs()) == set(KNOBS)
    assert every_knob_plan.knob_values() == EVERY_KNOB_CHANGED


@pytest.mark.parametrize("plan_name", ["default_plan", "every_knob_plan"])
def test_composing_to_overrides_gives_exactly_the_plan_config(plan_name, request):
    plan = request.getfixturevalue(plan_name)
    assert written(verl_config.compose_config(plan.to_overrides())) == written(plan.config)
    imported = Plan.from_verl(plan.to_overrides())
    assert written(imported.config) == written(plan.config)
    assert verl_knob_values(imported) == verl_knob_values(plan)


@pytest.mark.parametrize("plan_name", ["default_plan", "every_knob_plan"])
def test_json_round_trip_is_lossless(plan_name, request):
    plan = request.getfixturevalue(plan_name)
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.knob_values() == plan.knob_values()
    assert written(again.config) == written(plan.config)


@pytest.mark.parametrize("plan_name", ["default_plan", "every_knob_plan"])
def test_yaml_round_trip(plan_name, request, tmp_path):
    plan = request.getfixturevalue(plan_name)
    path = tmp_path / "plan.yaml"
    path.write_text(plan.to_yaml())
    again = Plan.from_yaml(path)
    assert written(again.config) == written(plan.config)
    assert verl_knob_values(again) == verl_knob_values(plan)
    # a full YAML comes back as a short list: only what differs from verl's defaults
    assert len(again.base_overrides) <= len(plan.to_overrides()) + 1


def test_a_partial_yaml_changes_only_what_it_names(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text("data:\n  train_batch_size: 32\ncritic:\n  ppo_infer_max_token_len_per_gpu: 4096\n")
    plan = Plan.from_yaml(path, ["trainer.total_epochs=2"])
    assert plan.knob_values()["train_batch_size"] == 32
    assert plan.knob_values()["critic_token_budget"] == 4096
    assert plan.config.trainer.total_epochs == 2
    assert "+critic.ppo_infer_max_token_len_per_gpu=4096" in plan.to_overrides()


def test_every_knob_plan_is_valid_and_runs_through_the_workbench_launcher(every_knob_plan):
    every_knob_plan.validate(gpu_count=5)
    command = every_knob_plan.to_command()
    assert command.startswith("# critic_gpus=1")
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4 python3 -m workbench.launch --critic-gpus 1" in command
    assert every_knob_plan.config.trainer.n_gpus_per_node == 2  # 5 GPUs less one each for critic/reward/rollout
    assert every_knob_plan.config.actor_rollout_ref.rollout.n_gpus_per_node == 1
    assert every_knob_plan.config.reward.reward_model.enable_resource_pool is True


# ----------------------------------------------------------------------------------------------- quickstart
def test_verl_config_imports_hydra_whole_so_no_thread_imports_it_half_way():
    """Hydra's modules import one another in a circle: a replay's supervisor whose warm-up thread composed while its
    main thread read the plan's overrides failed to start now and then ("cannot import name 'OverridesParser' from
    partially initialized module"). Importing verl_config (one thread does) leaves every Hydra module it uses loaded."""
    code = ("import sys; import workbench.verl_config; print(sorted(m for m in ('hydra', 'hydra.errors', 'hydra.utils', "
            "'hydra.core.override_parser.overrides_parser') if m not in sys.modules))")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.stdout.strip() == "[]", (ran.stdout, ran.stderr[-1000:])


def test_quickstart_import():
    plan = Plan.from_verl(QUICKSTART)
    assert plan.to_overrides() == QUICKSTART
    assert written(verl_config.compose_config(plan.to_overrides())) == written(verl_config.compose_config(QUICKSTART))
    values = plan.knob_values()
    assert values["gpus"] == [0]
    assert (values["train_batch_size"], values["ppo_mini_batch_size"]) == (256, 64)
    assert (values["actor_micro_batch"], values["logprob_micro_batch"], values["critic_micro_batch"]) == (4, 8, 4)
    assert (values["rollout_tp"], values["rollout_gpu_memory"]) == (1, 0.4)
    assert plan.to_command().startswith("CUDA_VISIBLE_DEVICES=0 python3 -m verl.trainer.main_ppo \\\n")


def test_quickstart_validates_with_a_local_model(tiny_model):  # noqa: F811 (fixture argument)
    # Offline, the Hub model is swapped for the tiny local one: verl's validation loads the critic's tokenizer.
    Plan.from_verl(QUICKSTART + [f"actor_rollout_ref.model.path={tiny_model}",
                                 f"critic.model.path={tiny_model}"]).validate(gpu_count=1)


# ------------------------------------------------------------------------------------------------ bad plans
# (what is wrong, extra verl overrides on the runnable plan, knob changes, GPUs on the machine, knob named, words)
BAD_PLANS = [
    ("unknown knob", [], {"gpu": [0]}, None, "gpu", "unknown knob (did you mean gpus?)"),
    ("memory above range", [], {"rollout_gpu_memory": 1.2}, None, "rollout_gpu_memory", "above its range"),
    ("memory zero", [], {"rollout_gpu_memory": 0.0}, None, "rollout_gpu_memory", "below its range"),
    ("unknown mode", [], {"trainer_mode": "turbo"}, None, "trainer_mode", "is not one of sync"),
    ("negative LoRA rank", [], {"critic_lora_rank": -1}, None, "critic_lora_rank", "below its range"),
    ("string for int", [], {"train_batch_size": "8"}, None, "train_batch_size", "is not an integer"),
    ("word for bool", [], {"use_dynamic_bsz": "yes"}, None, "use_dynamic_bsz", "is not true or false"),
    ("empty LoRA targets", [], {"critic_lora_targets": ""}, None, "critic_lora_targets", "non-empty string"),
    ("duplicate GPU", [], {"gpus": [0, 0]}, None, "gpus", "GPU 0 is listed twice"),
    ("no GPU", [], {"gpus": []}, None, "gpus", "needs at least one GPU index"),
    ("GPU not on machine", [], {"gpus": [0, 3]}, 2, "gpus", "GPU 3 is not on this machine (it has 2 GPUs)"),
    ("pools take every GPU", ["reward.reward_model.enable=true"], {"gpus": [0, 1], "critic_gpus": 1,
     "reward_gpus": 1}, None, "reward_gpus", "leave none for the actor"),
    ("critic pool, no critic", ["algorithm.adv_estimator=grpo"], {"gpus": [0, 1], "critic_gpus": 1}, None,
     "critic_gpus", "runs no critic"),
    ("reward pool, no reward model", [], {"gpus": [0, 1], "reward_gpus": 1}, None, "reward_gpus",
     "reward.reward_model.enable is false"),
    ("rollout pool in sync mode", [], {"gpus": [0, 1], "rollout_gpus": 1}, None, "rollout_gpus",
     "only with trainer_mode=separate_async"),
    ("separate_async without rollout pool", [], {"trainer_mode": "separate_async"}, None, "trainer_mode",
     "separate_async without a rollout pool"),
    ("hybrid switch in sync mode", [], {"hybrid_switch": True}, None, "hybrid_switch",
     "only with trainer_mode=separate_async"),
    ("LoRA rank, no critic", ["algorithm.adv_estimator=grpo"], {"critic_lora_rank": 8}, None,
     "critic_lora_rank", "runs no critic"),
    ("batch not whole mini batches", [], {"train_batch_size": 10}, None, "train_batch_size",
     "do not split into whole mini batches"),
    ("mini batch over 3 GPUs", [], {"gpus": [0, 1, 2]}, None, "ppo_mini_batch_size",
     "do not split evenly over the actor's 3 GPUs"),
    ("actor budget below one sequence", [], {"use_dynamic_bsz": True, "actor_token_budget": 600}, None,
     "actor_token_budget", "cannot hold one sequence of max_prompt_length + max_response_length = 1024"),
    ("critic budget below one sequence", [], {"use_dynamic_bsz": True, "critic_token_budget": 1000}, None,
     "critic_token_budget", "cannot hold one sequence"),
    # verl's V1 critic packs by its token budget with use_dynamic_bsz off too (knobs.batching_knobs_read)
    ("critic budget below one sequence, fixed micro batches", [], {"critic_token_budget": 1000}, None,
     "critic_token_budget", "cannot hold one sequence"),
    ("micro batch unset", [], {"actor_micro_batch": None}, None, "actor_micro_batch",
     "needs a value while use_dynamic_bsz is off"),
    ("tensor parallel over one GPU", [], {"rollout_tp": 2}, None, "rollout_tp", "do not divide"),
    ("not an NCCL variable", [], {"nccl_env": {"PATH": "/usr/bin"}}, None, "nccl_env", "not an NCCL variable"),
    ("knob keys disagree", ["critic.ppo_mini_batch_size=2"], {}, None, "ppo_mini_batch_size",
     "its verl keys disagree"),
    ("verl rejects deprecated micro batch", ["actor_rollout_ref.actor.ppo_micro_batch_size=4"], {}, None,
     "actor_micro_batch", "verl rejects the config: [actor] You have set both"),
]


@pytest.mark.parametrize("extra, changes, gpu_count, knob, words",
                         [case[1:] for case in BAD_PLANS], ids=[case[0] for case in BAD_PLANS])
def test_bad_plan_names_the_knob_and_leaves_the_plan_alone(runnable_plan, extra, changes, gpu_count, knob, words):  # noqa: F811
    before = (runnable_plan.to_json(), runnable_plan.knob_values(), written(runnable_plan.config))
    start = Plan.from_verl(list(runnable_plan.base_overrides) + extra) if extra else runnable_plan
    with pytest.raises(PlanError) as caught:
        start.with_changes(changes).validate(gpu_count=gpu_count)
    problems = caught.value.problems
    assert str(caught.value) == "\n".join(caught.value.messages)
    assert knob in problems and words in problems[knob], problems
    assert (runnable_plan.to_json(), runnable_plan.knob_values(), written(runnable_plan.config)) == before


def test_there_are_at_least_fifteen_bad_plans():
    assert len(BAD_PLANS) >= 15


def test_runnable_plan_is_valid(runnable_plan):  # noqa: F811
    runnable_plan.validate(gpu_count=1)


def test_validate_reports_every_problem_at_once(runnable_plan):  # noqa: F811
    plan = runnable_plan.with_changes({"rollout_tp": 2, "train_batch_size": 10, "hybrid_switch": True})
    with pytest.raises(PlanError) as caught:
        plan.validate()
    named = {problem.split(":")[0] for problem in caught.value.problems}
    assert {"rollout_tp", "train_batch_size", "hybrid_switch"} <= named


def test_with_changes_reports_every_bad_value_at_once(default_plan):  # noqa: F811
    with pytest.raises(PlanError) as caught:
        default_plan.with_changes({"rollout_tp": 0, "nosuch": 1, "gpus": "0"})
    assert [problem.split(":")[0] for problem in caught.value.problems] == ["rollout_tp", "nosuch", "gpus"]


def test_overrides_verl_cannot_compose_are_named():
    with pytest.raises(PlanError, match="^overrides: .*no_such_key"):
        Plan.from_verl(["data.no_such_key=1"])
    # a key that exists only as a dataclass field needs Hydra's '+'; Hydra's message says so
    with pytest.raises(PlanError, match=r"\+critic.ppo_infer_max_token_len_per_gpu"):
        Plan.from_verl(["critic.ppo_infer_max_token_len_per_gpu=4096"])


def test_from_json_refuses_unknown_knobs_and_bad_values(default_plan):  # noqa: F811
    document = default_plan.to_json().replace('"critic_gpus": 0', '"critic_gpus": -1, "warp": 9')
    with pytest.raises(PlanError) as caught:
        Plan.from_json(document)
    assert {problem.split(":")[0] for problem in caught.value.problems} == {"warp", "critic_gpus"}


# ----------------------------------------------------------------------------------- immutability and speed
def test_plan_is_immutable(default_plan):  # noqa: F811
    with pytest.raises(dataclasses.FrozenInstanceError):
        default_plan.config = None
    with pytest.raises(ReadonlyConfigError):
        default_plan.config.data.train_batch_size = 3
    values = default_plan.knob_values()
    values["gpus"].append(7)
    assert default_plan.knob_values()["gpus"] == [0]
    default_plan.workbench["gpus"].append(7)
    assert default_plan.workbench["gpus"] == [0]


def test_with_changes_composes_once(default_plan, monkeypatch):  # noqa: F811
    calls = []
    compose = verl_config.compose_config
    monkeypatch.setattr(plan_module.verl_config, "compose_config", lambda overrides: calls.append(1) or
                        compose(overrides))
    default_plan.with_changes({"train_batch_size": 4096, "actor_token_budget": 2048})
    assert len(calls) == 1


# ------------------------------------------------------------------------------------------------ placement
def test_placement_defaults_to_one_gpu_not_verls_eight(default_plan):  # noqa: F811
    assert default_plan.workbench == {"gpus": [0], "critic_gpus": 0, "reward_gpus": 0, "rollout_gpus": 0}
    assert default_plan.config.trainer.n_gpus_per_node == 1
    assert default_plan.to_overrides() == ["trainer.n_gpus_per_node=1"]


def test_placement_is_inferred_from_named_verl_pools():
    plan = Plan.from_verl(["trainer.n_gpus_per_node=4", "reward.reward_model.enable_resource_pool=true",
                           "reward.reward_model.n_gpus_per_node=2", "reward.reward_model.nnodes=1"])
    assert plan.workbench == {"gpus": [0, 1, 2, 3, 4, 5], "critic_gpus": 0, "reward_gpus": 2, "rollout_gpus": 0}
    assert plan.config.trainer.n_gpus_per_node == 4


def test_a_critic_pool_shrinks_the_actor_pool(default_plan):  # noqa: F811
    plan = default_plan.with_changes({"gpus": [2, 3, 5], "critic_gpus": 1})
    assert plan.config.trainer.n_gpus_per_node == 2
    assert plan.to_command().splitlines()[1].startswith(
        "CUDA_VISIBLE_DEVICES=2,3,5 python3 -m workbench.launch --critic-gpus 1")


def test_a_lora_critic_needs_the_workbench_launcher(default_plan):  # noqa: F811
    command = default_plan.with_changes({"critic_lora_rank": 16}).to_command()
    assert command.startswith("# critic_lora_rank=16: verl's FSDP LoRA critic crashes")
    assert "python3 -m workbench.launch trainer.n_gpus_per_node=1" in command.replace(" \\\n    ", " ")


# ------------------------------------------------------------------------------------------ overrides, env
def test_dataclass_only_key_is_added_with_plus_then_changed_without(default_plan):  # noqa: F811
    plan = default_plan.with_changes({"critic_token_budget": 4096})
    assert "+critic.ppo_infer_max_token_len_per_gpu=4096" in plan.to_overrides()
    added = Plan.from_verl(["+critic.ppo_infer_max_token_len_per_gpu=5"]).with_changes({"critic_token_budget": 6})
    assert "critic.ppo_infer_max_token_len_per_gpu=6" in added.to_overrides()
    assert added.config.critic.ppo_infer_max_token_len_per_gpu == 6


def test_a_knob_replaces_the_base_override_of_its_key():
    plan = Plan.from_verl(["data.train_batch_size=64"]).with_changes({"train_batch_size": 32})
    assert plan.to_overrides() == ["trainer.n_gpus_per_node=1", "data.train_batch_size=32"]
    back = plan.with_changes({"train_batch_size": 64})
    assert back.to_overrides() == ["data.train_batch_size=64", "trainer.n_gpus_per_node=1"]


def test_nccl_env_sets_and_removes_only_nccl_variables():
    base = Plan.from_verl(["+ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG=INFO",
                           "+ray_kwargs.ray_init.runtime_env.env_vars.HF_HOME=/data"])
    assert base.knob_values()["nccl_env"] == {"NCCL_DEBUG": "INFO"}
    plan = base.with_changes({"nccl_env": {"NCCL_P2P_DISABLE": 1}})
    env = plan.config.ray_kwargs.ray_init.runtime_env.env_vars
    assert dict(env) == {"HF_HOME": "/data", "NCCL_P2P_DISABLE": "1"}  # Ray wants strings
    assert "~ray_kwargs.ray_init.runtime_env.env_vars.NCCL_DEBUG" in plan.to_overrides()


# ------------------------------------------------------------------------------------------- diff and apply
def test_token_budget_changes_are_hot(runnable_plan):  # noqa: F811
    changed = runnable_plan.with_changes({"critic_token_budget": 8192, "ref_token_budget": 4096})
    entries = runnable_plan.diff(changed)
    assert [entry["knob"] for entry in entries] == ["ref_token_budget", "critic_token_budget"]
    assert entries[1] == {"knob": "critic_token_budget", "keys": ["critic.ppo_infer_max_token_len_per_gpu",
                          "critic.ppo_max_token_len_per_gpu"], "old": 32768, "new": 8192, "apply": "hot"}
    assert runnable_plan.apply_class(changed) == "hot"


def test_an_actor_budget_carries_verls_interpolated_budgets_along(default_plan):  # noqa: F811
    # verl's YAML interpolates the log-prob budgets from the actor's; all of them are hot.
    changed = default_plan.with_changes({"actor_token_budget": 8192})
    assert [entry["knob"] for entry in default_plan.diff(changed)] == [
        "actor_token_budget", "logprob_token_budget", "ref_token_budget"]
    assert default_plan.apply_class(changed) == "hot"


def test_a_knob_set_to_verls_own_default_is_no_change(default_plan):  # noqa: F811
    # critic.ppo_infer_max_token_len_per_gpu is declared only by verl's CriticConfig dataclass (default 32768): a
    # change that writes it at its default (the advisor's fused lever does) changes nothing there, and must not turn
    # a hot change into a restart as a "base change".
    assert default_plan.knob_values()["critic_token_budget"] == 32768
    tuned = default_plan.with_changes({"fused_kernels": True, "critic_token_budget": 32768})
    assert [entry["knob"] for entry in default_plan.diff(tuned)] == ["fused_kernels"]
    assert default_plan.apply_class(tuned) == "hot"


def test_restart_knobs_and_base_changes_need_a_restart(default_plan):  # noqa: F811
    assert default_plan.apply_class(default_plan.with_changes({"actor_token_budget": 8192, "rollout_tp": 1})) \
        == "restart"
    other = Plan.from_verl(["trainer.total_epochs=3"])
    assert default_plan.diff(other) == [{"knob": None, "keys": ["trainer.total_epochs"], "old": 30, "new": 3,
                                         "apply": "restart"}]
    assert default_plan.apply_class(other) == "restart"


def test_placement_changes_are_explained_by_their_knobs(default_plan):  # noqa: F811
    changed = default_plan.with_changes({"gpus": [0, 1, 2, 3], "reward_gpus": 1, "rollout_gpus": 1})
    entries = default_plan.diff(changed)
    assert [entry["knob"] for entry in entries] == ["gpus", "reward_gpus", "rollout_gpus"]


def test_no_change_is_hot_and_empty(default_plan):  # noqa: F811
    assert default_plan.diff(Plan.from_verl([])) == []
    assert default_plan.apply_class(Plan.from_verl([])) == "hot"
