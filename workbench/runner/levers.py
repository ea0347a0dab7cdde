"""Hot levers inside verl's FSDP workers: fused log-prob kernels and gradient checkpointing switched between steps.

verl 0.9.1 sets both once, when an engine builds its model (workers/engine/fsdp/transformer_impl.py `_build_module`):
- fused kernels: `apply_monkey_patch` replaces the model class's `forward` with verl's fused forward
  (models/transformers/dense_common.py: log-probs and entropy from the hidden states in chunks, no vocabulary-sized
  logits) and keeps the backend on the instance (`_verl_fused_kernels_backend`); then every call reads
  `use_fused_kernels` from its batch, by default from the engine config, to build the inputs and read the outputs;
- gradient checkpointing: `module.gradient_checkpointing_enable(use_reentrant=False)`, before FSDP wraps the module.
Both can be switched on the live model: Python looks the class's `forward` up at every call, and transformers' decoder
layers read their `gradient_checkpointing` flag at every forward in training mode. This module does that on the
engines of one worker process (actor, ref, critic): it checks every engine first, so a change it must refuse changes
nothing, and reports what is in force afterwards, read back from the models.

The runner calls `put_in_force` on every Ray worker through Ray's `__ray_call__` (runner/trainer.py). The model's
plain forward is remembered when verl patches it (`remember_plain_forward`, installed by worker_hooks.py): once a
class's forward is the fused one, nothing else knows the plain one.
"""

from __future__ import annotations

import os
from typing import Any, Callable

FUSED_BACKENDS = ("torch", "liger")  # knobs.py says why triton is left out
# What verl's `_build_module` passes to transformers when it turns checkpointing on.
CHECKPOINTING_KWARGS = {"use_reentrant": False}
_BACKEND_ATTRIBUTE = "_verl_fused_kernels_backend"

# class -> its forward before verl's fused patch (the first one seen per class: actor and ref share the class)
PLAIN_FORWARD: dict[type, Callable] = {}


def remember_plain_forward(model: Any) -> None:
    """Keep the forward of `model`'s class before verl patches it (called by verl's patch_forward_with_backends,
    wrapped in worker_hooks.py); a class already patched was remembered when it was first patched."""
    if not hasattr(model, _BACKEND_ATTRIBUTE):
        PLAIN_FORWARD.setdefault(type(model), type(model).forward)


def hf_model(module: Any) -> Any:
    """The outermost transformers model inside what an engine holds (an FSDP wrapper, a PEFT model or the model)."""
    from transformers import PreTrainedModel

    for sub in module.modules():
        if isinstance(sub, PreTrainedModel):
            return sub
    raise ValueError(f"no transformers model inside {type(module).__name__}")


def fused_backend(model: Any) -> str | None:
    """The fused-kernel backend `model` runs with, None when it runs verl's plain forward."""
    return getattr(model, _BACKEND_ATTRIBUTE, None)


def _plain_class(model: Any) -> type | None:
    """The class whose forward verl patched (FSDP2 puts a subclass of its own in front), None if none remembered."""
    return next((cls for cls in type(model).__mro__ if cls in PLAIN_FORWARD), None)


def fused_problem(model: Any, backend: str | None) -> str | None:
    """Why `model` can't be switched to `backend` (None: plain forward) live; None when it can."""
    if backend is not None and backend not in FUSED_BACKENDS:
        return f"fused-kernel backend {backend!r} is not one of {FUSED_BACKENDS}"
    if fused_backend(model) is not None and _plain_class(model) is None:
        return (f"{type(model).__name__} was built with fused kernels before the workbench could keep its plain "
                "forward: switching them needs a restart")
    return None


def set_fused(model: Any, backend: str | None) -> None:
    """Run `model` with verl's fused forward on `backend`, or with its plain forward (backend None)."""
    problem = fused_problem(model, backend)
    if problem:
        raise ValueError(problem)
    if fused_backend(model) == backend:
        return
    if backend is None:
        plain = _plain_class(model)
        for cls in type(model).__mro__:  # a fused forward verl put on a subclass in front (FSDP2) goes too
            if cls is plain:
                break
            if issubclass(cls, plain) and "forward" in vars(cls):
                delattr(cls, "forward")
        plain.forward = PLAIN_FORWARD[plain]
        del model.__dict__[_BACKEND_ATTRIBUTE]
        return
    remember_plain_forward(model)
    from verl.models.transformers.monkey_patch import patch_forward_with_backends

    # verl's own choice of fused forward for this architecture, as when it builds a model fused.
    patch_forward_with_backends(model, use_fused_kernels=True, fused_kernels_backend=backend)


def checkpointing(model: Any) -> bool:
    """Whether `model` recomputes activations in the backward pass (transformers' flag on its layers)."""
    return bool(model.is_gradient_checkpointing)


def set_checkpointing(model: Any, on: bool) -> None:
    """Gradient checkpointing on or off, as verl's `_build_module` turns it on."""
    if checkpointing(model) == on:
        return
    if on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=dict(CHECKPOINTING_KWARGS))
    else:
        model.gradient_checkpointing_disable()


def engines(worker: Any) -> dict[str, Any]:
    """role -> verl TrainingWorker in this Ray worker process. verl's colocated `WorkerDict` holds the role workers in
    `worker_dict`: an ActorRolloutRefWorker (its `actor` and `ref` are TrainingWorkers) and a critic TrainingWorker
    (model_type value_model)."""
    found: dict[str, Any] = {}
    parts = getattr(worker, "worker_dict", None) or {"": worker}
    for part in parts.values():
        if hasattr(part, "engine"):
            model_type = getattr(getattr(part, "config", None), "model_type", None)
            found["critic" if model_type == "value_model" else "actor"] = part
            continue
        for role in ("actor", "ref"):
            inner = getattr(part, role, None)
            if inner is not None and hasattr(inner, "engine"):
                found[role] = inner
    return found


def _state(training_worker: Any) -> dict[str, Any]:
    model = hf_model(training_worker.engine.module)
    return {"fused_backend": fused_backend(model),
            "use_fused_kernels": bool(training_worker.engine_config.use_fused_kernels),
            "gradient_checkpointing": checkpointing(model), "model": type(model).__name__}


def put_in_force(worker: Any, wanted: dict[str, dict[str, Any]], check_only: bool = False) -> dict[str, Any]:
    """Ray `__ray_call__` target: put the wanted levers in force on this worker process's engines.

    wanted: {"fused_kernels": {"roles": [...], "backend": "torch" | "liger" | None},
             "gradient_checkpointing": {"roles": [...], "on": bool}}, either or both.
    Returns {"pid", "problems": [...], "engines": {role: state read back from the model}}; with problems nothing is
    changed. check_only: check and report, change nothing. After a change the peak-memory counter restarts, so the
    steps that follow report the new setting's peak (verl logs torch's process-lifetime peak per step).
    """
    by_role = engines(worker)
    problems = []
    for lever, spec in wanted.items():
        for role in spec["roles"]:
            if role not in by_role:
                continue  # this process runs no such role (e.g. a critic on GPUs of its own)
            model = hf_model(by_role[role].engine.module)
            if lever == "fused_kernels":
                problem = fused_problem(model, spec["backend"])
            elif lever == "gradient_checkpointing":
                problem = None if model.supports_gradient_checkpointing else (
                    f"{type(model).__name__} does not support gradient checkpointing")
            else:
                problem = f"unknown lever {lever!r}"
            if problem:
                problems.append(f"{role}: {problem}")
    if not problems and not check_only:
        for lever, spec in wanted.items():
            for role in spec["roles"]:
                if role not in by_role:
                    continue
                training_worker = by_role[role]
                model = hf_model(training_worker.engine.module)
                if lever == "fused_kernels":
                    set_fused(model, spec["backend"])
                    # each call's default (TrainingWorker.train_batch / infer_batch read it per call)
                    training_worker.engine_config.use_fused_kernels = spec["backend"] is not None
                else:
                    set_checkpointing(model, bool(spec["on"]))
        _restart_peak_memory()
    return {"pid": os.getpid(), "problems": problems,
            "engines": {role: _state(training_worker) for role, training_worker in by_role.items()}}


def _restart_peak_memory() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
