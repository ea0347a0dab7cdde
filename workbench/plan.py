"""A Plan: verl's base config (Hydra overrides) plus knob values, composed into the config verl will run.

A Plan is immutable. `with_changes` returns a new Plan; `validate` names every problem it finds; `diff` and
`apply_class` tell what a change means for a running session (hot, or restart); `to_overrides`, `to_yaml`,
`to_command` and `to_json` export it. The composed verl config is always the composition of exactly
`to_overrides()`, so what the workbench shows is what verl gets.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import re
import shlex
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import yaml
from omegaconf import DictConfig, OmegaConf

from workbench import redact
from workbench.bounds import InputTooLarge, check_yaml_file, quoted
from workbench.knob import Knob
from workbench.knobs import (KNOBS, MICRO_BATCH_KNOBS, TOKEN_BUDGET_KNOBS, WORKBENCH_KNOBS, batching_knobs_read,
                             knob_defaults, knobs_in_use)
from workbench import verl_config

PLAN_FORMAT = "verl-workbench-plan/1"
VERL_ENTRY = "python3 -m verl.trainer.main_ppo"
# The workbench's own verl launcher: it adds what verl's entry point cannot do itself.
LAUNCH_ENTRY = "python3 -m workbench.launch"

_TRAINER_GPUS = "trainer.n_gpus_per_node"
_ROLLOUT = "actor_rollout_ref.rollout"
_REWARD_MODEL = "reward.reward_model"


# A message's subject: "knob: …" or "knob, knob: …"; other subjects (overrides, yaml, json, verl) concern the plan.
_SUBJECT = re.compile(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): ")
_PLAN_SUBJECTS = {"overrides", "yaml", "json", "verl"}
PLAN_PROBLEM = "plan"  # the key of problems not tied to one knob


class UnreadKeyWarning(UserWarning):
    """A `+key` override adds a key verl's config does not have: verl reads it only if its code asks for it by name."""


class PlanError(ValueError):
    """A plan that cannot be built or would not run.

    `.messages`: one message per problem, each naming its subject ("knob: …"); `.problems`: the same keyed by
    knob name ("plan" for problems not tied to a knob), messages about one knob joined, so a view can mark the
    offending control."""

    def __init__(self, messages: Iterable[str]):
        self.messages = list(messages)
        self.problems: dict[str, str] = {}
        for message in self.messages:
            subject = _SUBJECT.match(message)
            names = subject.group(1).split(", ") if subject else [PLAN_PROBLEM]
            for name in [PLAN_PROBLEM] if set(names) & _PLAN_SUBJECTS else names:
                self.problems[name] = f"{self.problems[name]}; {message}" if name in self.problems else message
        super().__init__("\n".join(self.messages))


def _compose(overrides: tuple[str, ...]) -> DictConfig:
    try:
        return verl_config.compose_config(overrides)
    except verl_config.ComposeError as error:
        raise PlanError([f"overrides: verl's config does not compose: {error}"]) from error


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _named_keys(overrides: Iterable[str]) -> set[str]:
    overrides = tuple(overrides)
    try:
        return set(verl_config.override_keys(overrides))
    except verl_config.ComposeError as error:
        problem = _one_line(error)
    for override in overrides:  # name the one that fails
        try:
            verl_config.override_keys([override])
        except verl_config.ComposeError:
            raise PlanError([f"overrides: {override!r} is not a Hydra override: {problem}"]) from None
    raise PlanError([f"overrides: {problem}"])


# Config nodes verl hands on as they are (to Ray, vLLM, HF, …): any key added under them is read by their receiver.
_PASS_THROUGH = re.compile(r"(^|\.)(ray_init|runtime_env|env_vars|override_config|[a-z_]*kwargs|kw_args)$")


def _added_key_problems(overrides: tuple[str, ...]) -> list[str]:
    """Problems with `+key=` overrides that add a key verl can't use: under a section verl's config lacks (verl
    never reads it), or beside the fields of a config dataclass (verl stops at start-up building it). A key added to
    a plain section may be one verl reads with `config.get(name)`: it is taken, with an UnreadKeyWarning."""
    default = verl_config.default_config()
    problems = []
    for override, key in zip(overrides, verl_config.override_keys(overrides), strict=True):
        if not override.lstrip().startswith("+") or verl_config.key_exists(key, default):
            continue
        parent = key.rpartition(".")[0]
        while parent and not isinstance(OmegaConf.select(default, parent, default=None), DictConfig):
            parent = parent.rpartition(".")[0]
        node = OmegaConf.select(default, parent) if parent else default
        if parent and (_PASS_THROUGH.search(parent) or len(node) == 0):
            continue
        close = difflib.get_close_matches(key, sorted(verl_config.existing_keys(default)), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        dataclass_ = verl_config._target_dataclass(node) if parent else None
        if not parent:
            problems.append(f"{key}: verl's config has no section {key.split('.')[0]!r}: a '+' override adds the key, "
                            f"but verl never reads it{hint}")
        elif dataclass_ is not None:
            problems.append(f"{key}: not a field of {parent} ({dataclass_.__name__}): verl would stop at start-up "
                            f"building it{hint}")
        else:
            warnings.warn(f"{key}: not in verl's config; verl reads it only where its code asks for that key by "
                          f"name{hint}", UnreadKeyWarning, stacklevel=4)
    return problems


def _count(value: Any) -> int:
    """A GPU count read from a config that may hold anything: non-counts count as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _inferred_placement(base: DictConfig, named_keys: set[str]) -> dict[str, Any]:
    """Placement knob values that reproduce the base config's pools.

    verl's default of 8 GPUs per node is no statement about this machine: unless the base names
    trainer.n_gpus_per_node, the actor pool gets one GPU (the `gpus` knob's default [0]).
    """
    reward = _count(OmegaConf.select(base, f"{_REWARD_MODEL}.n_gpus_per_node"))
    reward = reward if OmegaConf.select(base, f"{_REWARD_MODEL}.enable_resource_pool") else 0
    rollout = _count(OmegaConf.select(base, f"{_ROLLOUT}.n_gpus_per_node"))
    rollout = rollout if _count(OmegaConf.select(base, f"{_ROLLOUT}.nnodes")) else 0
    trainer = _count(OmegaConf.select(base, _TRAINER_GPUS)) if _TRAINER_GPUS in named_keys else 1
    return {"gpus": list(range(trainer + reward + rollout)), "critic_gpus": 0,
            "reward_gpus": reward, "rollout_gpus": rollout}


def _placement_values(placement: Mapping[str, Any], base: DictConfig) -> dict[str, Any]:
    """The verl keys the placement knobs decide: the actor pool gets the GPUs the other pools leave.

    verl has no critic pool: critic_gpus only shrinks the actor pool here; workbench.launch builds it (through the runner).
    """
    nnodes = OmegaConf.select(base, "trainer.nnodes")
    pools = placement["critic_gpus"] + placement["reward_gpus"] + placement["rollout_gpus"]
    values: dict[str, Any] = {_TRAINER_GPUS: len(placement["gpus"]) - pools}
    if placement["reward_gpus"] > 0:
        values.update({f"{_REWARD_MODEL}.enable_resource_pool": True,
                       f"{_REWARD_MODEL}.n_gpus_per_node": placement["reward_gpus"],
                       f"{_REWARD_MODEL}.nnodes": nnodes})
    else:
        values[f"{_REWARD_MODEL}.enable_resource_pool"] = False
    if placement["rollout_gpus"] > 0:
        values.update({f"{_ROLLOUT}.nnodes": nnodes, f"{_ROLLOUT}.n_gpus_per_node": placement["rollout_gpus"]})
    else:
        values[f"{_ROLLOUT}.nnodes"] = 0
    return values


def _knob_matches(knob: Knob, value: Any, config: DictConfig) -> bool:
    if knob.kind == "env":
        return knob.read(config) == value
    return all(verl_config.holds_literal(config, key, value) for key in knob.keys)


def _knob_overrides(knob: Knob, value: Any, base: DictConfig) -> list[str]:
    if knob.kind != "env":
        return [verl_config.override(key, value, base) for key in knob.keys]
    node = knob.keys[0]
    current = knob.read(base)
    return ([verl_config.override(f"{node}.{name}", text, base) for name, text in value.items()
             if current.get(name) != text]
            + [verl_config.deletion(f"{node}.{name}") for name in current if name not in value])


def _settings_overrides(settings: Mapping[str, Any], base: DictConfig) -> list[str]:
    """Overrides that put the knob settings on top of the base config (only keys that change)."""
    placement = {name: settings[name] for name in WORKBENCH_KNOBS}
    overrides = [verl_config.override(key, value, base) for key, value in _placement_values(placement, base).items()
                 if not verl_config.holds_literal(base, key, value)]
    for name, value in settings.items():
        if not KNOBS[name].workbench_only:
            overrides += _knob_overrides(KNOBS[name], value, base)
    return overrides


def _without_superseded(base_overrides: tuple[str, ...], knob_overrides: tuple[str, ...]) -> tuple[str, ...]:
    """Base overrides less the plain `key=value` ones that a knob override sets again.

    Hydra keeps the last of two overrides of one key, so the config is the same; the command reads better
    without the stale value. `+key=` and `~key` overrides stay: a later `key=` may depend on them.
    """
    def plain_keys(overrides: tuple[str, ...]) -> list[str | None]:
        return [key if not override.lstrip().startswith(("+", "~")) else None
                for override, key in zip(overrides, verl_config.override_keys(overrides), strict=True)]

    superseded = set(plain_keys(knob_overrides)) - {None}
    return tuple(override for override, key in zip(base_overrides, plain_keys(base_overrides), strict=True)
                 if key is None or key not in superseded)


def unknown_knob(name: Any) -> str:
    """The problem message for a name KNOBS lacks (the closest knob suggested; a strange name quoted, cut)."""
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,79}", name):
        return f"{quoted(name, 80)}: unknown knob (knob names are the strings KNOBS lists)"
    close = difflib.get_close_matches(name, list(KNOBS), n=1)
    return f"{name}: unknown knob" + (f" (did you mean {close[0]}?)" if close else "")


def _knob_key_pattern(key: str) -> re.Pattern:
    # verl's messages name keys relative to their section ('actor.ppo_mini_batch_size'), so the last two parts
    # are enough; the look-arounds keep 'x.ppo_micro_batch_size' from matching 'x.ppo_micro_batch_size_per_gpu'.
    suffix = ".".join(key.split(".")[-2:])
    return re.compile(rf"(?<![\w.])(?:{re.escape(key)}|{re.escape(suffix)})(?!\w)")


_KNOB_KEY_PATTERNS = {name: [_knob_key_pattern(key) for key in knob.keys]
                      for name, knob in KNOBS.items() if knob.kind != "env"}


def _knobs_named_in(message: str) -> list[str]:
    return [name for name, patterns in _KNOB_KEY_PATTERNS.items()
            if any(pattern.search(message) for pattern in patterns)]


def _words(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


@dataclass(frozen=True, eq=False)
class Plan:
    """verl base overrides + knob settings, and the verl config they compose to (read-only)."""

    base_overrides: tuple[str, ...]
    _settings: Mapping[str, Any] = field(repr=False)
    _overrides: tuple[str, ...] = field(repr=False)
    _base_config: DictConfig = field(repr=False)
    config: DictConfig = field(repr=False)
    # Credentials the overrides carried (config key -> value); everywhere else they show redact.SECRET_PLACEHOLDER.
    _secrets: Mapping[str, Any] = field(default_factory=dict, repr=False)

    # ---------------------------------------------------------------------------------------------- construction
    @classmethod
    def from_verl(cls, overrides: Iterable[str] = ()) -> Plan:
        """A plan from verl Hydra overrides (as given to `python3 -m verl.trainer.main_ppo`)."""
        overrides = tuple(overrides)
        named = _named_keys(overrides)
        problems = _added_key_problems(overrides)
        if problems:
            raise PlanError(problems)
        return cls._build(overrides, {}, named)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Iterable[str] = ()) -> Plan:
        """A plan from a verl config YAML (full, as `to_yaml` writes, or partial), then extra overrides."""
        try:
            check_yaml_file(path)  # size, depth and aliases before anything builds it
            yaml_overrides, named = verl_config.overrides_from_yaml(path)
        except InputTooLarge as error:
            raise PlanError([f"yaml: {error}"]) from None
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(error, "problem", None) or _one_line(error)
            raise PlanError([f"yaml: {path} is not valid YAML{where}: {problem}"]) from None
        except (OSError, verl_config.ComposeError) as error:
            raise PlanError([f"yaml: cannot read {path}: {_one_line(error)}"]) from None
        overrides = tuple(yaml_overrides) + tuple(overrides)
        named |= _named_keys(overrides)
        problems = _added_key_problems(overrides)
        if problems:
            raise PlanError(problems)
        return cls._build(overrides, {}, named)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        """The plan `to_json` wrote."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as error:
            raise PlanError([f"json: not a plan document: {error}"]) from None
        if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
            raise PlanError([f"json: not a {PLAN_FORMAT} document"])
        if not isinstance(data.get("overrides"), list) or not isinstance(data.get("knobs"), dict):
            raise PlanError([f"json: a {PLAN_FORMAT} document needs its overrides (a list) and knobs (an object)"])
        problems = [unknown_knob(name) for name in data["knobs"] if name not in KNOBS]
        settings = {name: KNOBS[name].normalize(value) for name, value in data["knobs"].items() if name in KNOBS}
        problems += [problem for name, value in settings.items() for problem in KNOBS[name].problems(value)]
        if problems:
            raise PlanError(problems)
        overrides = tuple(data["overrides"])
        return cls._build(overrides, settings, _named_keys(overrides))

    @classmethod
    def _build(cls, base_overrides: tuple[str, ...], settings: Mapping[str, Any], named_keys: set[str]) -> Plan:
        base_overrides, secrets = redact.split_overrides(base_overrides)
        base = _compose(base_overrides)
        settings = {**_inferred_placement(base, named_keys), **settings}
        return cls._assemble(base_overrides, settings, base, secrets)

    @classmethod
    def _assemble(cls, base_overrides: tuple[str, ...], settings: dict[str, Any], base: DictConfig,
                  secrets: Mapping[str, Any]) -> Plan:
        # A verl knob set to what the base already says is no setting: dropping it keeps to_overrides short.
        settings = {name: value for name, value in settings.items()
                    if KNOBS[name].workbench_only or not _knob_matches(KNOBS[name], value, base)}
        knob_overrides = tuple(_settings_overrides(settings, base))
        kept_base = _without_superseded(base_overrides, knob_overrides)
        config = _compose(kept_base + knob_overrides)
        return cls(base_overrides, MappingProxyType(settings), kept_base + knob_overrides, base, config,
                   MappingProxyType(dict(secrets)))

    def with_changes(self, changes: Mapping[str, Any]) -> Plan:
        """A new plan with these knob values; PlanError (naming each knob) for unknown knobs or bad values."""
        problems: list[str] = []
        settings = dict(self._settings)
        for name, value in changes.items():
            knob = KNOBS.get(name)
            if knob is None:
                problems.append(unknown_knob(name))
                continue
            value = knob.normalize(value)
            problems += knob.problems(value)
            settings[name] = value
        if problems:
            raise PlanError(problems)
        return Plan._assemble(self.base_overrides, settings, self._base_config, self._secrets)

    # --------------------------------------------------------------------------------------------------- reading
    def _value(self, name: str) -> Any:
        # One knob at a time: reading critic_token_budget's dataclass default imports verl (seconds), which
        # exporting a command does not need.
        return self._settings[name] if KNOBS[name].workbench_only else KNOBS[name].read(self.config)

    @functools.cached_property
    def _knob_values(self) -> dict[str, Any]:
        return {name: self._value(name) for name in KNOBS}

    def knob_values(self) -> dict[str, Any]:
        """Every knob's value in this plan, defaults included."""
        return copy.deepcopy(self._knob_values)

    def changed_knobs(self) -> dict[str, Any]:
        """Knobs whose value differs from their default (verl's default config, or the workbench default)."""
        defaults = knob_defaults()
        return {name: value for name, value in self.knob_values().items() if value != defaults[name]}

    @property
    def secrets(self) -> dict[str, Any]:
        """The credentials this plan was given (config key -> value), which its exports and JSON leave out."""
        return dict(self._secrets)

    def secrets_env(self) -> dict[str, str]:
        """The environment that hands this plan's credentials to a run (see workbench/redact.py); {} if none."""
        return {redact.SECRETS_ENV: json.dumps(dict(self._secrets))} if self._secrets else {}

    @property
    def workbench(self) -> dict[str, Any]:
        """Values of the workbench-only knobs (GPU placement), which verl's config does not hold."""
        return {name: copy.deepcopy(self._settings[name]) for name in WORKBENCH_KNOBS}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return self.to_overrides() == other.to_overrides() and self.workbench == other.workbench

    def __hash__(self) -> int:
        return hash((tuple(self.to_overrides()), json.dumps(self.workbench, sort_keys=True)))

    # ------------------------------------------------------------------------------------------------ validation
    def validate(self, gpu_count: int | None = None, with_verl: bool = True) -> None:
        """Raise PlanError listing every problem; `gpu_count` (GPUs on this machine) enables the index check.

        `with_verl=False` leaves out verl's own check, which loads the critic's model from `critic.model.path`:
        a replayed plan names paths on the machine it was recorded on.

        Cross-knob checks need well-typed values, so a plan with type errors reports those first. verl's own
        `validate_config` runs last, on a plan that passes the workbench's checks: verl stops at its first
        failure, and most of what it checks is already named here knob by knob.
        """
        if gpu_count is not None and (not isinstance(gpu_count, int) or isinstance(gpu_count, bool) or gpu_count < 1):
            raise PlanError([f"gpu_count: {quoted(gpu_count)} is not a GPU count (an integer of at least 1)"])
        values = self._knob_values
        problems = [problem for name, knob in KNOBS.items() for problem in knob.problems(values[name])]
        if not all(knob.has_valid_type(values[name]) for name, knob in KNOBS.items()):
            raise PlanError(problems)
        roles = verl_config.roles_in_use(self.config)
        problems += self._disagreeing_keys()
        problems += self._placement_problems(values, roles, gpu_count)
        problems += self._batch_problems(values, roles)
        problems += self._async_problems(values, roles)
        if values["critic_lora_rank"] > 0 and not roles.critic:
            problems.append("critic_lora_rank: this plan runs no critic (critic.enable / algorithm.adv_estimator)")
        if not problems and with_verl:
            rejection = verl_config.verl_validation_problem(self.config)
            if rejection is not None:
                message, location = rejection
                named = ", ".join(_knobs_named_in(message)) or "verl"
                problems.append(f"{named}: verl rejects the config: {message}"
                                + (f" (at {location})" if location else ""))
        if problems:
            raise PlanError(problems)

    def _disagreeing_keys(self) -> list[str]:
        problems = []
        for name, knob in KNOBS.items():
            if len(knob.keys) > 1:
                found = {key: verl_config.read_key(self.config, key) for key in knob.keys}
                if len({json.dumps(value) for value in found.values()}) > 1:
                    listed = ", ".join(f"{key}={value!r}" for key, value in found.items())
                    problems.append(f"{name}: its verl keys disagree ({listed}); set the knob to make them agree")
        return problems

    def _placement_problems(self, values: dict, roles: verl_config.RolesInUse, gpu_count: int | None) -> list[str]:
        problems = []
        gpus = values["gpus"]
        if gpu_count is not None:
            problems += [f"gpus: GPU {index} is not on this machine (it has {_words(gpu_count, 'GPU')})"
                         for index in gpus if index >= gpu_count]
        pools = {name: values[name] for name in ("critic_gpus", "reward_gpus", "rollout_gpus") if values[name]}
        if gpus and sum(pools.values()) >= len(gpus):
            problems.append(f"{', '.join(pools)}: {' + '.join(map(str, pools.values()))} of the "
                            f"{_words(len(gpus), 'GPU')} in gpus leave none for the actor, rollout and reference")
        if values["critic_gpus"] and not roles.critic:
            problems.append("critic_gpus: GPUs set aside for a critic, but this plan runs no critic")
        if values["reward_gpus"] and not roles.reward_model:
            problems.append("reward_gpus: GPUs set aside for a reward model, but reward.reward_model.enable is false")
        if values["rollout_gpus"] and values["trainer_mode"] != "separate_async":
            problems.append("rollout_gpus: standalone rollout GPUs are used only with trainer_mode=separate_async")
        trainer_gpus = len(gpus) - sum(pools.values())
        tp = values["rollout_tp"]
        if trainer_gpus > 0 and trainer_gpus % tp:
            problems.append(f"rollout_tp: {tp} GPUs per rollout replica do not divide the actor pool's "
                            f"{_words(trainer_gpus, 'GPU')}")
        if values["rollout_gpus"] and values["rollout_gpus"] % tp:
            problems.append(f"rollout_tp: {tp} GPUs per rollout replica do not divide rollout_gpus "
                            f"{values['rollout_gpus']}")
        return problems

    def _batch_problems(self, values: dict, roles: verl_config.RolesInUse) -> list[str]:
        problems = []
        read = batching_knobs_read(values["use_dynamic_bsz"])  # the critic's budget with the flag off too
        longest = values["max_prompt_length"] + values["max_response_length"]
        problems += [f"{name}: {values[name]} tokens per GPU cannot hold one sequence of max_prompt_length + "
                     f"max_response_length = {longest} tokens"
                     for name in knobs_in_use(TOKEN_BUDGET_KNOBS, roles) if name in read and values[name] < longest]
        if not values["use_dynamic_bsz"]:  # verl's config checks want every micro-batch size, read or not
            problems += [f"{name}: needs a value while use_dynamic_bsz is off (sequences per GPU per micro batch)"
                         for name in knobs_in_use(MICRO_BATCH_KNOBS, roles) if values[name] is None]
        train, mini = values["train_batch_size"], values["ppo_mini_batch_size"]
        if train % mini:
            problems.append(f"train_batch_size: {train} prompts do not split into whole mini batches of "
                            f"ppo_mini_batch_size {mini}")
        nnodes = _count(self.config.trainer.nnodes)
        responses = _count(OmegaConf.select(self.config, f"{_ROLLOUT}.n")) or 1
        pools = values["critic_gpus"] + values["reward_gpus"] + values["rollout_gpus"]
        actor_ranks = (len(values["gpus"]) - pools) * nnodes
        critic_ranks = values["critic_gpus"] * nnodes or actor_ranks
        sequences = mini * responses
        # verl's training worker asserts that each mini batch (prompts × rollout.n) splits evenly over its ranks.
        for role, ranks, used in (("actor", actor_ranks, True), ("critic", critic_ranks, roles.critic)):
            if used and ranks > 0 and sequences % ranks:
                problems.append(f"ppo_mini_batch_size: {mini} × rollout.n {responses} = {sequences} sequences per "
                                f"mini batch do not split evenly over the {role}'s {_words(ranks, 'GPU')}")
        return problems

    def _async_problems(self, values: dict, roles: verl_config.RolesInUse) -> list[str]:
        problems = []
        mode = values["trainer_mode"]
        if mode != "sync" and not self.config.trainer.use_v1:
            problems.append(f"trainer_mode: {mode} needs verl's V1 trainer (trainer.use_v1=true)")
        if values["hybrid_switch"] and mode != "separate_async":
            problems.append("hybrid_switch: takes effect only with trainer_mode=separate_async")
        if mode != "separate_async":
            return problems
        # verl's PPOTrainerSeparateAsync asserts these when it starts (trainer_separate_async.py).
        if not values["rollout_gpus"]:
            problems.append("trainer_mode: separate_async without a rollout pool; set rollout_gpus ≥ 1 "
                            "(verl's actor_rollout_ref.rollout.nnodes / n_gpus_per_node)")
        if OmegaConf.select(self.config, f"{_ROLLOUT}.checkpoint_engine.backend") == "naive":
            problems.append("trainer_mode: separate_async needs actor_rollout_ref.rollout.checkpoint_engine.backend "
                            "other than 'naive' (e.g. nccl) to send weights to the rollout GPUs")
        sync_step = self.config.trainer.v1.separate_async.parameter_sync_step
        if values["train_batch_size"] != sync_step * values["ppo_mini_batch_size"]:
            problems.append(f"train_batch_size: separate_async needs train_batch_size = "
                            f"trainer.v1.separate_async.parameter_sync_step {sync_step} × ppo_mini_batch_size "
                            f"{values['ppo_mini_batch_size']} = {sync_step * values['ppo_mini_batch_size']}")
        if roles.reward_model and not values["reward_gpus"]:
            problems.append("reward_gpus: separate_async needs the reward model on GPUs of its own")
        return problems

    # --------------------------------------------------------------------------------------------------- changes
    def diff(self, other: Plan) -> list[dict[str, Any]]:
        """What changes from this plan to `other`: one entry per changed knob, then config keys no knob explains.

        Entry: {"knob": name or None, "keys": [verl keys], "old": value, "new": value, "apply": "hot"|"restart"}.
        Config keys are compared as written (an interpolation counts as unchanged), so a key that only follows
        a changed knob through an interpolation is not listed twice.
        """
        entries = self.knob_diff(other)
        explained = {key for entry in entries for key in entry["keys"]}
        for key, old, new in verl_config.changed_keys(self.config, other.config):
            if any(key == done or key.startswith(done + ".") for done in explained):
                continue
            if self._same_in_effect(other, key):
                continue
            entries.append({"knob": None, "keys": [key], "old": old, "new": new, "apply": "restart"})
        return entries

    def _same_in_effect(self, other: Plan, key: str) -> bool:
        """Whether a key written on one side only holds verl's own dataclass default on the other (e.g. a knob set to
        its default writes critic.ppo_infer_max_token_len_per_gpu, which only CriticConfig declares)."""
        try:
            return verl_config.read_key(self.config, key) == verl_config.read_key(other.config, key)
        except KeyError:
            return False

    def knob_diff(self, other: Plan) -> list[dict[str, Any]]:
        """The knob entries of `diff` alone (in knob-table order), without comparing the configs key by key."""
        mine, theirs = self._knob_values, other._knob_values
        return [{"knob": name, "keys": list(knob.keys or knob.derived_keys), "old": copy.deepcopy(mine[name]),
                 "new": copy.deepcopy(theirs[name]), "apply": knob.apply}
                for name, knob in KNOBS.items() if mine[name] != theirs[name]]

    def apply_class(self, other: Plan) -> str:
        """"hot" if every change from this plan to `other` can be applied between steps, else "restart"."""
        return "restart" if any(entry["apply"] == "restart" for entry in self.diff(other)) else "hot"

    # ---------------------------------------------------------------------------------------------------- export
    def to_overrides(self) -> list[str]:
        """Hydra overrides for verl: the base overrides, then the keys the knobs set (`+key=` where verl's
        YAML lacks the key); a base `key=` that a knob sets again is left out. Composing verl's config with
        them gives exactly `self.config`."""
        return list(self._overrides)

    def to_yaml(self) -> str:
        """The full composed verl config as YAML (interpolations kept as written)."""
        return OmegaConf.to_yaml(self.config)

    def to_json(self) -> str:
        """A lossless JSON document; `Plan.from_json` reads it back."""
        return json.dumps({"format": PLAN_FORMAT, "overrides": list(self.base_overrides),
                           "knobs": dict(self._settings)})

    def launch_reasons(self) -> list[str]:
        """Why verl's own entry point cannot run this plan (empty when it can)."""
        critic_gpus, lora_rank = self._value("critic_gpus"), self._value("critic_lora_rank")
        reasons = []
        if critic_gpus > 0:
            reasons.append(f"critic_gpus={critic_gpus}: verl puts every role in one global pool and "
                           "has no critic pool; workbench.launch adds one")
        if lora_rank > 0:
            reasons.append(f"critic_lora_rank={lora_rank}: verl's FSDP LoRA critic crashes at "
                           "critic_reset; workbench.launch applies LoRA to the critic itself")
        return reasons

    def to_command(self) -> str:
        """A shell command that runs this plan: verl's main_ppo, or the workbench launcher when verl can't."""
        reasons = self.launch_reasons()
        critic_gpus = self._value("critic_gpus")
        entry = VERL_ENTRY
        if reasons:
            entry = LAUNCH_ENTRY + (f" --critic-gpus {critic_gpus}" if critic_gpus else "")
        devices = ",".join(str(index) for index in self._value("gpus"))
        lines = [f"# {reason}" for reason in reasons]
        lines += [f"# {key}: a credential, written {redact.SECRET_PLACEHOLDER} here; put its value in before running"
                  for key in self._secrets]
        arguments = [f"CUDA_VISIBLE_DEVICES={devices} {entry}"] + [shlex.quote(o) for o in self.to_overrides()]
        return "\n".join(lines + [" \\\n    ".join(arguments)])
