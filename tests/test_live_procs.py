"""Honest numbers (issue 15): the processes the device planner sums are those alive now, never every PID a session
ever had. Synthetic rounds (made up here), written the way the sampler writes them: one t per round."""

from __future__ import annotations

from workbench.store import Store


def sample(t: float) -> dict:
    return {"t": t, "node": "n0", "gpu": 0, "util": 50.0, "mem_used": 1000.0, "mem_total": 80000.0}


def test_only_the_newest_round_of_processes_is_alive_and_it_ends_when_sampling_goes_on_without_it(tmp_path):
    store = Store(tmp_path)
    store.add_procs([{"t": t, "node": "n0", "gpu": 0, "pid": pid, "role": "actor", "mem_used": 40000.0}
                     for t, pid in ((1.0, 101), (2.0, 101), (2.0, 102), (3.0, 102))])
    store.add_samples([sample(t / 10) for t in range(10, 31)])
    alive = store.latest_procs()
    assert alive["pid"].tolist() == [102] and alive["mem_used"].sum() == 40000.0  # not 101 of rounds before
    store.add_samples([sample(3.0 + t / 10) for t in range(1, 41)])  # 4 rounds long, no process round
    assert store.latest_procs().empty  # the run ended: nothing alive
