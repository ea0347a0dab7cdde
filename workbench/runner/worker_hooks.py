"""Code that must run inside every Ray worker process of a verl run (Ray's `worker_process_setup_hook`).

verl 0.9.1 has two defects that users hit and that can only be fixed where the models are built, i.e. in the
FSDP worker processes, not in the driver:

1. Its critic loader (`verl.utils.model.load_valuehead_model`) hard-codes `attn_implementation="flash_attention_2"`
   and ignores `critic.model.override_config`; on a server without flash-attn the critic dies at load time.
   -> when flash-attn is missing, that one keyword is rewritten to "sdpa".
2. Its FSDP engine applies PEFT to the critic as `TaskType.CAUSAL_LM`; the value model is a
   `*ForTokenClassification`, so `critic_reset` crashes with `... has no attribute 'prepare_inputs_for_generation'`.
   -> the value-model engine builds LoRA as `TaskType.TOKEN_CLS` and keeps the value head (`score`) fully trainable
      (`modules_to_save`), which is what a LoRA critic needs: a fresh head can't be learnt through a low-rank adapter.

It also keeps, for the hot levers (levers.py), the plain forward of each model class before verl patches in its fused
one: afterwards nothing else knows it.

The patches are applied lazily, when verl's own module is imported, so the hook costs nothing in processes that
never build a model (reward workers, agent loops).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Callable

# A patch is applied right after the named module finishes importing.
_PATCHES_BY_MODULE: dict[str, Callable[[Any], None]] = {}


def flash_attn_available() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def patch_critic_attention(verl_model_module: Any) -> None:
    """Make verl's critic loader fall back to sdpa when flash-attn is not installed."""
    from transformers import AutoModelForTokenClassification

    if flash_attn_available() or getattr(AutoModelForTokenClassification, "_workbench_sdpa", False):
        return
    original = AutoModelForTokenClassification.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        if kwargs.get("attn_implementation") == "flash_attention_2":
            kwargs["attn_implementation"] = "sdpa"
        return original(cls, *args, **kwargs)

    AutoModelForTokenClassification.from_pretrained = classmethod(from_pretrained)
    AutoModelForTokenClassification._workbench_sdpa = True


def value_head_name(module: Any) -> str | None:
    """The name of a token-classification model's head (`score` for Qwen2/Llama, `classifier` for others)."""
    for name in ("score", "classifier"):
        if hasattr(module, name):
            return name
    return None


def build_value_lora(module: Any, model_config: Any) -> Any:
    """Wrap a value model (`*ForTokenClassification`) in LoRA the way a critic needs it."""
    from peft import LoraConfig, TaskType, get_peft_model

    head = value_head_name(module)
    if head is None:
        raise ValueError(f"{type(module).__name__} has no value head (score/classifier): can't build a LoRA critic")
    module.enable_input_require_grads()
    lora = LoraConfig(
        task_type=TaskType.TOKEN_CLS,
        r=int(model_config.lora_rank),
        lora_alpha=int(model_config.lora_alpha),
        target_modules=_plain(model_config.target_modules),
        exclude_modules=_plain(getattr(model_config, "exclude_modules", None)),
        modules_to_save=[head],
        bias="none",
    )
    module = get_peft_model(module, lora)
    # FSDP needs one dtype per flat parameter group: trainable params follow the frozen base's dtype.
    base_dtype = next((p.dtype for p in module.parameters() if not p.requires_grad), None)
    for p in module.parameters():
        if p.requires_grad and base_dtype is not None and p.dtype != base_dtype:
            p.data = p.data.to(base_dtype)
    return module


def _plain(value: Any) -> Any:
    """OmegaConf ListConfig -> list, leave strings/None alone (PEFT checks types)."""
    if value is None or isinstance(value, str):
        return value
    return list(value)


def patch_value_lora(transformer_impl_module: Any) -> None:
    engine_cls = transformer_impl_module.FSDPEngineWithValueHead
    if getattr(engine_cls, "_workbench_value_lora", False):
        return
    inherited = engine_cls._build_lora_module

    def _build_lora_module(self, module):
        if getattr(self.model_config, "lora_adapter_path", None) is not None:
            return inherited(self, module)  # a pre-trained adapter carries its own task type
        return build_value_lora(module, self.model_config)

    engine_cls._build_lora_module = _build_lora_module
    engine_cls._workbench_value_lora = True


def keep_plain_forward(monkey_patch_module: Any) -> None:
    """Have verl's `patch_forward_with_backends` (which every model build calls) remember the plain forward first."""
    from . import levers

    inherited = monkey_patch_module.patch_forward_with_backends
    if getattr(inherited, "_workbench_keeps_plain_forward", False):
        return

    def patch_forward_with_backends(model, *args, **kwargs):
        levers.remember_plain_forward(model)
        return inherited(model, *args, **kwargs)

    patch_forward_with_backends._workbench_keeps_plain_forward = True
    monkey_patch_module.patch_forward_with_backends = patch_forward_with_backends


_PATCHES_BY_MODULE.update(
    {
        "verl.utils.model": patch_critic_attention,
        "verl.workers.engine.fsdp.transformer_impl": patch_value_lora,
        "verl.models.transformers.monkey_patch": keep_plain_forward,
    }
)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after its target module has been executed."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES_BY_MODULE.get(name)
        if patch is None:
            return None
        sys.meta_path.remove(self)  # find the real spec without recursing into ourselves
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def setup() -> None:
    """Ray `worker_process_setup_hook`: install the patches (idempotent)."""
    for name, patch in _PATCHES_BY_MODULE.items():
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
