"""THE knob table: every setting the workbench lets an operator turn, declared once (what one knob declares, and
its value checks, is workbench/knob.py).

Widgets, validation, export and advice all derive from `KNOBS`. A knob either sets one or more verl config keys
(all to the same value; its default is read from verl's own composed config, never retyped here) or is a
workbench-level knob (`keys` empty: GPU placement), whose verl keys `plan.py` derives by a rule and lists in
`derived_keys`.

Apply classes: "hot" knobs are applied by the runner between steps without a restart (batching settings verl 0.9.1
reads per call; fused kernels and gradient checkpointing switched in the live workers); "restart" knobs need a
checkpoint at the step boundary and a resume under the new plan: verl rebuilt in place, keeping what the change
leaves alone (`runner.keeps`: the rollout, its servers, the trainer, the run's processes), or relaunched where only new
processes take it.

Each knob also says, for the code that reasons about it: which roles it configures (`roles`), which of verl's step
phases it moves (`phases`, as in `timing_s/<phase>`), how the live runner applies it (`runner`, a RunnerPath) and
which what-if effect models it (`model_group`, one of predict.MODEL_GROUPS or UNMODELLED). The lists other modules
need (token budgets, micro batches, offloads, a role's knobs, a trainer call's budget) are derived here from those.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from workbench.knob import (DYNAMIC_BSZ_INFO, KEEPS_PROCESSES, KEEPS_ROLLOUT, KEEPS_SERVERS, KEEPS_TRAINER, MAX_GPUS,
                            MAX_SEQUENCES, MAX_TOKENS, RELAUNCH, TOKEN_BUDGET_INFO, UNMODELLED, WHOLE_STEP, Knob,
                            RunnerPath, call_budget, call_micro_batch, restart, worker_method)

_ROLLOUT = "actor_rollout_ref.rollout"
_PLACEMENT_KEYS = ("trainer.n_gpus_per_node",)

KNOBS: dict[str, Knob] = {knob.name: knob for knob in (
    # --- placement: which GPUs, and which of them each pool gets --------------------------------------------------
    Knob("gpus", (), "gpus", "restart", "placement",
         "Physical GPU indices for this session (CUDA_VISIBLE_DEVICES); actor+rollout+ref get what the pools leave.",
         workbench_default=[0], derived_keys=_PLACEMENT_KEYS,
         roles=("placement",), phases=WHOLE_STEP, model_group=UNMODELLED, runner=restart(RELAUNCH)),
    Knob("critic_gpus", (), "int", "restart", "placement",
         "GPUs of `gpus` for the critic alone (0 = shares the actor's GPUs); launched by workbench.launch.",
         bounds=(0, MAX_GPUS), workbench_default=0, derived_keys=_PLACEMENT_KEYS,
         roles=("critic",), phases=("values", "update_critic"), model_group=UNMODELLED, runner=restart(RELAUNCH)),
    Knob("reward_gpus", (), "int", "restart", "placement",
         "GPUs of `gpus` for the reward model's own pool (0 = colocated); needs reward.reward_model.enable.",
         bounds=(0, MAX_GPUS), workbench_default=0,
         derived_keys=_PLACEMENT_KEYS + ("reward.reward_model.enable_resource_pool",
                                         "reward.reward_model.n_gpus_per_node", "reward.reward_model.nnodes"),
         roles=("reward",), phases=("reward",), model_group=UNMODELLED, runner=restart(RELAUNCH)),
    Knob("rollout_gpus", (), "int", "restart", "placement",
         "GPUs of `gpus` for standalone rollout servers; trainer_mode=separate_async needs at least one.",
         bounds=(0, MAX_GPUS), workbench_default=0,
         derived_keys=_PLACEMENT_KEYS + (f"{_ROLLOUT}.nnodes", f"{_ROLLOUT}.n_gpus_per_node"),
         roles=("rollout",), phases=("gen", "update_weights"), model_group=UNMODELLED, runner=restart(RELAUNCH)),
    # --- token budgets --------------------------------------------------------------------------------------------
    Knob("use_dynamic_bsz", ("actor_rollout_ref.actor.use_dynamic_bsz", f"{_ROLLOUT}.log_prob_use_dynamic_bsz",
                             "actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "critic.use_dynamic_bsz"),
         "bool", "hot", "token budgets",
         "Pack micro batches by token budget instead of a fixed number of sequences.",
         roles=("actor", "ref", "critic"), phases=("old_log_prob", "ref", "values", "update_critic", "update_actor"),
         # verl 0.9.1's V1 critic engine packs by tokens whatever critic.use_dynamic_bsz says (its engine config keeps
         # EngineConfig's default, True): only the actor's and ref's calls read this flag.
         runner=RunnerPath("call", calls=("_compute_old_log_prob", "_compute_ref_log_prob", "_update_actor"),
                           info=DYNAMIC_BSZ_INFO),
         model_group="batching"),
    Knob("actor_token_budget", ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",), "int", "hot",
         "token budgets", "Tokens per GPU per actor-update micro batch (with use_dynamic_bsz).", bounds=(1, MAX_TOKENS),
         roles=("actor",), phases=("update_actor",),
         runner=call_budget("_update_actor"), model_group="batching", micro_batch_unit="tokens"),
    Knob("logprob_token_budget", (f"{_ROLLOUT}.log_prob_max_token_len_per_gpu",), "int", "hot", "token budgets",
         "Tokens per GPU per old-log-prob micro batch (with use_dynamic_bsz).", bounds=(1, MAX_TOKENS),
         roles=("actor",), phases=("old_log_prob",),
         runner=call_budget("_compute_old_log_prob"), model_group="batching", micro_batch_unit="tokens"),
    Knob("ref_token_budget", ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",), "int", "hot",
         "token budgets", "Tokens per GPU per reference log-prob micro batch (with use_dynamic_bsz).",
         bounds=(1, MAX_TOKENS),
         roles=("ref",), phases=("ref",),
         runner=call_budget("_compute_ref_log_prob"), model_group="batching", micro_batch_unit="tokens"),
    # verl 0.9.1's V1 trainer feeds the critic engine's train AND infer budgets from ppo_infer_max_token_len_per_gpu
    # (trainer_base.py), a key only CriticConfig declares; ppo_max_token_len_per_gpu is set too so both agree.
    Knob("critic_token_budget", ("critic.ppo_infer_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu"),
         "int", "hot", "token budgets",
         "Tokens per GPU per critic micro batch (always read: verl's V1 critic packs by tokens whatever "
         "use_dynamic_bsz says).",
         bounds=(1, MAX_TOKENS),
         roles=("critic",), phases=("values", "update_critic"),
         runner=call_budget("_compute_values", "_update_critic"), model_group="batching", micro_batch_unit="tokens"),
    # --- LoRA critic ----------------------------------------------------------------------------------------------
    Knob("critic_lora_rank", ("critic.model.lora_rank",), "int", "restart", "LoRA critic",
         "LoRA rank of the critic (0 = full fine-tuning); runs through workbench.launch.", bounds=(0, 4096),
         roles=("critic",), phases=("values", "update_critic"), model_group="critic_lora", runner=restart(KEEPS_ROLLOUT)),
    Knob("critic_lora_alpha", ("critic.model.lora_alpha",), "int", "restart", "LoRA critic",
         "LoRA scaling factor alpha of the critic.", bounds=(1, 1 << 16),
         roles=("critic",), phases=("values", "update_critic"), model_group="critic_lora", runner=restart(KEEPS_ROLLOUT)),
    Knob("critic_lora_targets", ("critic.model.target_modules",), "str", "restart", "LoRA critic",
         "Critic modules that get LoRA adapters: all-linear or a list of module names.",
         roles=("critic",), phases=("values", "update_critic"), model_group="critic_lora", runner=restart(KEEPS_ROLLOUT)),
    # --- async ----------------------------------------------------------------------------------------------------
    Knob("trainer_mode", ("trainer.v1.trainer_mode",), "choice", "restart", "async",
         "V1 trainer: sync, colocate_async (shared GPUs: the next batch generates beside this one, not during "
         "training) or separate_async (own rollout GPUs: generation overlaps training).",
         choices=("sync", "colocate_async", "separate_async"),
         roles=("trainer",), phases=WHOLE_STEP, model_group="trainer_mode", runner=restart(KEEPS_SERVERS)),
    Knob("hybrid_switch", ("trainer.v1.separate_async.hybrid_rollout.enable_switch",), "bool", "restart", "async",
         "separate_async: lend idle trainer GPUs to rollout.",
         roles=("trainer",), phases=WHOLE_STEP, model_group=UNMODELLED, runner=restart(RELAUNCH)),
    # --- rollout --------------------------------------------------------------------------------------------------
    Knob("rollout_gpu_memory", (f"{_ROLLOUT}.gpu_memory_utilization",), "float", "restart", "rollout",
         "Share of each GPU's memory the rollout engine may take.", bounds=(0.0, 0.95), lower_bound_open=True,
         roles=("rollout",), phases=("gen",), model_group="rollout_engine", runner=restart(KEEPS_TRAINER)),
    Knob("rollout_tp", (f"{_ROLLOUT}.tensor_model_parallel_size",), "int", "restart", "rollout",
         "Tensor-parallel GPUs per rollout replica.", bounds=(1, MAX_GPUS),
         roles=("rollout",), phases=("gen", "update_weights"), model_group=UNMODELLED, runner=restart(KEEPS_PROCESSES)),
    Knob("rollout_max_batched_tokens", (f"{_ROLLOUT}.max_num_batched_tokens",), "int", "restart", "rollout",
         "Most tokens the rollout engine schedules in one forward pass.", bounds=(1, MAX_TOKENS),
         roles=("rollout",), phases=("gen",), model_group="rollout_engine", runner=restart(KEEPS_TRAINER)),
    Knob("rollout_enforce_eager", (f"{_ROLLOUT}.enforce_eager",), "bool", "restart", "rollout",
         "Run vLLM without CUDA graphs: a shorter start-up, slower decoding (false = capture CUDA graphs).",
         roles=("rollout",), phases=("gen",), model_group="rollout_enforce_eager", runner=restart(KEEPS_TRAINER)),
    Knob("rollout_max_num_seqs", (f"{_ROLLOUT}.max_num_seqs",), "int", "restart", "rollout",
         "Most sequences the rollout engine decodes at once (vLLM max_num_seqs).", bounds=(1, MAX_SEQUENCES),
         roles=("rollout",), phases=("gen",), model_group="waves", runner=restart(KEEPS_TRAINER)),
    Knob("agent_workers", (f"{_ROLLOUT}.agent.num_workers",), "int", "restart", "rollout",
         "Agent-loop workers that send prompts to the rollout servers (H200: 2 -> 8 changed nothing).",
         bounds=(1, 1024),
         roles=("rollout",), phases=("gen",), model_group="rollout_engine", runner=restart(KEEPS_SERVERS)),
    # --- algorithm: knobs that change what is trained (never proposed unless asked for) --------------------------
    Knob("rollout_logprob_bypass", ("algorithm.rollout_correction.bypass_mode",), "bool", "restart", "algorithm",
         "CHANGES THE ALGORITHM: use vLLM's rollout log-probs as old log-probs, skipping the old_log_prob pass.",
         changes_algorithm=True,
         roles=("actor",), phases=("old_log_prob",), model_group="rollout_logprob_bypass", runner=restart(KEEPS_SERVERS)),
    # --- memory ---------------------------------------------------------------------------------------------------
    Knob("actor_param_offload", ("actor_rollout_ref.actor.fsdp_config.param_offload",), "bool", "restart",
         "memory", "Keep actor parameters on the CPU between uses.",
         roles=("actor",), phases=("old_log_prob", "update_actor", "update_weights"), model_group="offload", runner=restart(KEEPS_ROLLOUT)),
    Knob("actor_optimizer_offload", ("actor_rollout_ref.actor.fsdp_config.optimizer_offload",), "bool", "restart",
         "memory", "Keep actor optimizer state on the CPU between updates.",
         roles=("actor",), phases=("update_actor",), model_group="offload", runner=restart(KEEPS_ROLLOUT)),
    Knob("ref_param_offload", ("actor_rollout_ref.ref.fsdp_config.param_offload",), "bool", "restart", "memory",
         "Keep reference-policy parameters on the CPU between uses.",
         roles=("ref",), phases=("ref",), model_group="offload", runner=restart(KEEPS_ROLLOUT)),
    # The critic's FSDP engine config is critic.fsdp (FSDPCriticConfig.fsdp), not critic.model.fsdp_config.
    Knob("critic_param_offload", ("critic.fsdp.param_offload",), "bool", "restart", "memory",
         "Keep critic parameters on the CPU between uses.",
         roles=("critic",), phases=("values", "update_critic"), model_group="offload", runner=restart(KEEPS_ROLLOUT)),
    Knob("critic_optimizer_offload", ("critic.fsdp.optimizer_offload",), "bool", "restart", "memory",
         "Keep critic optimizer state on the CPU between updates.",
         roles=("critic",), phases=("update_critic",), model_group="offload", runner=restart(KEEPS_ROLLOUT)),
    Knob("gradient_checkpointing", ("actor_rollout_ref.model.enable_gradient_checkpointing",
                                    "critic.model.enable_gradient_checkpointing"), "bool", "hot", "memory",
         "Recompute activations in the backward pass (actor and critic): less memory, more compute.",
         roles=("actor", "critic"), phases=("update_actor", "update_critic"),
         runner=worker_method("_wb_gradient_checkpointing"),
         model_group="gradient_checkpointing"),
    # --- kernels: verl 0.9.1 without flash-attn computes log-probs with a Python loop over tokens -------------------
    # (verl/utils/torch_functional.py logprobs_from_logits_v2); the fused path replaces it with chunked matmuls.
    Knob("fused_kernels", ("actor_rollout_ref.model.use_fused_kernels",), "bool", "hot", "kernels",
         "Fused lm-head + log-prob kernels for actor and ref (H200, no flash-attn: update_actor 38-41 s -> 3.9-4.6 s).",
         roles=("actor", "ref"), phases=("old_log_prob", "ref", "update_actor"),
         runner=worker_method("_wb_fused_kernels"), model_group="fused_kernels"),
    # verl's triton backend (utils/kernel/linear_cross_entropy.py) returns flat (batch*seq,) log-probs; the padded
    # path (use_remove_padding=False, what runs without flash-attn) indexes output.log_probs.shape[1] and a
    # (batch, seq) mask (workers/engine/fsdp/transformer_impl.py) and fails. torch and liger keep (batch, seq).
    Knob("fused_kernel_backend", ("actor_rollout_ref.model.fused_kernel_options.impl_backend",), "choice", "hot",
         "kernels", "Fused-kernel backend: torch, or liger (needs liger-kernel, else runs torch); triton is left out: "
         "its flat output breaks verl's padded path.", choices=("torch", "liger"),
         roles=("actor", "ref"), phases=("old_log_prob", "ref", "update_actor"),
         runner=worker_method("_wb_fused_kernels"), model_group="batching"),
    Knob("remove_padding", ("actor_rollout_ref.model.use_remove_padding", "critic.model.use_remove_padding"),
         "bool", "restart", "kernels",
         "Pack sequences without padding (actor, ref, critic); needs flash-attn installed in the verl workers.",
         roles=("actor", "ref", "critic"),
         phases=("old_log_prob", "ref", "values", "update_critic", "update_actor"), model_group=UNMODELLED, runner=restart(KEEPS_ROLLOUT)),
    # --- batch ----------------------------------------------------------------------------------------------------
    Knob("train_batch_size", ("data.train_batch_size",), "int", "restart", "batch",
         "Prompts per training step.", bounds=(1, MAX_SEQUENCES),
         roles=("data",), phases=WHOLE_STEP, model_group="tokens", runner=restart(KEEPS_SERVERS)),
    Knob("ppo_mini_batch_size", ("actor_rollout_ref.actor.ppo_mini_batch_size", "critic.ppo_mini_batch_size"),
         "int", "restart", "batch", "Prompts per optimizer step (actor and critic).", bounds=(1, MAX_SEQUENCES),
         roles=("actor", "critic"), phases=("update_actor", "update_critic"), model_group="batching", runner=restart(KEEPS_ROLLOUT)),
    Knob("actor_micro_batch", ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",), "int", "hot",
         "batch", "Sequences per GPU per actor-update micro batch (without use_dynamic_bsz).",
         bounds=(1, MAX_SEQUENCES), nullable=True,
         roles=("actor",), phases=("update_actor",), runner=call_micro_batch("_update_actor"),
         model_group="batching",
         micro_batch_unit="sequences"),
    Knob("logprob_micro_batch", (f"{_ROLLOUT}.log_prob_micro_batch_size_per_gpu",), "int", "hot", "batch",
         "Sequences per GPU per old-log-prob micro batch (without use_dynamic_bsz).",
         bounds=(1, MAX_SEQUENCES), nullable=True,
         roles=("actor",), phases=("old_log_prob",), runner=call_micro_batch("_compute_old_log_prob"),
         model_group="batching",
         micro_batch_unit="sequences"),
    Knob("ref_micro_batch", ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",), "int", "hot",
         "batch", "Sequences per GPU per reference log-prob micro batch (without use_dynamic_bsz).",
         bounds=(1, MAX_SEQUENCES), nullable=True,
         roles=("ref",), phases=("ref",), runner=call_micro_batch("_compute_ref_log_prob"), model_group="batching",
         micro_batch_unit="sequences"),
    Knob("critic_micro_batch", ("critic.ppo_micro_batch_size_per_gpu",), "int", "hot", "batch",
         "Sequences per GPU per critic micro batch: never read by verl's V1 critic, which packs by "
         "critic_token_budget.", bounds=(1, MAX_SEQUENCES),
         nullable=True,
         roles=("critic",), phases=("values", "update_critic"),
         runner=call_micro_batch("_compute_values", "_update_critic"), model_group="batching",
         micro_batch_unit="sequences"),
    Knob("max_prompt_length", ("data.max_prompt_length",), "int", "restart", "batch",
         "Longest prompt in tokens.", bounds=(1, MAX_TOKENS),
         roles=("data",), phases=WHOLE_STEP, model_group="tokens", runner=restart(KEEPS_PROCESSES)),
    Knob("max_response_length", ("data.max_response_length",), "int", "restart", "batch",
         "Longest generated response in tokens.", bounds=(1, MAX_TOKENS),
         roles=("data",), phases=WHOLE_STEP, model_group="tokens", runner=restart(KEEPS_PROCESSES)),
    # --- environment ----------------------------------------------------------------------------------------------
    Knob("nccl_env", ("ray_kwargs.ray_init.runtime_env.env_vars",), "env", "restart", "environment",
         "NCCL_*/TORCH_NCCL_* variables for every Ray worker (e.g. NCCL_P2P_DISABLE=1).",
         roles=("environment",), phases=WHOLE_STEP, model_group=UNMODELLED, runner=restart(RELAUNCH)),
)}

WORKBENCH_KNOBS: tuple[str, ...] = tuple(name for name, knob in KNOBS.items() if knob.workbench_only)
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(knob.group for knob in KNOBS.values()))
ALGORITHM_KNOBS: tuple[str, ...] = tuple(name for name, knob in KNOBS.items() if knob.changes_algorithm)
HOT_KNOBS: tuple[str, ...] = tuple(name for name, knob in KNOBS.items() if knob.apply == "hot")
# Per-GPU token budgets (with use_dynamic_bsz) and micro-batch sizes (without it), in table order: actor first.
TOKEN_BUDGET_KNOBS: tuple[str, ...] = tuple(n for n, k in KNOBS.items() if k.micro_batch_unit == "tokens")
MICRO_BATCH_KNOBS: tuple[str, ...] = tuple(n for n, k in KNOBS.items() if k.micro_batch_unit == "sequences")
# The trainer calls whose engines follow the plan's use_dynamic_bsz (its runner path). Every other call packs its
# micro batches by tokens whatever the flag says: verl 0.9.1's V1 critic engine keeps EngineConfig's default (True),
# and the runner tells it so (runner/trainer.py _wb_call_settings).
DYNAMIC_BSZ_CALLS: tuple[str, ...] = KNOBS["use_dynamic_bsz"].runner.calls


def follows_dynamic_bsz(name: str) -> bool:
    """Whether the calls a token budget or micro-batch size configures pack by tokens only with use_dynamic_bsz."""
    return set(KNOBS[name].runner.calls) <= set(DYNAMIC_BSZ_CALLS)


def batching_knobs_read(use_dynamic_bsz: bool) -> tuple[str, ...]:
    """The token budgets and micro-batch sizes verl reads with this use_dynamic_bsz: a call that packs by tokens
    reads its budget, any other its micro-batch size."""
    return tuple(name for name in TOKEN_BUDGET_KNOBS + MICRO_BATCH_KNOBS
                 if (KNOBS[name].micro_batch_unit == "tokens")
                 == (bool(use_dynamic_bsz) or not follows_dynamic_bsz(name)))


def knobs_in_group(model_group: str) -> tuple[str, ...]:
    """The knobs the what-if model moves with one effect (e.g. "offload"), in table order."""
    return tuple(name for name, knob in KNOBS.items() if knob.model_group == model_group)


def knobs_of_role(role: str) -> tuple[str, ...]:
    """The knobs that configure `role` alone: they mean nothing in a plan that runs no such role."""
    return tuple(name for name, knob in KNOBS.items() if knob.roles == (role,))


def knobs_in_use(names: tuple[str, ...], roles: Any) -> tuple[str, ...]:
    """Those of `names` whose roles all run in a plan (`roles`: verl_config.roles_in_use)."""
    runs = {"ref": roles.reference_policy, "critic": roles.critic, "reward": roles.reward_model}
    return tuple(name for name in names if all(runs.get(role, True) for role in KNOBS[name].roles))


def model_groups() -> dict[str, str]:
    """knob -> what-if effect group, for every knob the what-if model has an effect for."""
    return {name: knob.model_group for name, knob in KNOBS.items() if knob.model_group != UNMODELLED}


def settings_of_call() -> dict[str, dict[str, str]]:
    """verl trainer call -> {extra_info key: the knob whose live value the runner passes under it} (paths of kind
    call)."""
    out: dict[str, dict[str, str]] = {}
    for name, knob in KNOBS.items():
        if knob.runner.kind == "call":
            for call in knob.runner.calls:
                out.setdefault(call, {})[knob.runner.info] = name
    return out


def budget_of_call() -> dict[str, str]:
    """verl trainer call -> the token-budget knob the runner passes to it."""
    return {call: infos[TOKEN_BUDGET_INFO] for call, infos in settings_of_call().items() if TOKEN_BUDGET_INFO in infos}


@functools.cache
def _defaults() -> dict[str, Any]:
    return {name: knob.verl_default() for name, knob in KNOBS.items()}


def knob_defaults() -> dict[str, Any]:
    """Every knob's default: verl's default config for verl knobs, the workbench's own for placement."""
    return copy.deepcopy(_defaults())


# ------------------------------------------------------------------------------------------------ the table a view renders
KNOB_TABLE_COLUMNS = ("name", "group", "kind", "value", "default", "changed", "apply", "keeps", "min", "max", "choices",
                      "help", "relevant", "why_irrelevant")


def irrelevant_knobs(values: dict[str, Any], roles: Any) -> dict[str, str]:
    """Knobs that change nothing in a plan with these values, each with the reason; `roles` says which optional
    roles run (critic, reference_policy, reward_model: see verl_config.roles_in_use)."""
    why: dict[str, str] = {}
    read = batching_knobs_read(values["use_dynamic_bsz"])
    for name in TOKEN_BUDGET_KNOBS + MICRO_BATCH_KNOBS:
        if name in read:
            continue
        if not follows_dynamic_bsz(name):
            why[name] = ("never read: verl's V1 critic packs its micro batches by its token budget whatever "
                         "use_dynamic_bsz says (verl's config check still wants a value without use_dynamic_bsz)")
        elif KNOBS[name].micro_batch_unit == "sequences":
            why[name] = "used only without use_dynamic_bsz (token budgets size micro batches)"
        else:
            why[name] = "used only with use_dynamic_bsz (micro batch sizes apply without it)"
    if values["critic_lora_rank"] == 0:
        why.update(dict.fromkeys(("critic_lora_alpha", "critic_lora_targets"), "used only with critic_lora_rank > 0"))
    if values["trainer_mode"] != "separate_async":
        why.update(dict.fromkeys(("rollout_gpus", "hybrid_switch"), "used only with trainer_mode=separate_async"))
    if not roles.reference_policy:
        why.update(dict.fromkeys(knobs_of_role("ref"),
                                 "this plan runs no reference policy (no KL loss, no KL in the reward)"))
    if not roles.critic:
        why.update(dict.fromkeys(knobs_of_role("critic"), "this plan runs no critic"))
    if not roles.reward_model:
        why.update(dict.fromkeys(knobs_of_role("reward"),
                                 "this plan runs no reward model (reward.reward_model.enable is false)"))
    if not values["fused_kernels"]:
        why["fused_kernel_backend"] = "used only with fused_kernels on"
    return why


def knob_rows(values: dict[str, Any], defaults: dict[str, Any], irrelevant: dict[str, str]) -> list[dict[str, Any]]:
    """One row per knob (KNOB_TABLE_COLUMNS): its declaration, its value and default in a plan, and whether it
    means anything there."""
    return [
        {"name": name, "group": knob.group, "kind": knob.kind, "value": values[name], "default": defaults[name],
         "changed": values[name] != defaults[name], "apply": knob.apply, "keeps": knob.runner.keeps,
         "min": knob.bounds[0], "max": knob.bounds[1],
         "choices": list(knob.choices), "help": knob.help, "relevant": name not in irrelevant,
         "why_irrelevant": irrelevant.get(name, "")}
        for name, knob in KNOBS.items()
    ]
