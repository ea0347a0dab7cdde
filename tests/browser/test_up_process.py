"""`verl-workbench up --no-browser` serves the dashboard page and leaves nothing behind on SIGTERM or Ctrl-C."""

import signal

import psutil
import pytest

from tests.browser.conftest import PAGE_TIMEOUT_MS, Up, screenshot

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_up_serves_the_page_and_stops_clean(browser, tmp_path, sig):
    up = Up.start(tmp_path, "--speed", "20")
    try:
        assert "replaying the recorded H200 session 'h200-tuning'" in up.output
        assert up.operator_url.startswith("http://127.0.0.1:") and f"session={up.session_id}" in up.operator_url
        page = browser.new_page()
        page.goto(up.viewer_url, wait_until="commit", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector(".wb-dashboard", timeout=PAGE_TIMEOUT_MS)
        screenshot(page, f"up_viewer_{sig.name}")
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
