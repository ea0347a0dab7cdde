"""THE knob table: every setting the workbench lets an operator turn, declared once.

Widgets, validation, export and advice all derive from `KNOBS`. A knob either sets one or more verl config keys
(all to the same value; its default is read from verl's own composed config, never retyped here) or is a
workbench-level knob (`keys` empty: GPU placement), whose verl keys `plan.py` derives by a rule and lists in
`derived_keys`.

Apply classes: "hot" knobs are applied by the runner between steps without a restart (batching settings verl 0.9.1
reads per call; fused kernels and gradient checkpointing switched in the live workers); "restart" knobs need a
checkpoint, a relaunch and a resume.

Each knob also says, for the code that reasons about it: which roles it configures (`roles`), which of verl's step
phases it moves (`phases`, as in `timing_s/<phase>`), how the live runner applies it (`runner`, a RunnerPath) and
which what-if effect models it (`model_group`, one of predict.MODEL_GROUPS or UNMODELLED). The lists other modules
need (token budgets, micro batches, offloads, a role's knobs, a trainer call's budget) are derived here from those.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from workbench import verl_config
from workbench.bounds import quoted

KINDS = ("int", "float", "bool", "choice", "str", "gpus", "env")
APPLY_CLASSES = ("hot", "restart")
ROLES = ("placement", "actor", "ref", "critic", "rollout", "reward", "trainer", "data", "environment")
# verl 0.9.1's step phases, named as its trainer times them (marked_timer -> metrics timing_s/<phase>).
PHASES = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "update_weights")
WHOLE_STEP = PHASES
# A knob the what-if model has no effect for: predictions list it as unmodelled, with a wider uncertainty.
UNMODELLED = "unmodelled"
MICRO_BATCH_UNITS = ("tokens", "sequences")

# Only NCCL's own variables: the nccl_env knob is for tuning communication, not a back door for any variable.
NCCL_VARIABLE = re.compile(r"^(NCCL|TORCH_NCCL)_[A-Z0-9_]+$")

_TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE_WORDS = {"false", "0", "no", "off"}
_NULL_WORDS = {"", "none", "null"}

# Upper bounds, far above any real run, so that a typo or a hostile value (10**100 tokens) is refused in words
# instead of reaching verl, and lists and strings of bounded size (an error then quotes them cut: bounds.quoted).
MAX_GPUS = 1024  # a session's GPUs, GPU indices and pools (128 nodes of 8)
MAX_TOKENS = 1 << 24  # a token budget or length: 16 M tokens per GPU
MAX_SEQUENCES = 1 << 20  # prompts per step, sequences in flight
MAX_LIST_ITEMS = 256  # items of a list-of-strings knob, variables of the env knob
MAX_TEXT = 256  # characters of one string value


@dataclass(frozen=True)
class RunnerPath:
    """How the live runner applies a knob. kind:
    "restart": the supervisor checkpoints, relaunches verl with the new plan and resumes;
    "call": the trainer puts the knob's live value into the batch's extra_info under `info` before each of `calls`
    (verl trainer methods, e.g. "_update_actor"): verl 0.9.1's engine workers take `use_dynamic_bsz`,
    `max_token_len_per_gpu` and `micro_batch_size_per_gpu` from the batch when it has them, from their engine config
    when not (workers/engine_workers.py TrainingWorker.train_batch / infer_batch);
    "worker": the trainer's method `method` says what to put in force in every worker process at the step boundary
    (runner/levers.py: re-patch the model's forward, switch gradient checkpointing on the wrapped model).
    The runner lists the hot kinds it implements (runner/trainer.py HOT_PATH_KINDS); a test holds the table to it."""

    kind: str
    calls: tuple[str, ...] = ()
    info: str = ""
    method: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PATH_KINDS:
            raise ValueError(f"runner path {self.kind!r} is not one of {PATH_KINDS}")
        if (self.kind == "call") != bool(self.calls) or (self.kind == "call") != bool(self.info):
            raise ValueError(f"runner path {self.kind!r}: calls and an extra_info key go with call, and only with it")
        if (self.kind == "worker") != bool(self.method):
            raise ValueError(f"runner path {self.kind!r}: a method goes with worker, and only with it")


PATH_KINDS = ("restart", "call", "worker")
RESTART = RunnerPath("restart")
# The extra_info keys verl's engine workers read per call.
TOKEN_BUDGET_INFO, MICRO_BATCH_INFO, DYNAMIC_BSZ_INFO = (
    "max_token_len_per_gpu", "micro_batch_size_per_gpu", "use_dynamic_bsz")


def call_budget(*calls: str) -> RunnerPath:
    """The runner path of a token budget verl reads per call: the trainer calls that take it."""
    return RunnerPath("call", calls=calls, info=TOKEN_BUDGET_INFO)


def call_micro_batch(*calls: str) -> RunnerPath:
    """The runner path of a micro-batch size (sequences per GPU) verl reads per call."""
    return RunnerPath("call", calls=calls, info=MICRO_BATCH_INFO)


def worker_method(method: str) -> RunnerPath:
    """The runner path of a setting the workers' models hold: the trainer's `method` says what to put in force."""
    return RunnerPath("worker", method=method)


@dataclass(frozen=True)
class Knob:
    """One operator-facing setting.

    kind: "int", "float", "bool", "choice" (one of `choices`), "str" (a string or a list of strings),
    "gpus" (list of physical GPU indices) or "env" (dict of NCCL environment variables).
    bounds: inclusive (minimum, maximum) for int/float knobs, None for no limit; `lower_bound_open` excludes
    the minimum itself. nullable: None is a legal value (verl's "unset").
    changes_algorithm: the knob changes what is trained, not only how fast (e.g. skipping the old-policy
    log-prob recompute); advice and tuning never propose it unless asked to.
    roles: the roles it configures (ROLES); phases: verl step phases it moves (PHASES); runner: how the live runner
    applies it (RESTART for restart-class knobs); model_group: its what-if effect (predict.MODEL_GROUPS) or
    UNMODELLED, always said; micro_batch_unit: "tokens" for a per-GPU token budget of a phase's micro batches,
    "sequences" for a per-GPU micro-batch size.
    """

    name: str
    keys: tuple[str, ...]
    kind: str
    apply: str
    group: str
    help: str
    bounds: tuple[float | None, float | None] = (None, None)
    lower_bound_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    workbench_default: Any = None
    derived_keys: tuple[str, ...] = ()
    changes_algorithm: bool = False
    roles: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    runner: RunnerPath = RESTART
    model_group: str = ""
    micro_batch_unit: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"knob {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.apply not in APPLY_CLASSES:
            raise ValueError(f"knob {self.name}: apply {self.apply!r} is not one of {APPLY_CLASSES}")
        if (self.kind == "choice") != bool(self.choices):
            raise ValueError(f"knob {self.name}: choices go with kind 'choice' and only with it")
        if not self.roles or set(self.roles) - set(ROLES):
            raise ValueError(f"knob {self.name}: roles {self.roles!r} must be some of {ROLES}")
        if not self.phases or set(self.phases) - set(PHASES):
            raise ValueError(f"knob {self.name}: phases {self.phases!r} must be some of {PHASES}")
        if (self.apply == "restart") != (self.runner.kind == "restart"):
            raise ValueError(f"knob {self.name}: a {self.apply} knob cannot take the runner path {self.runner.kind!r}")
        if not self.model_group:
            raise ValueError(f"knob {self.name}: needs a model_group (or UNMODELLED, said out loud)")
        if self.micro_batch_unit not in ("", *MICRO_BATCH_UNITS):
            raise ValueError(f"knob {self.name}: micro_batch_unit {self.micro_batch_unit!r} not in {MICRO_BATCH_UNITS}")

    @property
    def workbench_only(self) -> bool:
        """True for knobs with no verl key of their own (placement)."""
        return not self.keys

    def read(self, config: DictConfig) -> Any:
        """This knob's value in a composed verl config (its first key; for env, the NCCL variables set there)."""
        if self.workbench_only:
            raise ValueError(f"{self.name} is a workbench knob: its value is not stored in verl's config")
        if self.kind == "env":
            variables = verl_config.plain(OmegaConf.select(config, self.keys[0], default=None))
            return {
                name: str(value) for name, value in (variables or {}).items() if NCCL_VARIABLE.match(str(name))
            }
        return verl_config.read_key(config, self.keys[0])

    def verl_default(self, config: DictConfig | None = None) -> Any:
        """The default: read from verl's composed config (its own default config when None) for verl knobs,
        the workbench's own default for workbench knobs."""
        if self.workbench_only:
            return copy.deepcopy(self.workbench_default)
        return self.read(verl_config.default_config() if config is None else config)

    def normalize(self, value: Any) -> Any:
        """`value` in the knob's canonical Python form (lists not tuples, floats for float knobs, env as str)."""
        if isinstance(value, tuple):
            value = list(value)
        if self.kind == "float" and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if self.kind == "env" and isinstance(value, dict):
            return {
                name: str(item) if isinstance(item, (int, float)) and not isinstance(item, bool) else item
                for name, item in value.items()
            }
        return value

    def has_valid_type(self, value: Any) -> bool:
        """Whether `value` has this knob's type (ranges aside); cross-knob checks need this first."""
        if value is None:
            return self.nullable
        if self.kind == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        if self.kind == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
        if self.kind == "bool":
            return isinstance(value, bool)
        if self.kind == "choice":
            return isinstance(value, str)
        if self.kind == "str":
            if isinstance(value, list):
                return bool(value) and all(isinstance(item, str) and item for item in value)
            return isinstance(value, str) and bool(value)
        if self.kind == "gpus":
            return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
        return isinstance(value, dict) and all(isinstance(item, str) for item in value.values())

    def problems(self, value: Any) -> list[str]:
        """Every problem with `value` on its own (type, range, choices), each message naming the knob."""
        if not self.has_valid_type(value):
            return [f"{self.name}: {quoted(value)} is not {self._type_words()}"]
        too_large = self._size_problem(value)
        if too_large:
            return [too_large]
        if value is None:
            return []
        found: list[str] = []
        if self.kind in ("int", "float"):
            low, high = self.bounds
            if low is not None and (value <= low if self.lower_bound_open else value < low):
                found.append(f"{self.name}: {quoted(value)} is below its range {self._range_words()}")
            if high is not None and value > high:
                found.append(f"{self.name}: {quoted(value)} is above its range {self._range_words()}")
        elif self.kind == "choice" and value not in self.choices:
            found.append(f"{self.name}: {quoted(value)} is not one of {', '.join(self.choices)}")
        elif self.kind == "gpus":
            if not value:
                found.append(f"{self.name}: needs at least one GPU index")
            found += [f"{self.name}: GPU index {index} is negative" for index in value if index < 0]
            found += [f"{self.name}: GPU index {quoted(index)} is past the largest {MAX_GPUS - 1}"
                      for index in value if index >= MAX_GPUS]
            found += [f"{self.name}: GPU {index} is listed twice" for index in sorted(set(value))
                      if value.count(index) > 1]
        elif self.kind == "env":
            found += [f"{self.name}: {quoted(name, 80)} is not an NCCL variable (NCCL_* or TORCH_NCCL_*)"
                      for name in value if not NCCL_VARIABLE.match(str(name))]
        return found[:8] + ([f"{self.name}: and {len(found) - 8} more problems"] if len(found) > 8 else [])

    def _size_problem(self, value: Any) -> str | None:
        """A list or string past MAX_GPUS / MAX_LIST_ITEMS / MAX_TEXT (checked before anything else reads it)."""
        items = MAX_GPUS if self.kind == "gpus" else MAX_LIST_ITEMS
        if isinstance(value, (list, dict)) and len(value) > items:
            return f"{self.name}: {len(value):,} items, more than the {items} it may hold"
        texts = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else [value]
        longest = max((text for text in texts if isinstance(text, str)), key=len, default="")
        if len(longest) > MAX_TEXT:
            return f"{self.name}: {quoted(longest, 60)} is longer than {MAX_TEXT} characters"
        return None

    def parse(self, text: str) -> Any:
        """The value a command-line or text-box string stands for; ValueError naming the knob if none."""
        text = text.strip()
        if self.nullable and text.lower() in _NULL_WORDS:
            return None
        try:
            return self._parse(text)
        except (ValueError, json.JSONDecodeError) as error:
            raise ValueError(f"{self.name}: cannot read {quoted(text)} as {self._type_words()}") from error

    def _parse(self, text: str) -> Any:
        if self.kind == "int":
            return int(text)
        if self.kind == "float":
            return float(text)
        if self.kind == "bool":
            word = text.lower()
            if word not in _TRUE_WORDS | _FALSE_WORDS:
                raise ValueError("expected true or false")
            return word in _TRUE_WORDS
        if self.kind == "choice":
            return text
        if self.kind == "str":
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",")] if "," in text else text
        if self.kind == "gpus":
            inner = text.strip("[]").strip()
            return [int(part) for part in inner.split(",")] if inner else []
        # env: a JSON object, or NAME=VALUE pairs separated by ';' or new lines (values may hold commas)
        if text.startswith("{"):
            return self.normalize(json.loads(text))
        pairs = [pair.strip() for pair in re.split(r"[;\n]", text) if pair.strip()]
        if any("=" not in pair for pair in pairs):
            raise ValueError("expected NAME=VALUE pairs")
        return dict(pair.split("=", 1) for pair in pairs)

    def _range_words(self) -> str:
        low, high = self.bounds
        opening = "(" if self.lower_bound_open else "["
        return f"{opening}{'-inf' if low is None else low}, {'inf' if high is None else high}]"

    def _type_words(self) -> str:
        words = {
            "int": "an integer",
            "float": "a number",
            "bool": "true or false",
            "choice": "one of " + ", ".join(self.choices),
            "str": "a non-empty string or list of strings",
            "gpus": "a list of GPU indices",
            "env": "a dict of NCCL variable names to string values",
        }[self.kind]
        return words + (" or None" if self.nullable else "")


_ROLLOUT = "actor_rollout_ref.rollout"
_PLACEMENT_KEYS = ("trainer.n_gpus_per_node",)

KNOBS: dict[str, Knob] = {knob.name: knob for knob in (
    # --- placement: which GPUs, and which of them each pool gets --------------------------------------------------
    Knob("gpus", (), "gpus", "restart", "placement",
         "Physical GPU indices for this session (CUDA_VISIBLE_DEVICES); actor+rollout+ref get what the pools leave.",
         workbench_default=[0], derived_keys=_PLACEMENT_KEYS,
         roles=("placement",), phases=WHOLE_STEP, model_group=UNMODELLED),
    Knob("critic_gpus", (), "int", "restart", "placement",
         "GPUs of `gpus` for the critic alone (0 = shares the actor's GPUs); launched by workbench.launch.",
         bounds=(0, MAX_GPUS), workbench_default=0, derived_keys=_PLACEMENT_KEYS,
         roles=("critic",), phases=("values", "update_critic"), model_group=UNMODELLED),
    Knob("reward_gpus", (), "int", "restart", "placement",
         "GPUs of `gpus` for the reward model's own pool (0 = colocated); needs reward.reward_model.enable.",
         bounds=(0, MAX_GPUS), workbench_default=0,
         derived_keys=_PLACEMENT_KEYS + ("reward.reward_model.enable_resource_pool",
                                         "reward.reward_model.n_gpus_per_node", "reward.reward_model.nnodes"),
         roles=("reward",), phases=("reward",), model_group=UNMODELLED),
    Knob("rollout_gpus", (), "int", "restart", "placement",
         "GPUs of `gpus` for standalone rollout servers; trainer_mode=separate_async needs at least one.",
         bounds=(0, MAX_GPUS), workbench_default=0,
         derived_keys=_PLACEMENT_KEYS + (f"{_ROLLOUT}.nnodes", f"{_ROLLOUT}.n_gpus_per_node"),
         roles=("rollout",), phases=("gen", "update_weights"), model_group=UNMODELLED),
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
         "int", "hot", "token budgets", "Tokens per GPU per critic micro batch (with use_dynamic_bsz).",
         bounds=(1, MAX_TOKENS),
         roles=("critic",), phases=("values", "update_critic"),
         runner=call_budget("_compute_values", "_update_critic"), model_group="batching", micro_batch_unit="tokens"),
    # --- LoRA critic ----------------------------------------------------------------------------------------------
    Knob("critic_lora_rank", ("critic.model.lora_rank",), "int", "restart", "LoRA critic",
         "LoRA rank of the critic (0 = full fine-tuning); runs through workbench.launch.", bounds=(0, 4096),
         roles=("critic",), phases=("values", "update_critic"), model_group="critic_lora"),
    Knob("critic_lora_alpha", ("critic.model.lora_alpha",), "int", "restart", "LoRA critic",
         "LoRA scaling factor alpha of the critic.", bounds=(1, 1 << 16),
         roles=("critic",), phases=("values", "update_critic"), model_group="critic_lora"),
    Knob("critic_lora_targets", ("critic.model.target_modules",), "str", "restart", "LoRA critic",
         "Critic modules that get LoRA adapters: all-linear or a list of module names.",
         roles=("critic",), phases=("values", "update_critic"), model_group="critic_lora"),
    # --- async ----------------------------------------------------------------------------------------------------
    Knob("trainer_mode", ("trainer.v1.trainer_mode",), "choice", "restart", "async",
         "V1 trainer: sync, colocate_async (overlap on shared GPUs) or separate_async (own rollout GPUs).",
         choices=("sync", "colocate_async", "separate_async"),
         roles=("trainer",), phases=WHOLE_STEP, model_group="trainer_mode"),
    Knob("hybrid_switch", ("trainer.v1.separate_async.hybrid_rollout.enable_switch",), "bool", "restart", "async",
         "separate_async: lend idle trainer GPUs to rollout.",
         roles=("trainer",), phases=WHOLE_STEP, model_group=UNMODELLED),
    # --- rollout --------------------------------------------------------------------------------------------------
    Knob("rollout_gpu_memory", (f"{_ROLLOUT}.gpu_memory_utilization",), "float", "restart", "rollout",
         "Share of each GPU's memory the rollout engine may take.", bounds=(0.0, 0.95), lower_bound_open=True,
         roles=("rollout",), phases=("gen",), model_group="rollout_engine"),
    Knob("rollout_tp", (f"{_ROLLOUT}.tensor_model_parallel_size",), "int", "restart", "rollout",
         "Tensor-parallel GPUs per rollout replica.", bounds=(1, MAX_GPUS),
         roles=("rollout",), phases=("gen", "update_weights"), model_group=UNMODELLED),
    Knob("rollout_max_batched_tokens", (f"{_ROLLOUT}.max_num_batched_tokens",), "int", "restart", "rollout",
         "Most tokens the rollout engine schedules in one forward pass.", bounds=(1, MAX_TOKENS),
         roles=("rollout",), phases=("gen",), model_group="rollout_engine"),
    Knob("rollout_enforce_eager", (f"{_ROLLOUT}.enforce_eager",), "bool", "restart", "rollout",
         "Run vLLM without CUDA graphs: a shorter start-up, slower decoding (false = capture CUDA graphs).",
         roles=("rollout",), phases=("gen",), model_group="rollout_enforce_eager"),
    Knob("rollout_max_num_seqs", (f"{_ROLLOUT}.max_num_seqs",), "int", "restart", "rollout",
         "Most sequences the rollout engine decodes at once (vLLM max_num_seqs).", bounds=(1, MAX_SEQUENCES),
         roles=("rollout",), phases=("gen",), model_group="waves"),
    Knob("agent_workers", (f"{_ROLLOUT}.agent.num_workers",), "int", "restart", "rollout",
         "Agent-loop workers that send prompts to the rollout servers (H200: 2 -> 8 changed nothing).",
         bounds=(1, 1024),
         roles=("rollout",), phases=("gen",), model_group="rollout_engine"),
    # --- algorithm: knobs that change what is trained (never proposed unless asked for) --------------------------
    Knob("rollout_logprob_bypass", ("algorithm.rollout_correction.bypass_mode",), "bool", "restart", "algorithm",
         "CHANGES THE ALGORITHM: use vLLM's rollout log-probs as old log-probs, skipping the old_log_prob pass.",
         changes_algorithm=True,
         roles=("actor",), phases=("old_log_prob",), model_group="rollout_logprob_bypass"),
    # --- memory ---------------------------------------------------------------------------------------------------
    Knob("actor_param_offload", ("actor_rollout_ref.actor.fsdp_config.param_offload",), "bool", "restart",
         "memory", "Keep actor parameters on the CPU between uses.",
         roles=("actor",), phases=("old_log_prob", "update_actor", "update_weights"), model_group="offload"),
    Knob("actor_optimizer_offload", ("actor_rollout_ref.actor.fsdp_config.optimizer_offload",), "bool", "restart",
         "memory", "Keep actor optimizer state on the CPU between updates.",
         roles=("actor",), phases=("update_actor",), model_group="offload"),
    Knob("ref_param_offload", ("actor_rollout_ref.ref.fsdp_config.param_offload",), "bool", "restart", "memory",
         "Keep reference-policy parameters on the CPU between uses.",
         roles=("ref",), phases=("ref",), model_group="offload"),
    # The critic's FSDP engine config is critic.fsdp (FSDPCriticConfig.fsdp), not critic.model.fsdp_config.
    Knob("critic_param_offload", ("critic.fsdp.param_offload",), "bool", "restart", "memory",
         "Keep critic parameters on the CPU between uses.",
         roles=("critic",), phases=("values", "update_critic"), model_group="offload"),
    Knob("critic_optimizer_offload", ("critic.fsdp.optimizer_offload",), "bool", "restart", "memory",
         "Keep critic optimizer state on the CPU between updates.",
         roles=("critic",), phases=("update_critic",), model_group="offload"),
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
         phases=("old_log_prob", "ref", "values", "update_critic", "update_actor"), model_group=UNMODELLED),
    # --- batch ----------------------------------------------------------------------------------------------------
    Knob("train_batch_size", ("data.train_batch_size",), "int", "restart", "batch",
         "Prompts per training step.", bounds=(1, MAX_SEQUENCES),
         roles=("data",), phases=WHOLE_STEP, model_group="tokens"),
    Knob("ppo_mini_batch_size", ("actor_rollout_ref.actor.ppo_mini_batch_size", "critic.ppo_mini_batch_size"),
         "int", "restart", "batch", "Prompts per optimizer step (actor and critic).", bounds=(1, MAX_SEQUENCES),
         roles=("actor", "critic"), phases=("update_actor", "update_critic"), model_group="batching"),
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
         "Sequences per GPU per critic micro batch (without use_dynamic_bsz).", bounds=(1, MAX_SEQUENCES),
         nullable=True,
         roles=("critic",), phases=("values", "update_critic"),
         runner=call_micro_batch("_compute_values", "_update_critic"), model_group="batching",
         micro_batch_unit="sequences"),
    Knob("max_prompt_length", ("data.max_prompt_length",), "int", "restart", "batch",
         "Longest prompt in tokens.", bounds=(1, MAX_TOKENS),
         roles=("data",), phases=WHOLE_STEP, model_group="tokens"),
    Knob("max_response_length", ("data.max_response_length",), "int", "restart", "batch",
         "Longest generated response in tokens.", bounds=(1, MAX_TOKENS),
         roles=("data",), phases=WHOLE_STEP, model_group="tokens"),
    # --- environment ----------------------------------------------------------------------------------------------
    Knob("nccl_env", ("ray_kwargs.ray_init.runtime_env.env_vars",), "env", "restart", "environment",
         "NCCL_*/TORCH_NCCL_* variables for every Ray worker (e.g. NCCL_P2P_DISABLE=1).",
         roles=("environment",), phases=WHOLE_STEP, model_group=UNMODELLED),
)}

WORKBENCH_KNOBS: tuple[str, ...] = tuple(name for name, knob in KNOBS.items() if knob.workbench_only)
GROUPS: tuple[str, ...] = tuple(dict.fromkeys(knob.group for knob in KNOBS.values()))
ALGORITHM_KNOBS: tuple[str, ...] = tuple(name for name, knob in KNOBS.items() if knob.changes_algorithm)
HOT_KNOBS: tuple[str, ...] = tuple(name for name, knob in KNOBS.items() if knob.apply == "hot")
# Per-GPU token budgets (with use_dynamic_bsz) and micro-batch sizes (without it), in table order: actor first.
TOKEN_BUDGET_KNOBS: tuple[str, ...] = tuple(n for n, k in KNOBS.items() if k.micro_batch_unit == "tokens")
MICRO_BATCH_KNOBS: tuple[str, ...] = tuple(n for n, k in KNOBS.items() if k.micro_batch_unit == "sequences")


def knobs_in_group(model_group: str) -> tuple[str, ...]:
    """The knobs the what-if model moves with one effect (e.g. "offload"), in table order."""
    return tuple(name for name, knob in KNOBS.items() if knob.model_group == model_group)


def knobs_of_role(role: str) -> tuple[str, ...]:
    """The knobs that configure `role` alone: they mean nothing in a plan that runs no such role."""
    return tuple(name for name, knob in KNOBS.items() if knob.roles == (role,))


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
KNOB_TABLE_COLUMNS = ("name", "group", "kind", "value", "default", "changed", "apply", "min", "max", "choices", "help",
                      "relevant", "why_irrelevant")


def irrelevant_knobs(values: dict[str, Any], roles: Any) -> dict[str, str]:
    """Knobs that change nothing in a plan with these values, each with the reason; `roles` says which optional
    roles run (critic, reference_policy, reward_model: see verl_config.roles_in_use)."""
    why: dict[str, str] = {}
    if values["use_dynamic_bsz"]:
        why.update(dict.fromkeys(MICRO_BATCH_KNOBS,
                                 "used only without use_dynamic_bsz (token budgets size micro batches)"))
    else:
        why.update(dict.fromkeys(TOKEN_BUDGET_KNOBS,
                                 "used only with use_dynamic_bsz (micro batch sizes apply without it)"))
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
         "changed": values[name] != defaults[name], "apply": knob.apply, "min": knob.bounds[0], "max": knob.bounds[1],
         "choices": list(knob.choices), "help": knob.help, "relevant": name not in irrelevant,
         "why_irrelevant": irrelevant.get(name, "")}
        for name, knob in KNOBS.items()
    ]
