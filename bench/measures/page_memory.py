"""Memory a dashboard page costs the server, and how long until it is given back after the page is gone.

Runs `verl-workbench up --replay h200-proof --no-browser --port 0` as a user does (default page grace and cap), then
serves one page and lets its kernel end (the operator's page warms the server up: templates, handlers, caches), then
opens viewer pages in headless Chromium, batch at a time, until PAGES pages have been opened and closed. Each batch
waits until every page has drawn its charts, then reads the memory of the server's process tree (the Voila server and
its page kernels; Chromium is not counted): PSS (shared libraries split between the processes that map them) and RSS.
After the last page closed it reads the tree every SAMPLE_S until every page kernel has ended and the tree is back
within TOLERANCE_MB of the baseline taken after the warm-up, for at most RETURN_WITHIN_S. The server's own memory
before and after the warm-up is kept beside it.

value: PSS per page kernel (MB); goal: memory back to baseline within 5 minutes of the last closed page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from bench.common import median, result
from bench.measures import Context, standalone

MEASURE = "page_memory"
WHERE = "cpu"
RETURN_WITHIN_S = 300
TOLERANCE_MB = 50
SAMPLE_S = 5
CHROMIUM = "/usr/bin/chromium"
URL = re.compile(r"^\s+(http://\S+)$")
DRAWN_JS = """() => { const gd = document.querySelector('.wb-utilization .js-plotly-plot');
    return !!gd && gd.querySelectorAll('g.trace path.js-line, g.trace g.points > *').length > 0; }"""


def tree_memory(root: psutil.Process) -> dict[str, float]:
    """PSS and RSS (MB) of a process and its descendants, and how many page kernels are among them."""
    pss = rss = kernels = 0
    for proc in [root, *root.children(recursive=True)]:
        try:
            info = proc.memory_full_info()
            pss, rss = pss + info.pss, rss + info.rss
            kernels += "ipykernel_launcher" in " ".join(proc.cmdline())
        except psutil.Error:  # ended while read
            pass
    return {"pss_mb": pss / 2 ** 20, "rss_mb": rss / 2 ** 20, "kernels": kernels}


class Up:
    """`verl-workbench up` in a child process, its printed URLs collected."""

    def __init__(self, home: Path, *args: str):
        env = {**os.environ, "VERL_WORKBENCH_HOME": str(home), "PYTHONUNBUFFERED": "1"}
        self.process = subprocess.Popen([sys.executable, "-m", "workbench.cli", "up", "--no-browser", "--port", "0",
                                         *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.urls: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.time() + 300
        while len(self.urls) < 2:
            if self.process.poll() is not None or time.time() > deadline:
                raise RuntimeError("up printed no URLs")
            time.sleep(0.2)

    def _read(self) -> None:
        for line in self.process.stdout:
            if match := URL.match(line):
                self.urls.append(match.group(1))

    @property
    def viewer_url(self) -> str:
        return next(u for u in self.urls if "token=" not in u)

    def server(self) -> psutil.Process:
        for child in psutil.Process(self.process.pid).children():
            if "voila_guard" in " ".join(child.cmdline()):
                return child
        raise RuntimeError("no dashboard server under up")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=120)


def open_batch(browser, url: str, n: int, timeout_ms: int) -> tuple[list, int]:
    """n viewer pages, each waited for until its utilization chart is drawn (its kernel did its full work); the
    pages and how many never drew within timeout_ms (on a loaded machine a widget may fail to start: counted)."""
    from playwright.sync_api import TimeoutError as PageTimeout

    pages, undrawn = [], 0
    for _ in range(n):
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(url, wait_until="commit", timeout=timeout_ms)
        pages.append(page)
    for page in pages:
        try:
            page.wait_for_function(DRAWN_JS, timeout=timeout_ms)
        except PageTimeout:
            undrawn += 1
    return pages, undrawn


def run(ctx: Context) -> dict:
    from playwright.sync_api import sync_playwright

    pages_total, batch = (2, 2) if ctx.quick else (20, 4)
    grace = ["--page-grace", "5"] if ctx.quick else []  # the full measure keeps up's default grace
    up = Up(ctx.work / "page-memory-home", "--replay", "h200-proof", "--speed", "1", "--no-follow", *grace)
    reps, returned_after = [], None
    try:
        server = up.server()
        time.sleep(10)
        fresh = tree_memory(server)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                 args=["--no-sandbox", "--disable-gpu"])
            for page in open_batch(browser, up.viewer_url, 1, timeout_ms=300_000)[0]:  # the warm-up page
                page.close()
            while tree_memory(server)["kernels"]:
                time.sleep(SAMPLE_S)
            baseline = tree_memory(server)
            opened = 0
            while opened < pages_total:
                n = min(batch, pages_total - opened)
                started = time.time()
                pages, undrawn = open_batch(browser, up.viewer_url, n, timeout_ms=180_000)
                time.sleep(5)
                held = tree_memory(server)  # kernels of the last batch may still be in their grace time
                per_page = (held["pss_mb"] - baseline["pss_mb"]) / held["kernels"]
                reps.append({"value": per_page, "pages_open": n, "not_drawn": undrawn, "kernels": held["kernels"],
                             "pss_mb": round(held["pss_mb"]), "rss_mb": round(held["rss_mb"]),
                             "rss_per_kernel_mb": round((held["rss_mb"] - baseline["rss_mb"]) / held["kernels"]),
                             "s_to_draw": round(time.time() - started, 1)})
                for page in pages:
                    page.close()
                opened += n
            closed_at = time.time()
            browser.close()
        trail = []
        while time.time() - closed_at <= (60 if ctx.quick else RETURN_WITHIN_S):
            now = tree_memory(server)
            trail.append({"s": round(time.time() - closed_at), **{k: round(v) for k, v in now.items()}})
            if now["kernels"] == 0 and now["pss_mb"] - baseline["pss_mb"] <= TOLERANCE_MB:
                returned_after = time.time() - closed_at
                break
            time.sleep(SAMPLE_S)
    finally:
        up.stop()
    value = median([r["value"] for r in reps])
    return result(
        MEASURE, value=value, unit="MB PSS per page kernel",
        goal=f"memory back to baseline (+{TOLERANCE_MB} MB) within {RETURN_WITHIN_S} s of the last closed page",
        repetitions=reps, machine=ctx.machine,
        met=returned_after is not None and returned_after <= RETURN_WITHIN_S,
        details={"pages": pages_total, "batch": batch, "baseline_pss_mb": round(baseline["pss_mb"]),
                 "baseline_rss_mb": round(baseline["rss_mb"]), "fresh_server_pss_mb": round(fresh["pss_mb"]),
                 "fresh_server_rss_mb": round(fresh["rss_mb"]), "returned_after_s": returned_after and
                 round(returned_after), "after_last_close": trail, "page_grace": grace or "up's default"},
        notes="value: (PSS of Voila + its page kernels with a batch of viewer pages open − baseline) ÷ page kernels "
              "running, median over batches; baseline: the server after one warm-up page whose kernel ended; "
              "Chromium not counted; a loaded shared 2-core machine (load average beside it)",
        command="python -m bench.run --measure page_memory",
    )


if __name__ == "__main__":
    raise SystemExit(standalone(MEASURE))
