"""A first visit from a fresh clone (issue 15, "Done means"): seconds from opening the dashboard's URL to the effect
of a change the visitor applied being drawn on the throughput chart.

As a new user: `git clone` of this repository (its committed HEAD), the README's first command run there as
written (`bash scripts/setup.sh && .venv/bin/verl-workbench up`: a new .venv, then a replay of the recording
h200-tuning at 10× on a machine without a GPU), and the operator URL it prints opened at once in headless Chromium
(Debian's, 1600×1000). Then the visitor's moves, each through what the page shows: wait for a change the page
offers (a replay lists the changes its recording can play under Pending changes, one button each), click the
first, and watch the throughput chart until the change's segment is drawn there: a new "seg N" mark with a step's
marker right of it. The store then confirms that segment N runs the clicked change (not the recorded operator's).

value: seconds from the URL's request to that mark and marker drawn. details: the setup's seconds, the first
command's seconds to the printed URL, when the offer showed and was clicked, the step the change was in force from,
the machine's load at each stage. `--quick` skips the clone and the setup (this checkout's interpreter runs `up`):
it checks the visitor's path, the figure is not a first visit.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.common import BENCH, result
from bench.measures import Context, standalone

MEASURE = "first_visit"
WHERE = "cpu"
GOAL = "<= 120 s"
REPO = BENCH.parent
VIEWPORT = {"width": 1600, "height": 1000}
ARTIFACT = REPO / "tests" / "artifacts" / "first_visit.png"  # the page as the effect was drawn
SETUP_TIMEOUT_S = 1800.0
URL_TIMEOUT_S = 300.0
OFFER_WITHIN_S = 180.0
EFFECT_WITHIN_S = 300.0
def first_command(readme: Path) -> str:
    """The README's first command: the first line of its first ```bash block, without its comment."""
    block = re.search(r"```bash\n(.*?)```", readme.read_text(), re.S)
    if not block:
        raise SystemExit(f"no ```bash block in {readme}")
    return block.group(1).splitlines()[0].split("  #")[0].strip()


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class FirstCommand:
    """The README's first command running in the clone, its output read line by line (URLs as they are printed)."""

    def __init__(self, command: str, cwd: Path, home: Path):
        env = {**os.environ, "VERL_WORKBENCH_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        for name in ("VIRTUAL_ENV", "PYTHONPATH"):  # a new user's shell, not this interpreter's
            env.pop(name, None)
        self.started = time.monotonic()
        self.lines: list[str] = []
        self.setup_s: float | None = None
        self.process = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if self.setup_s is None and line.startswith("verl-workbench installed in .venv"):
                self.setup_s = time.monotonic() - self.started
            self.lines.append(line.rstrip("\n"))

    def operator_url(self) -> str | None:
        return next((line.strip() for line in list(self.lines) if line.startswith("  http") and "token=" in line), None)

    def stop(self) -> None:
        """SIGTERM to `up` (it stops its server, page kernels and session), then wait for the whole group."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def visit(browser, url: str, newest_segment) -> dict:
    """The visitor's moves on the page; seconds from the URL's request. `newest_segment()`: the session's newest
    segment id now (from its store): the clicked change begins a newer one."""
    from tests.browser.conftest import guard_page, segment_drawn, wait_until

    page = browser.new_page(viewport=VIEWPORT)
    guard = guard_page(page)
    try:
        started = time.monotonic()
        page.goto(url, wait_until="commit", timeout=int(URL_TIMEOUT_S * 1000))
        offer = page.locator(".wb-offer:not([disabled])").first
        offer.wait_for(state="visible", timeout=int(OFFER_WITHIN_S * 1000))
        offered_s = time.monotonic() - started
        text = offer.inner_text()
        before = newest_segment()
        offer.click()
        clicked_s = time.monotonic() - started
        load_at_click = load()
        page.locator(".wb-throughput").scroll_into_view_if_needed()  # where a person looks for the effect
        segment_id = wait_until(lambda: segment_drawn(page, before), EFFECT_WITHIN_S,
                                "the applied change's segment drawn on the throughput chart", poll=0.25)
        value = time.monotonic() - started
        sent, progress = page.inner_text(".wb-offers-sent"), page.inner_text(".wb-apply-progress")
        page.screenshot(path=str(ARTIFACT))
        guard.check()
        return {"value": value, "offer_shown_s": offered_s, "clicked_s": clicked_s, "offer": text,
                "segment": segment_id, "sent_text": sent[:300], "progress_text": progress[:300], "load_at_click": load_at_click}
    finally:
        page.close()


def session_of(home: Path, url: str):
    from workbench.session import Session  # imported by run() before the URL is printed

    return Session.attach(home / "sessions" / re.search(r"session=([^&]+)", url).group(1), read_only=True)


def confirm(session, visited: dict) -> dict:
    """The segment the chart marked runs the clicked change, and the page (not the recorded operator) sent it."""
    from tests.browser.conftest import clicked_change_runs

    changes = clicked_change_runs(session, visited["segment"])
    return {"session": session.id, "changes": changes,
            "in_force_from_step": int(session.segments().set_index("id").loc[visited["segment"], "first_step"])}


def run(ctx: Context) -> dict:
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, wait_until
    from workbench.session import Session  # noqa: F401  (before the URL: opening it waits for nothing of ours)

    if not CHROMIUM.exists():
        raise SystemExit(f"first_visit needs Chromium at {CHROMIUM} (apt-get install chromium)")
    home = ctx.work / "first-visit-home"
    load_before = load()
    if ctx.quick:  # this checkout and its interpreter: the visitor's path only
        clone = REPO
        command = f"{shlex.quote(sys.executable)} -m workbench.cli up --no-browser --port 0"
    else:
        clone = ctx.work / "fresh-clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        command = first_command(clone / "README.md")
    port_note = None
    if "--port" not in command and _port_busy(8866):  # another server on the README's port: any free one
        command += " --port 0"
        port_note = "port 8866 was taken on this machine: --port 0 added"
    ARTIFACT.parent.mkdir(exist_ok=True)
    up = FirstCommand(command, clone, home)
    try:
        with sync_playwright() as playwright:  # the visitor's browser is open before the URL is printed
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                url = wait_until(lambda: up.operator_url() or (up.process.poll() is not None and "exited"),
                                 SETUP_TIMEOUT_S + URL_TIMEOUT_S, "the operator URL printed", poll=0.1)
                if url == "exited":
                    raise RuntimeError("the first command ended before printing a URL:\n" + "\n".join(up.lines[-30:]))
                url_s, load_at_open = time.monotonic() - up.started, load()
                session = session_of(home, url)
                visited = visit(browser, url, lambda: int((session.segment() or {}).get("id") or 0))
            finally:
                browser.close()
        load_at_effect = load()
        confirmed = confirm(session, visited)
    finally:
        up.stop()
    return result(
        MEASURE, value=visited["value"], unit="s", goal=GOAL, repetitions=[visited], machine=ctx.machine,
        details={"command": command, "fresh_clone": not ctx.quick, "commit": _commit(clone), "setup_s": up.setup_s,
                 "command_to_url_s": url_s, "url_after_setup_s": url_s - (up.setup_s or 0.0),
                 **confirmed, "port_note": port_note,
                 "load_avg_1_5_15": {"before": load_before, "page_opened": load_at_open,
                                     "clicked": visited["load_at_click"], "effect_drawn": load_at_effect}},
        notes="value: seconds from the operator URL's request (opened as soon as the README's first command printed "
              "it) to the clicked offer's segment drawn on the throughput chart (its 'seg N' mark with a step's "
              "marker right of it); the store confirms that segment runs the clicked change",
        command="python -m bench.run --measure first_visit",
    )


def _commit(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()


def _port_busy(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
