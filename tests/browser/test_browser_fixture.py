"""The `browser` fixture leaves nothing behind for the tests after it: while Playwright's sync API is open, its
event loop counts as running on the main thread (its greenlet shares the thread), so a later test's asyncio.run()
or sync_playwright() refused to start ("cannot be called from a running event loop", "Playwright Sync API inside
the asyncio loop"). A pytest run of its own (a module that uses the fixture, then one that needs the main thread's
loop free) holds that."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.browser.conftest import CHROMIUM

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_a_module_after_the_browser_tests_can_run_asyncio_and_playwright(tmp_path):
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    (tmp_path / "conftest.py").write_text("from tests.browser.conftest import browser  # noqa: F401\n")
    (tmp_path / "test_1_browser.py").write_text(textwrap.dedent("""
        def test_a_page_opens(browser):
            browser.new_page().close()
    """))
    (tmp_path / "test_2_after.py").write_text(textwrap.dedent("""
        import asyncio

        def test_asyncio_run_starts():
            assert asyncio.run(asyncio.sleep(0, result="ran")) == "ran"

        def test_playwright_sync_api_starts():
            from playwright.sync_api import sync_playwright

            with sync_playwright():
                pass
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, timeout=300)
    assert "3 passed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
