"""The Voila dashboard served by `verl-workbench up --no-browser` on a replay, driven in headless Chromium.

One `up` serves the module: h200-proof replayed at 2x without the recorded operator (every command is the test's),
so verl's recorded start-up (~100 s here) leaves time to queue a hot change before step 1 and see it applied."""

import pytest

from tests.browser.conftest import (
    BUDGETS, CHART_PANELS, set_budgets, Up, assert_every_chart_drawn, chart_drawn, chart_points, open_dashboard, screenshot, set_slider, store_commands, wait_until,
)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def up(tmp_path_factory, browser):
    up = Up.start(tmp_path_factory.mktemp("up-home"), "--replay", "h200-proof", "--speed", "2", "--no-follow")
    yield up
    assert up.stop() == 0, up.output


def test_charts_grow_with_no_interaction(up, browser):
    page = open_dashboard(browser, up.operator_url)
    first = wait_until(lambda: chart_points(page), 60, "a chart with points")
    screenshot(page, "voila_live_first")
    grown = wait_until(lambda: (n := chart_points(page)) > first and n, 60, f"charts growing past {first} points")
    screenshot(page, "voila_live_later")
    assert grown > first
    page.wb_guard.check()  # no widget model failed, no request left 127.0.0.1
    page.close()


def test_an_invalid_value_shows_its_message_at_the_widget_and_queues_nothing(up, browser):
    # Before the apply test: the replay still runs (an ended session refuses every change at the plan first).
    page = open_dashboard(browser, up.operator_url)
    before = len(store_commands(up.home, up.session_id))
    set_slider(page, "actor_token_budget", 256)  # below max_prompt_length + max_response_length (512)
    page.wait_for_selector(".wb-knob-actor_token_budget.wb-knob-bad", timeout=30_000)
    message = page.inner_text(".wb-knob-actor_token_budget .wb-knob-message")
    assert "actor_token_budget" in message or "512" in message, message
    assert not page.locator(".wb-apply").is_enabled()
    screenshot(page, "voila_invalid")
    page.locator(".wb-apply").click(force=True)  # even a click on the disabled button
    page.wait_for_timeout(2000)
    assert len(store_commands(up.home, up.session_id)) == before
    page.wb_guard.check()  # no widget model failed, no request left 127.0.0.1
    page.close()


def test_apply_budgets_queues_the_command_and_the_applied_event_shows(up, browser):
    page = open_dashboard(browser, up.operator_url)
    before = len(store_commands(up.home, up.session_id))
    # The recording's hot neighbour: every budget 4096 -> 32768 (a replay can apply what it recorded).
    set_budgets(page, 32768)
    try:
        wait_until(lambda: all(knob in page.inner_text(".wb-diff") for knob in BUDGETS), 120,
                   "all four budgets in the diff")
    except AssertionError as error:  # seen once at load 7: say what the page showed
        screenshot(page, "voila_budgets_not_in_diff")
        entries = {knob: page.locator(f".wb-knob-{knob} input[type=number]").input_value() for knob in BUDGETS}
        raise AssertionError(f"{error}; entries {entries}; diff: {page.inner_text('.wb-diff')!r}") from None
    apply = page.locator(".wb-apply")
    wait_until(lambda: apply.is_enabled(), 60, "Apply enabled for a valid change")
    screenshot(page, "voila_apply_pending")
    apply.click()
    commands = wait_until(lambda: c if len(c := store_commands(up.home, up.session_id)) > before else None,
                          60, "the apply command in the store")
    applied = commands[commands.kind == "apply"].iloc[-1]
    assert applied.payload["changes"] == {knob: 32768 for knob in BUDGETS}
    page.wait_for_selector(".wb-events-log:has-text('applied')", timeout=180_000)
    assert "actor_token_budget 4096 → 32768" in page.inner_text(".wb-events-log")
    screenshot(page, "voila_applied")
    page.wb_guard.check()  # no widget model failed, no request left 127.0.0.1
    page.close()


# Every WebSocket the page opens, kept where a test can close it (a dropped connection, as the page sees one).
RECORD_SOCKETS_JS = """(() => {
    const Native = window.WebSocket;
    window.wbSockets = [];
    window.WebSocket = class extends Native {
        constructor(...args) { super(...args); window.wbSockets.push(this); }
    };
})()"""
DROP_SOCKETS_JS = "() => window.wbSockets.filter(s => s.readyState === WebSocket.OPEN).map(s => s.close()).length"
OPEN_SOCKETS_JS = "() => window.wbSockets.filter(s => s.readyState === WebSocket.OPEN).length"


def test_after_a_dropped_connection_every_chart_is_drawn_and_answers_the_page(up, browser):
    page = open_dashboard(browser, up.operator_url, init_script=RECORD_SOCKETS_JS)
    guard = page.wb_guard
    try:
        assert_every_chart_drawn(page, guard, "operator, before the drop")
        sockets_before = page.evaluate("() => window.wbSockets.length")  # before the drop: it reconnects at once
        assert page.evaluate(DROP_SOCKETS_JS) >= 1, "the page had no open kernel connection to drop"
        wait_until(lambda: page.evaluate("() => window.wbSockets.length") > sockets_before
                   and page.evaluate(OPEN_SOCKETS_JS), 60, "the page connected again")
        assert_every_chart_drawn(page, guard, "operator, after the drop")
        # The kernel still hears the page and the chart still follows it (whether or not the replay still runs).
        page.locator(".wb-util-metric button", has_text="memory used").click()
        page.wait_for_selector(".wb-utilization .gtitle:has-text('memory used per GPU')", timeout=60_000)
        assert_every_chart_drawn(page, guard, "operator, a metric picked after the drop")
        screenshot(page, "voila_after_drop")
        shown = chart_drawn(page)  # what the screenshot shows: every chart still drawn, not just a moment before
        assert all(shown.get(panel, 0) > 0 for panel in CHART_PANELS), f"a chart went blank in the screenshot: {shown}"
        guard.check()  # no widget model failed, no request left 127.0.0.1
    finally:
        page.close()


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["no-token", "wrong-token"])
def test_a_viewer_sees_the_charts_but_cannot_apply(up, browser, token):
    url = up.viewer_url + (f"&token={token}" if token else "")
    page = open_dashboard(browser, url)
    wait_until(lambda: chart_points(page), 60, "a chart with points")
    assert page.locator(".wb-knob-actor_token_budget input[type=number]").is_disabled()
    assert not page.locator(".wb-apply").is_enabled()
    assert "read-only" in page.inner_text(".wb-dashboard")
    for selector in (".wb-pause", ".wb-stop"):
        assert not page.locator(selector).is_enabled()
    screenshot(page, f"voila_viewer_{'wrong_token' if token else 'no_token'}")
    before = len(store_commands(up.home, up.session_id))
    page.locator(".wb-apply").click(force=True)
    page.wait_for_timeout(1000)
    assert len(store_commands(up.home, up.session_id)) == before
    page.wb_guard.check()  # no widget model failed, no request left 127.0.0.1
    page.close()


def test_the_export_panel_shows_overrides_verl_composes(up, browser):
    from workbench.plan import Plan
    from workbench.session import Session

    page = open_dashboard(browser, up.viewer_url)
    page.wait_for_selector(".wb-export-text textarea", timeout=30_000)
    text = wait_until(lambda: page.locator(".wb-export-text textarea").input_value().strip(), 30, "exported overrides")
    overrides = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    screenshot(page, "voila_export")
    page.wb_guard.check()  # no widget model failed, no request left 127.0.0.1
    page.close()
    composed = Plan.from_verl(overrides=overrides)  # verl's own Hydra config composes them
    in_force = Session.attach(up.home / "sessions" / up.session_id, read_only=True).plan
    assert composed.knob_values() == in_force.knob_values()
