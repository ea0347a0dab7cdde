"""Page open → every chart drawn: the dashboard `verl-workbench up` serves, on a replay of the real recording
h200-tuning at 10×, opened in headless Chromium (Debian's /usr/bin/chromium, as the browser tests).

Each repetition opens a new page and times, from the request, the first chart with data drawn and every chart
(utilization, step breakdown, throughput) with data drawn, counted as points in each chart's SVG: the operator's
page, a reload of it, and a viewer's page. Every load is guarded like the browser tests: a request leaving
127.0.0.1 or a widget failure in the console fails the measure. Goal (issue 15): ≤ 10 s on a quiet machine; the
first chart took 36–150 s and throughput never drew before the charts held their data.
"""

from __future__ import annotations

import time

from bench.common import median, result
from bench.measures import Context, standalone

MEASURE = "page_open"
WHERE = "cpu"
GOAL = "<= 10 s"
RECORDING, SPEED = "h200-tuning", 10
DRAWN_WITHIN_S = 180.0


def _drawn(page, started: float) -> dict:
    """Seconds from `started` to the first chart and to every chart drawn with data (polled every 0.1 s)."""
    from tests.browser.conftest import CHART_PANELS, chart_drawn

    first = None
    while time.monotonic() < started + DRAWN_WITHIN_S:
        drawn = chart_drawn(page)
        if first is None and any(drawn.values()):
            first = time.monotonic() - started
        if all(drawn.get(panel, 0) > 0 for panel in CHART_PANELS):
            return {"value": time.monotonic() - started, "first_chart_s": first, "points": drawn}
        time.sleep(0.1)
    raise TimeoutError(f"not every chart drawn within {DRAWN_WITHIN_S:.0f} s: {chart_drawn(page)}")


def _open(browser, url: str, reload_first: bool = False) -> dict:
    from tests.browser.conftest import guard_page

    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    guard = guard_page(page)
    try:
        if reload_first:  # a page already open, reloaded: a new page kernel behind the same tab
            page.goto(url, wait_until="commit")
            _drawn(page, time.monotonic())
            started = time.monotonic()
            page.reload(wait_until="commit")
        else:
            started = time.monotonic()
            page.goto(url, wait_until="commit")
        timed = _drawn(page, started)
        guard.check()
        return timed
    finally:
        page.close()


def run(ctx: Context) -> dict:
    from playwright.sync_api import sync_playwright

    from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, Up
    from workbench.session import Session

    if not CHROMIUM.exists():
        raise SystemExit(f"page_open needs Chromium at {CHROMIUM} (apt-get install chromium)")
    up = Up.start(ctx.work / "page-open-home", "--replay", RECORDING, "--speed", str(SPEED))
    reps = []
    try:
        session = Session.attach(up.home / "sessions" / up.session_id, read_only=True)
        deadline = time.monotonic() + 300
        while (session.last_step() or 0) < 1 and time.monotonic() < deadline:  # charts with data to draw
            time.sleep(0.5)
        cases = [("operator", up.operator_url, False)] if ctx.quick else \
            [("operator", up.operator_url, False), ("reload", up.operator_url, True), ("viewer", up.viewer_url, False)] * 3
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            try:
                for case, url, reload_first in cases:
                    reps.append({"case": case, **_open(browser, url, reload_first)})
            finally:
                browser.close()
    finally:
        up.stop()
    every = median(r["value"] for r in reps)
    return result(
        MEASURE, value=every, unit="s", goal=GOAL, repetitions=reps, machine=ctx.machine,
        details={"recording": RECORDING, "speed": SPEED,
                 "first_chart_median_s": median(r["first_chart_s"] for r in reps),
                 "by_case_median_s": {case: median(r["value"] for r in reps if r["case"] == case)
                                      for case in dict.fromkeys(r["case"] for r in reps)}},
        notes="value: median seconds from the page's request to every chart drawn with data (points in its SVG); "
              "each load guarded: no request beyond 127.0.0.1, no widget failure",
        command="python -m bench.run --measure page_open",
    )


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
