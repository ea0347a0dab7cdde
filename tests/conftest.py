"""Shared fixtures: a recorded session to replay (tests/replay_fixture.py) and a private workbench home; the test
lanes (README "Tests"): a bench test runs scripts in processes of their own, so it counts as slow too."""

from __future__ import annotations

import pytest

from tests.plan_fixtures import tiny_model  # noqa: F401 (fixture: the model the recorded plans point at)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("bench") or item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.slow)
    # Modules that start processes or a browser first: in CI's workers (-n 3, a module per worker at a time) the long
    # ones then run side by side from the start and the quick modules fill the end, instead of a long module
    # starting last. A stable sort: each module's tests keep their order.
    long_modules = {item.nodeid.split("::")[0] for item in items
                    if item.get_closest_marker("slow") or item.get_closest_marker("browser")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in long_modules)


@pytest.fixture(scope="session")
def recording(tmp_path_factory, tiny_model):  # noqa: F811
    """The assembled recording: segments A, B (tuned: a restart away) and A_hot (a hot change away)."""
    from tests.replay_fixture import build_recording

    return build_recording(tmp_path_factory.mktemp("recordings") / "h200-quickstart-vs-tuned", tiny_model)


@pytest.fixture(scope="session")
def recorded_plans(tiny_model):  # noqa: F811
    """The plans of the recording's segments: "A", "B" and "A_hot"."""
    from tests.replay_fixture import plans

    return plans(tiny_model)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private VERL_WORKBENCH_HOME: sessions (and the supervisors they spawn) stay under tmp_path. Supervisors
    still running afterwards (a test that failed half-way; a failed session waits for a rollback) are ended."""
    from workbench.paths import sessions_root
    from workbench.procs import kill_tree, process_alive
    from workbench.store import STORE_FILE, Store

    monkeypatch.setenv("VERL_WORKBENCH_HOME", str(tmp_path))
    yield tmp_path
    for store_path in sessions_root().glob(f"*/{STORE_FILE}"):
        store = Store(store_path, readonly=True)
        pid = store.meta().get("supervisor_pid")
        store.close()
        if pid is not None and process_alive(int(pid)):
            kill_tree(int(pid), grace_s=5)
