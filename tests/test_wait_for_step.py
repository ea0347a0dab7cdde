"""wait_for_step on a session that ended after reaching the step returns; one that ended before it says so.

Seen on the replay of h200-tuning: the recorded stop came right after step 12, and wait_for_step(12) raised
"stopped before step 12" because it looked at the state before the step."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from workbench import Session

RECORDING = Path(__file__).resolve().parents[1] / "workbench" / "assets" / "recordings" / "h200-tuning"


@pytest.fixture
def ended_session(tmp_path):
    directory = tmp_path / "ended"
    shutil.copytree(RECORDING, directory)  # a finished real session: state "stopped" after step 12
    return Session.attach(directory, read_only=True)


def test_a_step_reached_before_the_end_is_reached(ended_session):
    assert ended_session.state == "stopped"
    assert ended_session.wait_for_step(12, timeout=5) is ended_session


def test_a_step_the_session_never_reached_is_named(ended_session):
    with pytest.raises(RuntimeError, match="stopped before step 13"):
        ended_session.wait_for_step(13, timeout=5)
