"""Regenerate docs/dashboard.png, the README's picture of the dashboard, from a replay.

It runs `verl-workbench up --replay h200-tuning --no-browser --port 0` in a throwaway home (as the browser tests
do: tests/browser/conftest.py's `Up`), opens the operator URL in headless Chromium (Debian's, 1600x1000), waits
until every chart holds drawn points and the throughput chart shows a few steps, and saves the top of the page.
Everything it started (`up`, which stops its server, page kernels and session; the browser) ends, even on error.

    .venv/bin/python docs/screenshot.py            # writes docs/dashboard.png
    .venv/bin/python docs/screenshot.py --help
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a file from anywhere: the browser tests' helpers live in tests/browser/

from tests.browser.conftest import (  # noqa: E402
    CHROMIUM, CHROMIUM_ARGS, Up, chart_drawn, guard_page, wait_until,
)

VIEWPORT = {"width": 1600, "height": 1000}
TOP_PX = 2000  # the picture: the page's top (state line, offers, header, the charts, the first knobs)


# Steps on the throughput chart: the points of its tokens/s/GPU traces (one per step).
STEPS_DRAWN_JS = """() => {
    const gd = document.querySelector('.wb-throughput .js-plotly-plot');
    return ((gd && gd.data) || []).filter(t => (t.name || '').startsWith('tokens/s'))
        .reduce((n, t) => n + ((t.x && t.x.length) || 0), 0);
}"""
# The dashboard's height: Voila scrolls it inside the page, so a full-page shot of a 1000 px viewport is 1000 px.
DASHBOARD_HEIGHT_JS = "() => Math.ceil(document.querySelector('.wb-dashboard').getBoundingClientRect().bottom)"


def steps_drawn(page) -> int:
    return page.evaluate(STEPS_DRAWN_JS)


def save_png(png: bytes, path: Path) -> int:
    """Write the screenshot, re-encoded smaller with Pillow where it is installed; returns the bytes written."""
    try:
        from PIL import Image
    except ImportError:
        path.write_bytes(png)
        return len(png)
    buffer = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(buffer, format="PNG", optimize=True)
    data = min(png, buffer.getvalue(), key=len)
    path.write_bytes(data)
    return len(data)


def shoot(out: Path, replay: str, speed: float, steps: int, timeout: float) -> str:
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise RuntimeError(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="wb-screenshot-") as home:
        started = time.monotonic()
        up = Up.start(Path(home), "--replay", replay, "--speed", str(speed), timeout=timeout)
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
                try:
                    page = browser.new_page(viewport=VIEWPORT)
                    guard = guard_page(page)
                    left = lambda: max(1.0, timeout - (time.monotonic() - started))  # noqa: E731
                    page.goto(up.operator_url, wait_until="commit", timeout=int(left() * 1000))
                    wait_until(lambda: all(n > 0 for n in chart_drawn(page).values()) and steps_drawn(page) >= steps,
                               left(), f"every chart drawn and {steps} steps on the throughput chart")
                    page.locator(".wb-offer:not([disabled])").first.wait_for(state="visible",
                                                                            timeout=int(left() * 1000))
                    page.mouse.move(0, 0)  # no hover label over a chart
                    guard.check()
                    height = min(TOP_PX, page.evaluate(DASHBOARD_HEIGHT_JS) + 20)
                    page.set_viewport_size({"width": VIEWPORT["width"], "height": height})  # the whole top, drawn
                    time.sleep(2)  # plotly redraws at the new size
                    png = page.screenshot(full_page=True, clip={"x": 0, "y": 0, "width": VIEWPORT["width"],
                                                                "height": height})
                    size = save_png(png, out)
                    return f"{out}: {VIEWPORT['width']}x{height}, {size / 1024:.0f} KiB, {steps_drawn(page)} steps drawn"
                finally:
                    browser.close()
        finally:
            up.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Regenerate docs/dashboard.png from a replay of a recorded session.")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard.png", help="PNG to write")
    parser.add_argument("--replay", default="h200-tuning", help="recording to replay (default: h200-tuning)")
    parser.add_argument("--speed", type=float, default=10.0, help="replay speed (default: 10x real time)")
    parser.add_argument("--steps", type=int, default=6,
                        help="steps on the throughput chart before the shot (default: 6, two past the recorded change)")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds for `up` to print its URL and the page to draw (default: 600)")
    args = parser.parse_args(argv)
    from playwright.sync_api import Error as BrowserError

    try:
        print(shoot(args.out, args.replay, args.speed, args.steps, args.timeout))
    except (AssertionError, TimeoutError, RuntimeError, BrowserError) as error:
        print(f"screenshot failed: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
