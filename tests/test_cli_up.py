"""`verl-workbench up` on a machine without a GPU: it replays the recorded H200 session, serves its dashboard with
Voila (operator and viewer URLs), follows it in the terminal and leaves nothing behind when it ends."""

import io
import signal
import socket
import urllib.request
from types import SimpleNamespace

import psutil
import pytest

from tests.browser.conftest import Up
from workbench.cli import main
from workbench.cli.up import follow, live_possible
from workbench.session import Session


@pytest.mark.slow
def test_up_without_gpu_replays_the_recording_and_stops_it(home, capsys):
    assert live_possible()[0] is False
    assert main(["up", "--no-dashboard", "--speed", "50", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "replaying the recorded H200 session 'h200-tuning'" in out  # the tuning story
    assert "step    1" in out and "step    2" in out and "tok/s/GPU" in out
    session = Session.attach(read_only=True)
    assert session.meta["kind"] == "replay"
    assert session.state == "stopped"  # up stops the session it started
    assert not psutil.pid_exists(int(session.meta["supervisor_pid"]))


@pytest.mark.slow
def test_up_prints_operator_and_viewer_urls_and_serves_the_page(tmp_path):
    up = Up.start(tmp_path, "--speed", "50")
    try:
        operator, viewer = up.operator_url, up.viewer_url
        token = (tmp_path / "sessions" / up.session_id / "operator.token").read_text().strip()
        assert operator == f"{viewer}&token={token}" and viewer.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(viewer, timeout=120) as page:  # Voila renders the dashboard notebook
            assert page.status == 200 and "voila" in page.read().decode().lower()
        procs = up.processes()
    finally:
        rc = up.stop(signal.SIGTERM)
    assert rc == 0, up.output
    assert not psutil.wait_procs(procs, timeout=10)[1]


def test_up_says_when_the_port_is_taken(home, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        assert main(["up", "--no-browser", "--port", str(port), "--speed", "50", "--for", "1"]) == 1
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in err and "--port N" in err
    assert Session.list().empty  # no session started for nothing


@pytest.mark.slow
def test_follow_ends_with_the_session(home):
    session = Session.replay("h200-lora-critic-sync", speed=200, follow=False)
    out = io.StringIO()
    assert follow(session, seconds=120, out=out) == 0
    text = out.getvalue()
    assert "step    8" in text
    assert f"session {session.id} is finished" in text


def test_follow_prints_steps_and_events_in_the_order_they_happened():
    """One poll that read both tables: the terminal interleaves them by time, not table by table. A stand-in for
    the session (synthetic rows): the order is follow's alone."""
    import pandas as pd

    class OnePoll:
        id = "synthetic"

        def poll(self, cursor):  # the rows, then nothing new: the session has ended
            changed = frozenset({"events", "steps"}) if cursor is None else frozenset()
            return SimpleNamespace(changed=changed, since={"events": 0, "steps": 0}, cursor="c", state="finished")

        def events(self, since_id):
            return pd.DataFrame({"id": [1, 2], "t": [10.0, 30.0], "kind": ["launched", "applied"],
                                 "text": ["run 1", "actor_token_budget 4096 → 8192"]})

        def steps(self, since_id):
            return pd.DataFrame({"id": [1, 2], "t": [20.0, 40.0], "step": [1, 2], "segment_id": [1, 1],
                                 "timing_s/step": [10.0, 9.0], "timing_s/gen": [5.0, 4.0],
                                 "perf/throughput": [1000.0, 1100.0], "critic/vf_loss": [0.5, 0.4]})

    out = io.StringIO()
    assert follow(OnePoll(), out=out) == 0
    lines = out.getvalue().splitlines()
    assert [line.split()[0] for line in lines] == ["[launched]", "step", "[applied]", "step", "session"]
    assert lines[1].startswith("step    1") and lines[3].startswith("step    2")


def test_the_dashboard_notebook_is_found_where_the_package_lives():
    from workbench.cli.serve import DASHBOARD_NOTEBOOK, notebooks_dir

    assert (notebooks_dir() / DASHBOARD_NOTEBOOK).is_file()


@pytest.mark.slow
def test_the_cli_explains_itself_at_once():
    """`verl-workbench --help` lists every command without importing them (under a second even on a loaded
    machine); `up --help` says what it does, its defaults and the recordings it can replay."""
    import subprocess
    import sys
    import time

    from workbench.cli import COMMANDS
    from workbench.recordings import bundled

    started = time.perf_counter()
    top = subprocess.run([sys.executable, "-m", "workbench.cli", "--help"], capture_output=True, text=True, check=True)
    took = time.perf_counter() - started
    assert took < 1.0, f"verl-workbench --help took {took:.2f} s"
    assert all(command in top.stdout for command in COMMANDS)
    up = " ".join(subprocess.run([sys.executable, "-m", "workbench.cli", "up", "--help"], capture_output=True,
                                 text=True, check=True).stdout.split())  # as words: argparse wraps lines
    assert "operator URL" in up and "(default 10)" in up and "default without one: h200-tuning" in up
    assert all(name in up for name in bundled()) and "12 steps in 3 segments" in up
    for command in COMMANDS:
        own = " ".join(subprocess.run([sys.executable, "-m", "workbench.cli", command, "--help"],
                                      capture_output=True, text=True, check=True).stdout.split())
        assert COMMANDS[command][1][1:] in own  # its description atop its own help
