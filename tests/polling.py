"""Waiting in tests for what another process or thread does: poll a predicate until it holds."""

from __future__ import annotations

import time
from typing import Callable


def wait_until(predicate: Callable[[], object], timeout: float, every: float = 0.2,
               what: str = "condition not met in time") -> None:
    """Poll `predicate` every `every` seconds; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(every)
