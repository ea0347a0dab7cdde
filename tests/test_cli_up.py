"""`verl-workbench up` on a machine without a GPU: it replays the recorded H200 session and follows it."""

import io

from workbench.cli import main
from workbench.cli_up import follow, live_possible
from workbench.session import Session


def test_up_without_gpu_replays_the_recording(home, capsys):
    assert live_possible()[0] is False
    assert main(["up", "--speed", "50", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "replaying the recorded H200 session 'h200-proof'" in out
    assert "step    1" in out and "step    2" in out and "tok/s/GPU" in out
    session = Session.attach()
    assert session.meta["kind"] == "replay"
    session.stop(now=True)


def test_follow_ends_with_the_session(home):
    session = Session.replay("h200-lora-critic-sync", speed=200, follow=False)
    out = io.StringIO()
    assert follow(session, seconds=120, out=out) == 0
    text = out.getvalue()
    assert "step    8" in text
    assert f"session {session.id} is finished" in text
