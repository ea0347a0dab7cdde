"""One knob: what an operator-facing setting declares (Knob), how the live runner applies it (RunnerPath), and how
its values are read, parsed and checked. The table of all knobs, and what derives from it, is knobs.py.
"""

from __future__ import annotations

import copy
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
    "restart": the run checkpoints at the step boundary and resumes under the new plan; `keeps` says what of the
    running verl the change leaves alone, so an in-place rebuild keeps it (runner/rebuild.py, REBUILD_KEEPS: the
    rollout, its servers, the trainer, the run's processes) or, for RELAUNCH, that only new processes take it (their environment,
    their GPUs): the supervisor relaunches verl;
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
    keeps: str = ""

    def __post_init__(self) -> None:
        if self.kind not in PATH_KINDS:
            raise ValueError(f"runner path {self.kind!r} is not one of {PATH_KINDS}")
        if (self.kind == "restart") != (self.keeps in REBUILD_KEEPS):
            raise ValueError(f"runner path {self.kind!r}: what a restart keeps ({', '.join(REBUILD_KEEPS)}) goes with "
                             "restart, and only with it")
        if (self.kind == "call") != bool(self.calls) or (self.kind == "call") != bool(self.info):
            raise ValueError(f"runner path {self.kind!r}: calls and an extra_info key go with call, and only with it")
        if (self.kind == "worker") != bool(self.method):
            raise ValueError(f"runner path {self.kind!r}: a method goes with worker, and only with it")


PATH_KINDS = ("restart", "call", "worker")
# What a restart-class change leaves of the running verl: the rollout (vLLM servers, agent-loop and reward workers);
# the servers and reward workers (the agent loops are rebuilt: their client follows the trainer mode); the trainer
# (its FSDP workers with their models and optimizer states, the reward workers: only the rollout is rebuilt, so no
# checkpoint is written); the run's processes (Ray job, TaskRunner, TransferQueue: all of verl is rebuilt); nothing
# (a relaunch).
KEEPS_ROLLOUT, KEEPS_SERVERS, KEEPS_TRAINER, KEEPS_PROCESSES, RELAUNCH = (
    "rollout", "servers", "trainer", "processes", "relaunch")
REBUILD_KEEPS = (KEEPS_ROLLOUT, KEEPS_SERVERS, KEEPS_TRAINER, KEEPS_PROCESSES, RELAUNCH)
# The parts of the running verl each of them keeps: a change of several knobs keeps what all of them keep.
KEPT_PARTS = {KEEPS_ROLLOUT: frozenset({"processes", "servers", "agent_loops"}),
              KEEPS_SERVERS: frozenset({"processes", "servers"}),
              KEEPS_TRAINER: frozenset({"processes", "trainer"}),
              KEEPS_PROCESSES: frozenset({"processes"}),
              RELAUNCH: frozenset()}
KEEP_WORDS = {KEEPS_ROLLOUT: "the vLLM servers, agent-loop and reward workers",
              KEEPS_SERVERS: "the vLLM servers and reward workers",
              KEEPS_TRAINER: "the FSDP workers with their models and optimizer states; the rollout is rebuilt",
              KEEPS_PROCESSES: "Ray, the TaskRunner and the TransferQueue; the rollout is rebuilt",
              RELAUNCH: "nothing: verl is relaunched"}
# The extra_info keys verl's engine workers read per call.
TOKEN_BUDGET_INFO, MICRO_BATCH_INFO, DYNAMIC_BSZ_INFO = (
    "max_token_len_per_gpu", "micro_batch_size_per_gpu", "use_dynamic_bsz")


def call_budget(*calls: str) -> RunnerPath:
    """The runner path of a token budget verl reads per call: the trainer calls that take it."""
    return RunnerPath("call", calls=calls, info=TOKEN_BUDGET_INFO)


def call_micro_batch(*calls: str) -> RunnerPath:
    """The runner path of a micro-batch size (sequences per GPU) verl reads per call."""
    return RunnerPath("call", calls=calls, info=MICRO_BATCH_INFO)


def restart(keeps: str) -> RunnerPath:
    """The runner path of a restart-class knob: checkpoint, then resume under the new plan keeping `keeps`."""
    return RunnerPath("restart", keeps=keeps)


def least_kept(*keeps: str) -> str:
    """What a change of several restart-class knobs keeps: the parts each of them keeps (a rollout setting keeps the
    trainer, a LoRA critic the rollout: together, only the processes)."""
    parts = frozenset.intersection(*(KEPT_PARTS[k] for k in keeps)) if keeps else KEPT_PARTS[KEEPS_ROLLOUT]
    return next(k for k in REBUILD_KEEPS if KEPT_PARTS[k] == parts)


# How a restart is carried out: verl relaunched; verl rebuilt in place after a checkpoint; the rollout alone rebuilt
# beside the kept trainer, with no checkpoint. Each with its words (handles, supervisor, the Changes panel).
RELAUNCHED, REBUILT, ROLLOUT_REBUILT = "relaunched", "rebuilt", "rollout_rebuilt"
RESTART_STEPS = {RELAUNCHED: "checkpoint at the next step boundary, then relaunch",
                 REBUILT: "checkpoint at the next step boundary, then rebuild verl in place",
                 ROLLOUT_REBUILT: "at the next step boundary, rebuild the rollout in place (no checkpoint)"}


def restart_kind(keeps: str) -> str:
    """How a restart keeping `keeps` is carried out ("" or RELAUNCH: a relaunch)."""
    if keeps in ("", RELAUNCH):
        return RELAUNCHED
    return REBUILT if checkpoints_first(keeps) else ROLLOUT_REBUILT


def restart_steps(keeps: str) -> str:
    """What a restart keeping `keeps` does, in words."""
    return RESTART_STEPS[restart_kind(keeps)]


def checkpoints_first(keeps: str) -> bool:
    """Whether a restart keeping `keeps` writes a checkpoint at its step boundary: all but one that keeps the trainer's
    workers, whose state stays where it is."""
    return "trainer" not in KEPT_PARTS[keeps]


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
    applies it (`restart(keeps)` for restart-class knobs); model_group: its what-if effect (predict.MODEL_GROUPS) or
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
    runner: RunnerPath | None = None
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
        if not self.model_group:
            raise ValueError(f"knob {self.name}: needs a model_group (or UNMODELLED, said out loud)")
        if self.runner is None:
            raise ValueError(f"knob {self.name}: needs a runner path (how the live runner applies it)")
        if (self.apply == "restart") != (self.runner.kind == "restart"):
            raise ValueError(f"knob {self.name}: a {self.apply} knob cannot take the runner path {self.runner.kind!r}")
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
