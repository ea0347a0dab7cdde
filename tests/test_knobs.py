"""The knob table against verl 0.9.1: every key exists, defaults come from verl, values parse and check."""

from __future__ import annotations

import pytest

from workbench.knob import APPLY_CLASSES, Knob
from workbench.knobs import KNOBS, WORKBENCH_KNOBS
from workbench import verl_config

ENV_NODE_PARENT = "ray_kwargs.ray_init.runtime_env"


@pytest.mark.parametrize("name", list(KNOBS))
def test_every_knob_key_exists_in_verl(name):
    knob = KNOBS[name]
    for key in knob.keys + knob.derived_keys:
        if knob.kind == "env":
            # env_vars is Ray's runtime_env field, not verl's: verl's YAML holds the runtime_env node it merges.
            assert verl_config.in_config(verl_config.default_config(), ENV_NODE_PARENT), key
        else:
            assert verl_config.key_exists(key), f"{name}: verl 0.9.1 has no key {key}"


def test_critic_budget_key_exists_only_as_a_dataclass_field():
    key = "critic.ppo_infer_max_token_len_per_gpu"
    default = verl_config.default_config()
    assert not verl_config.in_config(default, key)
    assert key in verl_config.existing_keys()
    assert verl_config.read_key(default, key) == 32768


@pytest.mark.parametrize("key", list(verl_config.DATACLASS_ONLY_DEFAULTS))
def test_the_dataclass_only_defaults_are_verls(key):
    default = verl_config.default_config()
    assert not verl_config.in_config(default, key)  # only in the dataclass: read from it (importing verl) here
    assert verl_config._dataclass_field_default(default, key) == verl_config.DATACLASS_ONLY_DEFAULTS[key]
    assert KNOBS["critic_token_budget"].keys[0] == key


@pytest.mark.parametrize("name", list(KNOBS))
def test_defaults_come_from_verl_and_pass_their_own_checks(name):
    knob = KNOBS[name]
    default = knob.verl_default()
    if not knob.workbench_only:
        assert default == knob.read(verl_config.default_config())
    assert knob.problems(default) == [], (name, default)


def test_table_is_well_formed():
    assert WORKBENCH_KNOBS == ("gpus", "critic_gpus", "reward_gpus", "rollout_gpus")
    for name, knob in KNOBS.items():
        assert knob.name == name
        assert knob.apply in APPLY_CLASSES
        assert knob.help and "\n" not in knob.help
        assert knob.workbench_only == (knob.workbench_default is not None)
    hot = {name for name, knob in KNOBS.items() if knob.apply == "hot"}
    assert hot == {"actor_token_budget", "logprob_token_budget", "ref_token_budget", "critic_token_budget",
                   "use_dynamic_bsz", "actor_micro_batch", "logprob_micro_batch", "ref_micro_batch",
                   "critic_micro_batch", "fused_kernels", "fused_kernel_backend", "gradient_checkpointing"}
    assert KNOBS["critic_token_budget"].keys == ("critic.ppo_infer_max_token_len_per_gpu",
                                                 "critic.ppo_max_token_len_per_gpu")


def test_a_knob_with_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        Knob("x", (), "complex", "hot", "g", "help")


@pytest.mark.parametrize("name, text, value", [
    ("gpus", "0,1", [0, 1]),
    ("gpus", "[2, 3]", [2, 3]),
    ("use_dynamic_bsz", "True", True),
    ("hybrid_switch", "off", False),
    ("actor_micro_batch", "none", None),
    ("actor_micro_batch", "4", 4),
    ("rollout_gpu_memory", "0.4", 0.4),
    ("trainer_mode", "colocate_async", "colocate_async"),
    ("critic_lora_targets", "all-linear", "all-linear"),
    ("critic_lora_targets", "q_proj, v_proj", ["q_proj", "v_proj"]),
    ("critic_lora_targets", '["q_proj"]', ["q_proj"]),
    ("nccl_env", "NCCL_DEBUG=INFO; NCCL_SOCKET_IFNAME=eth0,eth1",
     {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0,eth1"}),
    ("nccl_env", '{"NCCL_P2P_DISABLE": 1}', {"NCCL_P2P_DISABLE": "1"}),
    ("nccl_env", "", {}),
])
def test_parse(name, text, value):
    assert KNOBS[name].parse(text) == value


@pytest.mark.parametrize("name, text", [
    ("train_batch_size", "abc"),
    ("use_dynamic_bsz", "maybe"),
    ("nccl_env", "NCCL_DEBUG"),
    ("gpus", "0,x"),
])
def test_parse_rejects_naming_the_knob(name, text):
    with pytest.raises(ValueError, match=f"^{name}:"):
        KNOBS[name].parse(text)


@pytest.mark.parametrize("name, value, fragment", [
    ("rollout_gpu_memory", 0.0, "below its range (0.0, 0.95]"),
    ("rollout_gpu_memory", 0.96, "above its range"),
    ("train_batch_size", True, "is not an integer"),
    ("rollout_gpu_memory", float("nan"), "is not a number"),
    ("train_batch_size", None, "is not an integer"),
    ("gpus", [1, 1], "GPU 1 is listed twice"),
    ("gpus", [-1], "GPU index -1 is negative"),
    ("nccl_env", {"LD_PRELOAD": "x"}, "is not an NCCL variable"),
    ("critic_lora_targets", ["q_proj", ""], "non-empty string"),
])
def test_problems_name_the_knob(name, value, fragment):
    problems = KNOBS[name].problems(KNOBS[name].normalize(value))
    assert problems and all(problem.startswith(f"{name}: ") for problem in problems)
    assert any(fragment in problem for problem in problems), problems


def test_values_at_the_edges_are_accepted():
    assert KNOBS["rollout_gpu_memory"].problems(0.95) == []
    assert KNOBS["critic_lora_rank"].problems(0) == []
    assert KNOBS["actor_micro_batch"].problems(None) == []
    assert KNOBS["rollout_gpu_memory"].normalize(1) == 1.0


# ------------------------------------------------------------------------------- verl's real levers (issue 12)
LEVERS = {
    "fused_kernels": ("actor_rollout_ref.model.use_fused_kernels", False, "hot"),
    "fused_kernel_backend": ("actor_rollout_ref.model.fused_kernel_options.impl_backend", "torch", "hot"),
    "rollout_enforce_eager": ("actor_rollout_ref.rollout.enforce_eager", False, "restart"),
    "rollout_max_num_seqs": ("actor_rollout_ref.rollout.max_num_seqs", 256, "restart"),
    "agent_workers": ("actor_rollout_ref.rollout.agent.num_workers", 8, "restart"),
    "rollout_logprob_bypass": ("algorithm.rollout_correction.bypass_mode", False, "restart"),
}


@pytest.mark.parametrize("name", list(LEVERS))
def test_levers_set_verl_091_keys_with_verl_defaults(name):
    key, default, apply = LEVERS[name]
    assert KNOBS[name].keys[0] == key
    assert KNOBS[name].verl_default() == default
    assert KNOBS[name].apply == apply


def test_fused_kernels_reach_actor_and_ref_through_verl_interpolation():
    config = verl_config.compose_config(["actor_rollout_ref.model.use_fused_kernels=True"])
    assert config.actor_rollout_ref.actor.use_fused_kernels is True


def test_triton_backend_is_not_offered():
    # verl 0.9.1's triton kernel returns flat log-probs that the padded (no flash-attn) path cannot index.
    assert KNOBS["fused_kernel_backend"].choices == ("torch", "liger")
    assert "triton" in KNOBS["fused_kernel_backend"].help
    assert KNOBS["fused_kernel_backend"].problems("triton")


def test_only_the_bypass_is_marked_as_changing_the_algorithm():
    from workbench.knobs import ALGORITHM_KNOBS

    assert ALGORITHM_KNOBS == ("rollout_logprob_bypass",)
    assert KNOBS["rollout_logprob_bypass"].help.startswith("CHANGES THE ALGORITHM")


def test_the_backend_means_nothing_without_fused_kernels():
    from workbench.knobs import irrelevant_knobs, knob_defaults

    roles = verl_config.roles_in_use(verl_config.default_config())
    assert "fused_kernel_backend" in irrelevant_knobs(knob_defaults(), roles)
    assert "fused_kernel_backend" not in irrelevant_knobs({**knob_defaults(), "fused_kernels": True}, roles)


def test_the_critic_packs_by_tokens_whatever_use_dynamic_bsz_says():
    """verl 0.9.1's V1 critic engine keeps EngineConfig's use_dynamic_bsz (True) whatever critic.use_dynamic_bsz
    says, so it always reads its token budget and never its micro-batch size; the actor's and ref's calls follow the
    flag. Read from the table: the calls that take use_dynamic_bsz (its runner path) are the actor's and ref's."""
    from workbench.knobs import irrelevant_knobs, knob_defaults

    roles = verl_config.roles_in_use(verl_config.default_config())
    assert roles.critic
    for dynamic in (False, True):
        why = irrelevant_knobs({**knob_defaults(), "use_dynamic_bsz": dynamic}, roles)
        assert "critic_token_budget" not in why
        assert "token budget" in why["critic_micro_batch"] and "critic" in why["critic_micro_batch"]
        assert ("actor_token_budget" in why) is (not dynamic) and ("actor_micro_batch" in why) is dynamic
        assert ("logprob_token_budget" in why) is (not dynamic) and ("logprob_micro_batch" in why) is dynamic


ROLE_VARIANTS = (  # overrides that move verl's role rules one way or the other
    (), ("algorithm.adv_estimator=grpo",), ("algorithm.adv_estimator=grpo", "critic.enable=True"),
    ("critic.enable=False",), ("actor_rollout_ref.actor.use_kl_loss=True",), ("algorithm.use_kl_in_reward=True",),
    ("reward.reward_model.enable=True",),
)


@pytest.mark.parametrize("overrides", ROLE_VARIANTS, ids=lambda o: " ".join(o) or "defaults")
def test_the_roles_in_use_are_verls_own_rules(overrides):
    """roles_in_use reads the config as verl 0.9.1's need_reference_policy / need_critic / need_reward_model do
    (verl/trainer/ppo/utils.py), without importing verl (torch: a minute on a loaded 2-core machine, in every page
    kernel that showed the knob table)."""
    import warnings

    from verl.trainer.ppo.utils import need_critic, need_reference_policy, need_reward_model

    config = verl_config.compose_config(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        verls = (bool(need_reference_policy(config)), bool(need_critic(config)), bool(need_reward_model(config)))
    roles = verl_config.roles_in_use(config)
    assert (roles.reference_policy, roles.critic, roles.reward_model) == verls


def test_the_pages_reads_and_a_previews_checks_need_no_verl(monkeypatch):
    """The dashboard's knob table, device planner and a preview's checks read verl's YAML config only: a page kernel
    never imports verl (and torch with it). Every verl module is hidden here, as if not imported yet."""
    import sys

    from workbench.plan import Plan
    from workbench.session import Session, resolve_recording

    verl_config.config_dir()  # where verl's YAML lies (found once per process, without importing verl)
    for name in [n for n in sys.modules if n == "verl" or n.startswith("verl.")] + ["verl"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import verl…` now fails
    session = Session.attach(resolve_recording("h200-tuning"), read_only=True)
    assert len(session.knob_table()) == len(KNOBS) and len(session.placement())
    plan = session.plan.with_changes({"actor_token_budget": 8192})
    plan.validate(with_verl=False)
    assert isinstance(plan, Plan)
