"""The notebooks run top to bottom in a real Jupyter kernel against replays of the bundled H200 recordings (no GPU),
and say what they are there to say: each tutorial's figures come from the session it replays."""

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# What each tutorial must print (its figures computed from the replay, so these are words around numbers).
SAYS = {
    "00_quickstart.ipynb": ["a step takes", "generation", "tokens/s per GPU", "timing_s/gen (s) of every step",
                            "actor_rollout_ref"],
    "01_device_placement.ipynb": ["'gpus': [0]", "SM active", "of samples saw the GPU idle", "critic_gpus"],
    "02_token_budgets.ipynb": ["actor_token_budget 4096 → 32768", "sequences per micro batch", "throughput +",
                               "actor_token_budget"],
    "03_lora_critic.ipynb": ["GB less", "update_critic", "critic weights and optimizer state start afresh"],
    "04_async_switching.ipynb": ["colocate_async", "found their rollouts ready", "restart_pending", "the switch cost"],
}


def run(path: Path, cwd: Path) -> nbformat.NotebookNode:
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, "\n".join("\n".join(e.get("traceback", [])) for e in errors)
    return notebook


def text_of(notebook: nbformat.NotebookNode) -> str:
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    return "\n".join(str(o.get("data", {}).get("text/plain", "")) + str(o.get("data", {}).get("text/html", ""))
                     + o.get("text", "") for o in outputs)


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted([*SAYS, "dashboard.ipynb"])


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SAYS))
def test_tutorial_runs_and_explains_with_the_sessions_numbers(name, home):
    text = text_of(run(NOTEBOOKS / name, home))
    missing = [words for words in SAYS[name] if words not in text]
    assert not missing, f"{name} did not say {missing}:\n{text[-3000:]}"


@pytest.mark.slow
def test_dashboard_notebook_shows_the_session_named_in_the_page_url(home, monkeypatch):
    from workbench.session import Session

    session = Session.replay("h200-lora-critic-sync", speed=100, follow=False)
    try:
        monkeypatch.setenv("QUERY_STRING", f"session={session.id}")  # what Voila gives the page's kernel
        notebook = run(NOTEBOOKS / "dashboard.ipynb", home)
        views = [o for cell in notebook.cells for o in cell.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
        assert len(views) == 1 and json.dumps(views[0]["data"][WIDGET_VIEW])
    finally:
        session.stop(now=True)
