"""verl-workbench: a live verl PPO session you can watch and steer from a notebook.

    from workbench import Session, Plan
    s = Session.replay("h200-proof", speed=20)   # or Session.start(plan) / Session.attach(id)

The public face (see each name's docstring): Session, ReadOnlySession, ApplyResult, Preview, Poll, Plan, PlanError,
Finding, KNOBS. The names load on first use, so processes that only need a part of the engine (the sampler, the
runner inside verl) don't import the rest; importing workbench never imports verl.
"""

from importlib import import_module

_HOMES = {
    "Session": "session", "ReadOnlySession": "handles", "ApplyResult": "handles", "ApplyRefused": "handles",
    "Preview": "handles", "Poll": "handles", "Plan": "plan", "PlanError": "plan", "Finding": "advisor",
    "KNOBS": "knobs",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
