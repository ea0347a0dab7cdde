"""The dashboard in JupyterLab 4: a notebook cell shows `Dashboard(...)` for a replayed session; run through Lab's
own UI in headless Chromium, its charts grow with no further interaction and an Apply from the page is applied."""

import os
import secrets
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest

from tests.browser.conftest import (
    BUDGETS, PAGE_TIMEOUT_MS, assert_every_chart_drawn, chart_points, guard_page, screenshot, set_budgets,
    store_commands, wait_until,
)
from workbench.cli.serve import free_port

pytestmark = pytest.mark.browser
NOTEBOOK = "dashboard_in_lab.ipynb"


@pytest.fixture
def lab(tmp_path):
    """A replayed session (speed 2, no recorded operator), a notebook that shows its dashboard as the operator, and
    JupyterLab on loopback with a token."""
    from workbench.session import Session

    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "VERL_WORKBENCH_HOME": str(home)}
    os.environ["VERL_WORKBENCH_HOME"] = str(home)  # the session's supervisor and this test's reads
    try:
        session = Session.replay("h200-proof", speed=2, follow=False)
    finally:
        os.environ.pop("VERL_WORKBENCH_HOME")
    operator_token = (session.dir / "operator.token").read_text().strip()
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell(
        "from widgets.dashboard import Dashboard\n"
        "from workbench.session import Session\n\n"
        f"Dashboard(Session.attach({session.id!r}, read_only=True), token={operator_token!r})")]
    nbformat.write(notebook, tmp_path / NOTEBOOK)
    token, port = secrets.token_hex(16), free_port("127.0.0.1")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--LabApp.news_url=", "--ServerApp.allow_root=True", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=open(tmp_path / "lab.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/api/status?token={token}") or server.poll() is not None,
                   120, "JupyterLab answering")
        assert server.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
        yield {"url": f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?token={token}&reset", "home": home,
               "session": session, "log": tmp_path / "lab.log"}
    finally:
        procs = [server, *psutil.Process(server.pid).children(recursive=True)] if server.poll() is None else []
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        for p in procs[1:]:
            if p.is_running():
                p.kill()
        os.environ["VERL_WORKBENCH_HOME"] = str(home)
        try:
            session.stop(now=True)
        finally:
            os.environ.pop("VERL_WORKBENCH_HOME")


def run_first_cell(page, attempts: int = 3) -> None:
    """Select the first cell and press Lab's Run button, as a user does; again if a kernel that was still
    connecting dropped it (the prompt stays "[ ]")."""
    prompt = page.locator(".jp-Cell .jp-InputPrompt").first
    for _ in range(attempts):
        page.locator(".jp-Cell .jp-InputArea-editor").first.click()
        page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:run-cell-and-select-next']").click()
        try:
            wait_until(lambda: any(c in prompt.inner_text() for c in "*0123456789"), 15, "the cell running")
            return
        except AssertionError:
            continue
    raise AssertionError("JupyterLab did not run the cell")


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status == 200
    except OSError:
        return False


def test_lab_dashboard_updates_live_and_applies(lab, browser):
    page = browser.new_page(viewport={"width": 1600, "height": 1200})
    guard = guard_page(page)
    try:
        page.goto(lab["url"], wait_until="commit", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle'], "
                               ".jp-Toolbar-kernelStatus:has-text('Idle')", timeout=PAGE_TIMEOUT_MS)
        run_first_cell(page)
        page.wait_for_selector(".jp-OutputArea .wb-dashboard .wb-knob-actor_token_budget", timeout=PAGE_TIMEOUT_MS)
        assert_every_chart_drawn(page, guard, "JupyterLab")
        first = wait_until(lambda: chart_points(page), 60, "a chart with points")
        screenshot(page, "lab_live_first")
        wait_until(lambda: chart_points(page) > first, 60, f"charts growing past {first} points with no cell run")
        screenshot(page, "lab_live_later")

        session = lab["session"]
        before = len(store_commands(lab["home"], session.id))
        set_budgets(page, 32768)
        wait_until(lambda: all(knob in page.inner_text(".wb-diff") for knob in BUDGETS), 120, "all four budgets in the diff")
        apply = page.locator(".wb-apply")
        wait_until(lambda: apply.is_enabled(), 60, "Apply enabled for a valid change")
        apply.click()
        commands = wait_until(lambda: c if len(c := store_commands(lab["home"], session.id)) > before else None, 30,
                              "the apply command in the store")
        assert commands[commands.kind == "apply"].iloc[-1].payload["changes"] == {knob: 32768 for knob in BUDGETS}
        page.wait_for_selector(".wb-events-log:has-text('applied')", timeout=180_000)
        assert "actor_token_budget 4096 → 32768" in page.inner_text(".wb-events-log")
        screenshot(page, "lab_applied")
        guard.check()  # no widget model failed on the way, no request left 127.0.0.1
        page.close()
    except BaseException:
        screenshot(page, "lab_failure")
        raise
