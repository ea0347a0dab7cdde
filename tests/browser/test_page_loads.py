"""Every chart holds drawn data on every kind of page load (issue 15): the operator's page fresh, reloaded, a
viewer's page, the page of a session that has ended, and the page after Start switched it to a new session. No
widget model may fail to initialize (console) and no request may leave 127.0.0.1.

One `up` serves the module: the h200-tuning recording with its recorded operator (quickstart → the advisor's
change → a hot change → stop) at 20× real time, so that it ends within about a minute and the later tests see an
ended session; Start then begins a new replay of it from the operator's page."""

from __future__ import annotations

import time

import pytest

from tests.browser.conftest import (PAGE_TIMEOUT_MS, Up, assert_every_chart_drawn, clicked_change_runs, open_dashboard,
                                    screenshot, segment_drawn, wait_until)

pytestmark = pytest.mark.browser

ENDED = ("stopped", "finished", "failed", "lost")


@pytest.fixture(scope="module")
def up(tmp_path_factory, browser):
    up = Up.start(tmp_path_factory.mktemp("up-home"), "--replay", "h200-tuning", "--speed", "20")
    yield up
    assert up.stop() == 0, up.output


def session_of(up, session_id: str):
    from workbench.session import Session

    return Session.attach(up.home / "sessions" / session_id, read_only=True)


def test_the_operators_page_draws_every_chart_fresh_and_after_a_reload(up, browser):
    wait_until(lambda: (session_of(up, up.session_id).last_step() or 0) >= 1, 180, "the replay's first step")
    page = open_dashboard(browser, up.operator_url)
    guard = page.wb_guard
    try:
        assert_every_chart_drawn(page, guard, "fresh operator")
        screenshot(page, "loads_operator_fresh")
        assert not guard.version_warnings, (  # pyproject.toml pins versions whose frontends agree
            f"{len(guard.version_warnings)} version warnings, e.g. {guard.version_warnings[0]}: the installed voila / "
            "ipywidgets / jupyterlab_widgets are not the pinned ones (reinstall: bash scripts/setup.sh)")
        page.reload(wait_until="commit", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_selector(".wb-dashboard .wb-knob-actor_token_budget", timeout=PAGE_TIMEOUT_MS)
        assert_every_chart_drawn(page, guard, "reloaded operator")
        screenshot(page, "loads_operator_reloaded")
        guard.check()  # nor after the charts were drawn (the knob editors and advice come later)
    finally:
        page.close()


def test_a_viewers_page_draws_every_chart(up, browser):
    page = open_dashboard(browser, up.viewer_url)
    guard = page.wb_guard
    try:
        assert_every_chart_drawn(page, guard, "viewer")
        screenshot(page, "loads_viewer")
        guard.check()
    finally:
        page.close()


def test_the_page_of_an_ended_session_draws_every_chart_and_start_switches_it(up, browser):
    wait_until(lambda: session_of(up, up.session_id).state in ENDED, 300, "the recorded story's end (its stop)")
    viewer = open_dashboard(browser, up.viewer_url)
    guard = viewer.wb_guard
    try:
        assert_every_chart_drawn(viewer, guard, "ended session's viewer")
        viewer.wait_for_selector(".wb-dashboard .wb-knob-actor_token_budget", timeout=PAGE_TIMEOUT_MS)
        guard.check()
    finally:
        viewer.close()
    page = open_dashboard(browser, up.operator_url)
    guard = page.wb_guard
    try:
        assert_every_chart_drawn(page, guard, "ended session's operator")
        screenshot(page, "loads_ended")
        start = page.locator(".wb-start")
        wait_until(lambda: start.is_enabled(), 30, "Start enabled on the ended session's operator page")
        start.click()
        new_id = wait_until(lambda: next((s for s in _session_ids(up) if s != up.session_id), None), 60,
                            "a new session started")
        page.wait_for_selector(f".wb-status:has-text('{new_id}')", timeout=60_000)
        wait_until(lambda: (session_of(up, new_id).last_step() or 0) >= 1, 180, "the new session's first step")
        assert_every_chart_drawn(page, guard, "started session's operator")
        assert "read-only" not in page.inner_text(".wb-notice")  # the page that started it controls it
        screenshot(page, "loads_after_start")
        # A visitor's first move (bench/measures/first_visit.py times it from a fresh clone): a change the replay
        # offers at the page's top, one click; the page says where its effect shows, and the throughput chart draws
        # the segment it began ("seg N", a step's marker right of its line).
        newest = session_of(up, new_id).segment()["id"]
        page.locator(".wb-offer:not([disabled])").first.click()
        page.wait_for_selector(".wb-offers-sent:has-text('Throughput chart')", timeout=30_000)
        segment = wait_until(lambda: segment_drawn(page, newest), 120, "the clicked change's segment on the chart")
        clicked_change_runs(session_of(up, new_id), segment)
        screenshot(page, "loads_offer_applied")
        guard.check()
    finally:
        page.close()
        session = session_of(up, up.session_id)
        for sid in _session_ids(up):
            if sid != session.id:
                from workbench.session import Session

                Session.attach(up.home / "sessions" / sid).stop(now=True)
        time.sleep(0.5)


def _session_ids(up) -> list[str]:
    return sorted(p.name for p in (up.home / "sessions").iterdir() if (p / "session.sqlite").exists())
