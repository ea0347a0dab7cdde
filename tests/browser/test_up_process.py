"""`verl-workbench up --no-browser` serves the dashboard page and leaves nothing behind on SIGTERM or Ctrl-C. The page
is opened while the replay is in its recorded start-up (at 0.01× the first GPU sample comes minutes later): the GPU
chart shows an empty time axis and says what it waits for."""

import re
import signal

import psutil
import pytest

from tests.browser.conftest import PAGE_TIMEOUT_MS, Up, screenshot, tick_labels, wait_until

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_up_serves_the_page_and_stops_clean(browser, tmp_path, sig):
    up = Up.start(tmp_path, "--speed", "0.01")
    try:
        assert "replaying the recorded H200 session 'h200-tuning'" in up.output
        assert up.operator_url.startswith("http://127.0.0.1:") and f"session={up.session_id}" in up.operator_url
        page = browser.new_page()
        page.goto(up.viewer_url, wait_until="commit", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector(".wb-dashboard", timeout=PAGE_TIMEOUT_MS)
        # Before the first sample: minutes from the session's start, not what plotly makes of no data (0.111443 …)
        ticks = wait_until(lambda: tick_labels(page, "wb-utilization", "x"), 60, "the GPU chart's time axis drawn")
        screenshot(page, f"up_viewer_{sig.name}")
        assert "waiting for the first GPU sample" in page.inner_text(".wb-utilization .js-plotly-plot"), ticks
        assert ticks[0] == "0" and all(re.fullmatch(r"\d+(\.\d{1,2})?", tick) for tick in ticks), ticks
        procs = up.processes()
        names = " ".join(" ".join(p.cmdline()) for p in procs)
        assert "voila" in names and "ipykernel" in names and "workbench.supervisor" in names
        page.close()
    finally:
        rc = up.stop(sig)
    assert rc == 0, up.output
    gone, alive = psutil.wait_procs(procs, timeout=5)
    assert not alive, f"left behind: {[p.cmdline() for p in alive]}"
    assert "dashboard server stopped" in up.output
    assert f"session {up.session_id} stopped" in up.output
