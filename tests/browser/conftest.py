"""A real browser for UI tests: Debian's Chromium (/usr/bin/chromium) driven by Playwright, and `verl-workbench up`
run as a user runs it. Without Chromium the browser tests skip (CI installs it: .ci/run). Screenshots land in
tests/artifacts/ (git-ignored)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
URL = re.compile(r"^\s+(http://\S+)$")
# `up` as a terminal runs it, Ctrl-C live: a test run started in the background (CI, `nohup … &`) has SIGINT ignored,
# every child inherits that, and Python then never raises KeyboardInterrupt (the Ctrl-C test waited 90 s in vain).
AS_A_TERMINALS_COMMAND = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                          "os.execv(sys.argv[1], sys.argv[1:])"]
PAGE_TIMEOUT_MS = 120_000  # a page kernel imports the workbench, pandas and plotly: slow on a busy 2-core machine


@pytest.fixture(scope="module")
def browser():
    """Chromium for one module's tests. Not for the whole session: while Playwright's sync API is open its event
    loop counts as running on the main thread, and every later test's asyncio.run() or sync_playwright() refused to
    start (tests/browser/test_browser_fixture.py)."""
    if not CHROMIUM.exists():
        pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


@dataclass
class Up:
    """`verl-workbench up` running in a child process, its output collected line by line."""

    process: subprocess.Popen
    home: Path
    lines: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, home: Path, *args: str, timeout: float = 120.0) -> "Up":
        env = {**os.environ, "VERL_WORKBENCH_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        command = [str(Path(sys.executable).parent / "verl-workbench"), "up", "--no-browser", "--port", "0", *args]
        process = subprocess.Popen([*AS_A_TERMINALS_COMMAND, *command], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        up = cls(process, home)
        threading.Thread(target=up._read, daemon=True).start()
        try:
            up.wait_for(lambda: len(up.urls()) >= 2 or up.process.poll() is not None, timeout)
            assert len(up.urls()) >= 2, f"up printed no URLs:\n{up.output}"
        except BaseException:
            up.stop()
            raise
        return up

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def urls(self) -> list[str]:
        return [m.group(1) for line in list(self.lines) if (m := URL.match(line))]

    @property
    def operator_url(self) -> str:
        return next(u for u in self.urls() if "token=" in u)

    @property
    def viewer_url(self) -> str:
        return next(u for u in self.urls() if "token=" not in u)

    @property
    def session_id(self) -> str:
        return re.search(r"session=([^&]+)", self.viewer_url).group(1)

    def wait_for(self, condition, timeout: float) -> None:
        deadline = time.time() + timeout
        while not condition():
            if time.time() > deadline:
                raise TimeoutError(f"condition not met within {timeout:.0f} s; up said:\n{self.output}")
            time.sleep(0.2)

    def processes(self) -> list[psutil.Process]:
        """up, the Voila server and its page kernels (its children), and the session's supervisor."""
        from workbench.session import Session

        procs = []
        try:
            parent = psutil.Process(self.process.pid)
            procs = [parent, *parent.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
        pid = Session.attach(self.home / "sessions" / self.session_id, read_only=True).meta.get("supervisor_pid")
        if pid is not None and psutil.pid_exists(int(pid)):
            procs.append(psutil.Process(int(pid)))
        return procs

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 90.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in psutil.Process(self.process.pid).children(recursive=True):
                p.kill()
            self.process.kill()
            raise


# ------------------------------------------------------------------------------------------------ the dashboard page
BUDGETS = ("actor_token_budget", "logprob_token_budget", "ref_token_budget", "critic_token_budget")
# Sum of the points every plotly chart on the page draws (plotly keeps its traces on the graph div as `.data`).
CHART_POINTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(
    gd => (gd.data || []).reduce((n, trace) => n + ((trace.x && trace.x.length) || 0), 0)).reduce((a, b) => a + b, 0)"""


# Per chart panel: the data points drawn in its SVG (markers, bars, and the vertices of lines with data), read from
# the DOM a person sees, not from the figure's data; none where the plot takes no room on the page.
CHART_PANELS = ("wb-utilization", "wb-steps", "wb-throughput")
CHART_DRAWN_JS = """(panels) => Object.fromEntries(panels.map(panel => {
    const gd = document.querySelector(`.${panel} .js-plotly-plot`);
    if (!gd) return [panel, 0];
    const box = gd.getBoundingClientRect();
    if (box.width < 1 || box.height < 1 || getComputedStyle(gd).visibility === 'hidden') return [panel, 0];
    const marks = gd.querySelectorAll('g.trace g.points > *').length;
    const vertices = Array.from(gd.querySelectorAll('g.trace path.js-line')).map(p => p.getAttribute('d') || '')
        .filter(d => d.includes('L')).reduce((n, d) => n + d.split('L').length, 0);
    return [panel, marks + vertices];
}))"""
# What a page may log only when a widget failed (anywidget gives a model 2 s to initialize; ipywidgets' own words:
# a model whose state names one the page has not built ("widget model not found") becomes an error model, and its
# view then fails with "Cannot read properties of undefined (reading 'create_view')", a page error).
WIDGET_FAILURES = ("Failed to initialize model", "Could not create", "Error creating widget", "Error rendering",
                   "Failed to load model", "Class not found", "widget model not found", "Could not instantiate widget",
                   "can not be instantiated", "Could not process update msg", "Error displaying widget",
                   "[verl-workbench]")  # our charts' own words when plotly.js did not load or a draw failed
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
# Every chart drawn after the page's widgets are there, on a loaded 2-core machine (bench/ has the quiet figure).
DRAWN_WITHIN_S = 120


def chart_drawn(page) -> dict[str, int]:
    """{chart panel: data points drawn in its SVG} (0: no chart there, or nothing drawn)."""
    return page.evaluate(CHART_DRAWN_JS, list(CHART_PANELS))


@dataclass
class PageGuard:
    """What a page asked of other hosts (refused: a server with no internet must work) and the widget failures it
    logged; `check()` fails the test on either."""

    outside: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)

    def check(self) -> None:
        assert not self.outside, f"requests leaving 127.0.0.1: {self.outside}"
        assert not self.failures, f"widget failures in the console: {self.failures}"

    @property
    def version_warnings(self) -> list[str]:
        """Shared modules an extension wanted in another version than the page's frontend has."""
        return [line for line in self.console if "Unsatisfied version" in line or "No satisfying version" in line]


def guard_page(page) -> PageGuard:
    """Refuse (and record) every request to a host other than this machine; record widget failures logged."""
    from urllib.parse import urlsplit

    guard = PageGuard()

    def route(r) -> None:
        url = r.request.url
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob") or parts.hostname in LOCAL_HOSTS:
            r.continue_()
        else:
            guard.outside.append(url)
            r.abort()

    def console(message) -> None:
        text = message.text
        guard.console.append(f"{message.type}: {text}")
        if any(words in text for words in WIDGET_FAILURES):
            guard.failures.append(text[:300])

    page.route("**/*", route)
    page.on("console", console)
    page.on("pageerror", lambda error: guard.failures.append(f"page error: {str(error)[:300]}"))
    return guard


def assert_every_chart_drawn(page, guard: PageGuard, what: str, timeout: float = DRAWN_WITHIN_S) -> dict[str, int]:
    """Wait until every chart panel has data drawn; then no request may have left this machine and no widget
    failed. On failure: a screenshot, the points each chart had, and the console's last words."""
    seen: dict[str, int] = {}

    def every_chart_drawn() -> dict[str, int] | None:
        seen.update(chart_drawn(page))
        return dict(seen) if all(n > 0 for n in seen.values()) else None

    try:
        drawn = wait_until(every_chart_drawn, timeout, f"every chart drawn on the {what} page")
    except AssertionError as error:
        screenshot(page, "charts_not_drawn_" + "".join(c if c.isalnum() else "_" for c in what))
        raise AssertionError(f"{error}; points drawn per chart: {seen}; console: {guard.console[-20:]}") from None
    guard.check()
    return drawn


def open_dashboard(browser, url: str, *, root: str = ".wb-dashboard", init_script: str | None = None):
    """A new page on url, once the dashboard's knob editors (built from the session's first read) are there; its
    `wb_guard` (a PageGuard) watches it from the first request. `init_script` runs before the page's own."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    if init_script:
        page.add_init_script(init_script)
    page.wb_guard = guard_page(page)  # before the first request
    page.goto(url, wait_until="commit", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_selector(f"{root} .wb-knob-actor_token_budget", timeout=PAGE_TIMEOUT_MS)
    return page


# The throughput chart as a person sees it: each segment's "seg N" label (its left edge is the segment's dotted line)
# and the pixel x of every step's marker.
SEGMENT_MARKS_JS = """() => {
    const gd = document.querySelector('.wb-throughput .js-plotly-plot');
    if (!gd) return null;
    const labels = Array.from(gd.querySelectorAll('g.annotation')).map(a => {
        const m = /^seg (\\d+)$/.exec((a.textContent || '').trim());
        return m ? [m[1], a.getBoundingClientRect().left] : null;
    }).filter(Boolean);
    const steps = Array.from(gd.querySelectorAll('g.trace.scatter g.points path.point')).map(p => {
        const box = p.getBoundingClientRect();
        return box.width > 0 ? box.left + box.width / 2 : null;
    }).filter(x => x !== null);
    return {labels: Object.fromEntries(labels), steps};
}"""
# A step's marker this far right of a segment's label is that segment's (the step before it ends on its line).
RIGHT_OF_LINE_PX = 5


def segment_drawn(page, newer_than: int) -> int | None:
    """The first segment newer than `newer_than` that the throughput chart marks ("seg N") with a step's marker
    drawn right of its line; None while there is none."""
    marks = page.evaluate(SEGMENT_MARKS_JS) or {"labels": {}, "steps": []}
    for segment_id, left in sorted(marks["labels"].items(), key=lambda item: int(item[0])):
        if int(segment_id) > newer_than and any(x >= left + RIGHT_OF_LINE_PX for x in marks["steps"]):
            return int(segment_id)
    return None


def clicked_change_runs(session, segment_id: int) -> dict:
    """The one change the page sent (not the recorded operator) is what segment `segment_id` runs: its changes."""
    commands = session.commands()
    applies = commands[commands.kind == "apply"]
    pages = applies[~applies.payload.map(lambda payload: "recorded_command" in payload)]
    assert len(pages) == 1, f"the page sent {len(pages)} changes, not the one clicked"
    clicked = pages.iloc[0].payload["changes"]
    segment = session.segments().set_index("id").loc[segment_id]
    runs = {d["knob"]: d["after"] for d in segment["diff"]}
    assert all(runs.get(knob) == value for knob, value in clicked.items()), \
        f"segment {segment_id} runs {runs}, not the clicked change {clicked}"
    return clicked


def tick_labels(page, panel: str, axis: str) -> list[str]:
    """The tick labels a person reads on a chart panel's x or y axis (left to right, bottom to top)."""
    return page.locator(f".{panel} .js-plotly-plot g.{axis}tick text").all_text_contents()


def chart_points(page) -> int:
    return page.evaluate(CHART_POINTS_JS)


def wait_until(condition, timeout: float, what: str, poll: float = 0.5):
    """The condition's first result that is neither None, False nor 0 (a DataFrame counts as a result)."""
    deadline = time.time() + timeout
    while True:
        value = condition()
        if value is not None and not (isinstance(value, (bool, int, float, str)) and not value):
            return value
        if time.time() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(poll)


def set_slider(page, knob: str, value: int) -> None:
    """Type a value into a number knob's entry beside its slider (what a user does for an exact number)."""
    entry = page.locator(f".wb-knob-{knob} input[type=number]")
    entry.click()
    page.keyboard.press("Control+A")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")
    entry.blur()


def set_budgets(page, value: int) -> None:
    """Every token budget to `value`; ref_token_budget is off in a plan without a reference policy, so the
    operator first asks to edit such knobs too (the recorded change moved all four together)."""
    page.locator(".wb-edit-irrelevant input").check()
    for knob in BUDGETS:
        set_slider(page, knob, value)


def store_commands(home: Path, session_id: str):
    from workbench.session import Session

    return Session.attach(home / "sessions" / session_id, read_only=True).commands()
