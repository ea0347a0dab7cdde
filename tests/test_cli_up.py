"""`verl-workbench up` on a machine without a GPU: it replays the recorded H200 session, serves its dashboard with
Voila (operator and viewer URLs), follows it in the terminal and leaves nothing behind when it ends."""

import io
import signal
import socket
import urllib.request

import psutil

from tests.browser.conftest import Up
from workbench.cli import main
from workbench.cli.up import follow, live_possible
from workbench.session import Session


def test_up_without_gpu_replays_the_recording_and_stops_it(home, capsys):
    assert live_possible()[0] is False
    assert main(["up", "--no-dashboard", "--speed", "50", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "replaying the recorded H200 session 'h200-proof'" in out
    assert "step    1" in out and "step    2" in out and "tok/s/GPU" in out
    session = Session.attach(read_only=True)
    assert session.meta["kind"] == "replay"
    assert session.state == "stopped"  # up stops the session it started
    assert not psutil.pid_exists(int(session.meta["supervisor_pid"]))


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


def test_follow_ends_with_the_session(home):
    session = Session.replay("h200-lora-critic-sync", speed=200, follow=False)
    out = io.StringIO()
    assert follow(session, seconds=120, out=out) == 0
    text = out.getvalue()
    assert "step    8" in text
    assert f"session {session.id} is finished" in text


def test_the_dashboard_notebook_is_found_where_the_package_lives():
    from workbench.cli.serve import DASHBOARD_NOTEBOOK, notebooks_dir

    assert (notebooks_dir() / DASHBOARD_NOTEBOOK).is_file()
