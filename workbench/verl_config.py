"""The one place that touches verl's configuration: compose it, validate it, and say which keys exist.

verl's PPO config is a Hydra config (`verl/trainer/config/ppo_trainer.yaml` plus its defaults list). We compose
it with Hydra's own compose API from verl's installed config directory, so a plan sees exactly what
`python3 -m verl.trainer.main_ppo` would see, and validate it with verl's own `validate_config`.

verl is imported lazily (inside the functions that need its Python code): composing needs only the YAML
files, while `import verl` pulls in torch and takes seconds. Hydra (~0.07 s) is imported whole with this module: its
modules import one another in a circle, and two threads importing them at once fail ("cannot import name
'OverridesParser' from partially initialized module"), as a replay's supervisor did when its warm-up composed while
its main thread read the plan's overrides. Python imports a module in one thread, and this one takes Hydra whole.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import io
import re
import threading
import warnings
from pathlib import Path
from typing import Any, Iterable

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_NAME = "ppo_trainer"


class ComposeError(ValueError):
    """verl's Hydra config could not be composed from the given overrides (the message says why)."""


@functools.cache
def config_dir() -> str:
    """verl's config directory, found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ComposeError("verl is not installed in this Python environment")
    return str(Path(spec.submodule_search_locations[0]) / "trainer" / "config")


# Hydra keeps its state in a process-wide singleton, so two threads composing at once would trip over it.
_compose_lock = threading.Lock()


@functools.lru_cache(maxsize=64)
def _compose_cached(overrides: tuple[str, ...]) -> DictConfig:
    with _compose_lock, initialize_config_dir(config_dir=config_dir(), version_base=None):
        try:
            config = compose(config_name=CONFIG_NAME, overrides=list(overrides))
        except (HydraException, OmegaConfBaseException) as error:
            raise ComposeError(str(error).strip()) from error
    # Cached configs are shared between plans: read-only keeps one plan from changing another's.
    OmegaConf.set_readonly(config, True)
    return config


def compose_config(overrides: Iterable[str] = ()) -> DictConfig:
    """verl's `ppo_trainer` config composed with Hydra overrides; read-only, cached per override list."""
    return _compose_cached(tuple(overrides))


def default_config() -> DictConfig:
    """verl's own default `ppo_trainer` config (no overrides)."""
    return compose_config(())


def override_keys(overrides: Iterable[str]) -> list[str]:
    """The dotted config keys that Hydra override strings name (`+a.b=1`, `~a.b`, `a.b=1` all name `a.b`)."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as error:
        raise ComposeError(str(error).strip()) from error
    return [override.key_or_group for override in parsed]


# ---------------------------------------------------------------------------------------------------------------
# Reading keys, including keys that exist only as dataclass fields
# ---------------------------------------------------------------------------------------------------------------

_ABSENT = object()
# Keys verl reads that exist only as fields of a node's `_target_` dataclass, not in its YAML, with verl 0.9.1's
# defaults: reading them from the dataclass imports verl (and torch: a minute on a loaded 2-core machine, in every page
# kernel that showed the knob table). tests/test_knobs.py holds each to verl's own dataclass.
DATACLASS_ONLY_DEFAULTS = {"critic.ppo_infer_max_token_len_per_gpu": 32768}


def _target_dataclass(node: Any) -> type | None:
    """The dataclass a config node is instantiated as (its `_target_`), or None."""
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return None
    target = get_class(node["_target_"])
    return target if dataclasses.is_dataclass(target) else None


def _dataclass_field_default(config: DictConfig, key: str) -> Any:
    """Default of `key` when it is a field of its parent node's `_target_` dataclass, else _ABSENT.

    Some keys verl reads are not in its YAML at all: `critic.ppo_infer_max_token_len_per_gpu` exists only as a
    `CriticConfig` field (default 32768), so Hydra needs `+critic.ppo_infer_max_token_len_per_gpu=N` to set it.
    """
    parent_key, _, field_name = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key, default=None) if parent_key else config
    target = _target_dataclass(parent)
    if target is None:
        return _ABSENT
    for field in dataclasses.fields(target):
        if field.name == field_name:
            if field.default is not dataclasses.MISSING:
                return field.default
            if field.default_factory is not dataclasses.MISSING:
                return field.default_factory()
            return _ABSENT
    return _ABSENT


def in_config(config: DictConfig, key: str) -> bool:
    """Whether `key` is present in a composed config (a Hydra override without `+` can set it)."""
    return OmegaConf.select(config, key, default=_ABSENT, throw_on_missing=False) is not _ABSENT


def holds_literal(config: DictConfig, key: str, value: Any) -> bool:
    """Whether `key` is written in `config` as exactly `value` (an interpolation that resolves to it is not:
    it would follow its source when that changes)."""
    parent_key, _, name = key.rpartition(".")
    parent = OmegaConf.select(config, parent_key, default=None) if parent_key else config
    if not isinstance(parent, DictConfig) or name not in parent or OmegaConf.is_interpolation(parent, name):
        return False
    return plain(parent[name]) == value


def key_exists(key: str, config: DictConfig | None = None) -> bool:
    """Whether verl knows `key`: in the composed config, or a field of the dataclass its parent node names."""
    config = default_config() if config is None else config
    return in_config(config, key) or _dataclass_field_default(config, key) is not _ABSENT


def plain(value: Any) -> Any:
    """OmegaConf containers as plain Python lists/dicts (resolved); other values unchanged."""
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def read_key(config: DictConfig, key: str) -> Any:
    """The resolved value of `key`, falling back to its dataclass field default; KeyError if verl has no such key."""
    value = OmegaConf.select(config, key, default=_ABSENT, throw_on_missing=False)
    if value is _ABSENT:
        value = DATACLASS_ONLY_DEFAULTS.get(key, _ABSENT)
    if value is _ABSENT:
        value = _dataclass_field_default(config, key)
    if value is _ABSENT:
        raise KeyError(f"verl's config has no key {key!r}")
    return plain(value)


def existing_keys(config: DictConfig | None = None) -> set[str]:
    """Every dotted key verl knows: composed config keys plus the fields of each node's `_target_` dataclass."""
    config = default_config() if config is None else config
    keys: set[str] = set()

    def walk(node: DictConfig, prefix: str) -> None:
        target = _target_dataclass(node)
        if target is not None:
            keys.update(prefix + field.name for field in dataclasses.fields(target))
        for name in node.keys():
            keys.add(prefix + str(name))
            if OmegaConf.is_missing(node, name) or OmegaConf.is_interpolation(node, name):
                continue
            child = node[name]
            if isinstance(child, DictConfig):
                walk(child, f"{prefix}{name}.")

    walk(config, "")
    return keys


# ---------------------------------------------------------------------------------------------------------------
# Writing Hydra overrides
# ---------------------------------------------------------------------------------------------------------------

# Strings Hydra reads back unchanged without quotes; words it would read as bool/null/float stay quoted.
_BARE_STRING = re.compile(r"^[A-Za-z_/][A-Za-z0-9_\-./]*$")
_HYDRA_WORDS = {"true", "false", "null", "inf", "nan"}


def _quote(text: str) -> str:
    # Double quotes, because shells quote with single ones: the override then needs no escaping in a command.
    # In Hydra's quoted strings only backslashes right before a quote or at the very end need doubling.
    escaped = re.sub(r'\\+(?="|\Z)', lambda run: run.group(0) * 2, text)
    return '"' + escaped.replace('"', '\\"') + '"'


def hydra_value(value: Any) -> str:
    """`value` written in Hydra's override grammar, so that composing it gives back exactly `value`."""
    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # repr gives 'inf' and 'nan', which Hydra reads as floats
    if isinstance(value, str):
        return value if _BARE_STRING.match(value) and value.lower() not in _HYDRA_WORDS else _quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{name}:{hydra_value(item)}" for name, item in value.items()) + "}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as a Hydra override")


def override(key: str, value: Any, base: DictConfig) -> str:
    """A Hydra override setting `key`; `+key=` when `base` lacks the key (Hydra refuses to set it otherwise)."""
    prefix = "" if in_config(base, key) else "+"
    return f"{prefix}{key}={hydra_value(value)}"


def deletion(key: str) -> str:
    """A Hydra override removing `key`."""
    return f"~{key}"


def _raw(config: DictConfig) -> dict:
    return OmegaConf.to_container(config, resolve=False)


def overrides_from_yaml(path: str | Path) -> tuple[list[str], set[str]]:
    """Overrides that turn verl's default config into the (full or partial) config YAML at `path`.

    Returns the overrides and every leaf key the file names. Only keys whose values differ from verl's
    defaults become overrides, so a full config written by `Plan.to_yaml` comes back as a short list.
    """
    loaded = OmegaConf.load(path)
    if not isinstance(loaded, DictConfig):
        raise ComposeError(f"{path}: a verl config YAML must be a mapping")
    document = _raw(loaded)
    document.pop("defaults", None)  # a Hydra defaults list chooses files; it is not a config value
    overrides: list[str] = []
    named: set[str] = set()

    def walk(node: dict, default: Any, prefix: str) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            has_default = isinstance(default, dict) and name in default
            default_value = default[name] if has_default else None
            # Descend into mappings so that a partial file changes only the leaves it names.
            if isinstance(value, dict) and (isinstance(default_value, dict) or (not has_default and value)):
                walk(value, default_value, key + ".")
                continue
            named.add(key)
            if not has_default:
                overrides.append(f"+{key}={hydra_value(value)}")
            elif value != default_value:
                overrides.append(f"{key}={hydra_value(value)}")

    walk(document, _raw(default_config()), "")
    return overrides, named


def changed_keys(old: DictConfig, new: DictConfig) -> list[tuple[str, Any, Any]]:
    """(key, old, new) for every leaf whose written value differs (interpolations compared as written).

    A key present on one side only shows None on the other.
    """
    changes: list[tuple[str, Any, Any]] = []

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for name in list(a) + [name for name in b if name not in a]:
                walk(a.get(name), b.get(name), f"{prefix}{name}.")
        elif a != b:
            changes.append((prefix.rstrip("."), a, b))

    walk(_raw(old), _raw(new), "")
    return changes


# ---------------------------------------------------------------------------------------------------------------
# verl's own validation
# ---------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RolesInUse:
    """Which optional roles a verl config runs, decided by verl's own rules."""

    reference_policy: bool
    critic: bool
    reward_model: bool


def roles_in_use(config: DictConfig) -> RolesInUse:
    """verl 0.9.1's need_reference_policy, need_critic and need_reward_model (verl/trainer/ppo/utils.py), read from
    the config as they read it: their module imports torch (a minute on a loaded 2-core machine), which every page
    kernel paid for its knob table. tests/test_knobs.py holds these reads to verl's own functions."""
    critic = config.critic.enable
    return RolesInUse(
        reference_policy=bool(config.algorithm.get("use_kl_in_reward", False)
                              or config.actor_rollout_ref.actor.use_kl_loss),
        critic=bool(critic) if critic is not None else config.algorithm.adv_estimator == "gae",
        reward_model=bool(config.reward.reward_model.enable),
    )


def _innermost(error: BaseException) -> BaseException:
    while error.__cause__ is not None:
        error = error.__cause__
    return error


def verl_validation_problem(config: DictConfig) -> tuple[str, str | None] | None:
    """Run verl's `validate_config`; None if it passes, else (message, config node it failed at or None).

    verl stops at its first failed check, so this reports one problem at a time. It instantiates the critic's
    `HFModelConfig`, which loads the tokenizer and HF config from `critic.model.path`: the model must be reachable.
    """
    from verl.utils.config import validate_config

    roles = roles_in_use(config)
    # verl prints its progress and may write into the config; give it a private, writable copy and a muted stdout.
    private = copy.deepcopy(config)
    OmegaConf.set_readonly(private, False)
    try:
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate_config(private, use_reference_policy=roles.reference_policy, use_critic=roles.critic)
    except Exception as error:  # verl raises AssertionError, ValueError, OSError, hydra's InstantiationException…
        location = re.search(r"full_key: (\S+)", str(error))
        cause = _innermost(error)
        message = str(cause).strip() or type(cause).__name__
        return message, location.group(1) if location else None
    return None


def warm(with_verl: bool = True) -> None:
    """Compose verl's default config (Hydra: about a second) and, with_verl, import the verl modules verl's own
    config check uses (they pull in torch: seconds), e.g. in a background thread, so the first check a user waits
    for does not pay for it. A preview's fast checks (with_verl=False) need the composed config only."""
    if with_verl:
        from verl.utils.config import validate_config  # noqa: F401 (imported for its cost, not its use)

    config = default_config()
    roles_in_use(config)
    read_key(config, "critic.ppo_infer_max_token_len_per_gpu")
