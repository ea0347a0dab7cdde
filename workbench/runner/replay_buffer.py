"""A short poll for verl 0.9.1's V1 replay buffer, so `timing_s/gen` ends when generation ends.

verl's `ReplayBuffer` (verl/trainer/ppo/v1/replay_buffer.py) waits for finished rollouts in a loop that lists
TransferQueue's metadata and then sleeps `poll_interval` seconds; `trainer_base._build_replay_buffer` never passes
one, so it is 2.0 s and no config key sets it. Generation therefore ends on a 2 s grid after it really ended:
`timing_s/gen` read 4.1, 6.1, 8.1, 10.2, 12.1, 16.2 s across the H200 reference runs, a mean of ~1 s lost a step.

TransferQueue offers no notification to wait on, so the fix keeps verl's loop and shortens its sleep. Each poll
is one metadata listing (`tq.kv_list()`) from the trainer driver, no GPU work: at 0.05 s that is 20 small
requests a second while the trainer waits anyway. It is always on (the workbench runner builds every replay
buffer this way): no run gains from the 2 s grid. `VERL_WORKBENCH_REPLAY_POLL_S` sets another interval (2.0
gives verl's own behaviour back, to measure the difference).

separate_async keeps verl's interval: its hybrid-rollout switch counts a step as idle when the trainer waited
longer than one poll interval (trainer_separate_async.py `_step_had_idle`), so a shorter poll would change
when it lends GPUs, not only how soon a batch is seen.
"""

from __future__ import annotations

import os
from typing import Any

from ..control import REPLAY_POLL_ENV as POLL_ENV
from ..control import REPLAY_POLL_S

KEEPS_VERL_POLL = ("separate_async",)


def poll_interval_s() -> float:
    """The interval the runner gives the replay buffer: REPLAY_POLL_S, or the environment's positive number."""
    text = os.environ.get(POLL_ENV, "").strip()
    if not text:
        return REPLAY_POLL_S
    try:
        value = float(text)
    except ValueError as error:
        raise ValueError(f"{POLL_ENV}={text!r} is not a number of seconds") from error
    if not value > 0:
        raise ValueError(f"{POLL_ENV}={text!r}: the poll interval must be above 0 s")
    return value


def shorten_poll(buffer: Any, trainer_mode: str) -> Any:
    """`buffer` with its poll interval set to `poll_interval_s()` (verl's own class, or a custom sampler that
    inherits its loop); unchanged for separate_async and for samplers without a `poll_interval`."""
    if trainer_mode in KEEPS_VERL_POLL or not isinstance(getattr(buffer, "poll_interval", None), (int, float)):
        return buffer
    buffer.poll_interval = poll_interval_s()
    return buffer
