"""verl 0.9.1's own V1 ReplayBuffer.sample, run on the CPU against a fake TransferQueue and a virtual clock: with
verl's 2 s poll a batch finished at 0.3 s is seen at 2 s; with the runner's poll it is seen at once.

TransferQueue (a Ray-backed store) is not installed on the CPU test machine; the fake below is a stand-in for
`tq.kv_list` / `tq.kv_clear` / `KVBatchMeta` only, and says so. Nothing else of verl's code is replaced."""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

from workbench.runner import replay_buffer as poll

BATCH = 4
FINISHED_AT_S = 0.3


class VirtualClock:
    """time.time / time.sleep of verl's replay-buffer module: sleeping advances the clock, nothing waits."""

    def __init__(self):
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeTransferQueue(types.ModuleType):
    """FAKE TransferQueue: BATCH prompts, each with one trajectory, running until the clock passes FINISHED_AT_S."""

    def __init__(self, clock: VirtualClock):
        super().__init__("transfer_queue")
        self.clock = clock
        self.listings = 0

        @dataclass
        class KVBatchMeta:
            partition_id: str
            keys: list
            tags: list

        self.KVBatchMeta = KVBatchMeta

    def kv_list(self):
        self.listings += 1
        status = "finished" if self.clock.now >= FINISHED_AT_S else "running"
        items = {}
        for i in range(BATCH):
            items[f"u{i}"] = {"is_prompt": True, "status": status, "global_steps": 1}
            items[f"u{i}_0_0"] = {"status": status}
        return {"train": items}

    def kv_clear(self, partition_id, keys):
        pass


@pytest.fixture
def verl_replay_buffer(monkeypatch):
    """verl's ReplayBuffer module imported over the fake TransferQueue, its clock virtual."""
    clock = VirtualClock()
    fake = FakeTransferQueue(clock)
    monkeypatch.setitem(sys.modules, "transfer_queue", fake)
    # verl's file itself, loaded alone: its package __init__ imports the whole V1 trainer (Ray, vLLM clients).
    source = Path(verl.__file__).parent / "trainer" / "ppo" / "v1" / "replay_buffer.py"
    spec = importlib.util.spec_from_file_location("verl_v1_replay_buffer_under_test", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "time", clock)
    monkeypatch.setattr(module, "tq", fake)
    return module, clock, fake


def sync_buffer(module):
    """Built as verl 0.9.1's trainer_base._build_replay_buffer builds it for sync mode (no poll_interval given)."""
    return module.ReplayBuffer(
        trainer_mode="sync", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
        max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create({}), refill_fn=lambda n: None,
        train_batch_size=BATCH, gen_batch_size=BATCH,
    )


def test_verl_default_poll_sees_the_batch_on_the_2_s_grid(verl_replay_buffer):
    module, clock, _ = verl_replay_buffer
    buffer = sync_buffer(module)
    assert buffer.poll_interval == 2.0
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    assert len(batch.keys) == BATCH
    assert clock.now == 2.0  # finished at 0.3 s, seen 1.7 s later


def test_runner_poll_sees_the_batch_within_one_short_interval(verl_replay_buffer):
    module, clock, fake = verl_replay_buffer
    buffer = poll.shorten_poll(sync_buffer(module), "sync")
    assert buffer.poll_interval == poll.REPLAY_POLL_S
    batch, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=BATCH)
    assert len(batch.keys) == BATCH
    assert FINISHED_AT_S <= clock.now < FINISHED_AT_S + poll.REPLAY_POLL_S + 1e-9
    assert fake.listings == pytest.approx(FINISHED_AT_S / poll.REPLAY_POLL_S + 1, abs=1)


def test_async_buffer_of_colocate_async_is_shortened_too(verl_replay_buffer):
    module, clock, _ = verl_replay_buffer
    buffer = module.ReplayBufferAsync(
        trainer_mode="colocate_async", trainer_config=OmegaConf.create({}), max_off_policy_threshold=None,
        max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create({}), refill_fn=lambda n: None,
    )
    poll.shorten_poll(buffer, "colocate_async").sample(global_steps=1, partition_id="train", batch_size=BATCH)
    assert clock.now < FINISHED_AT_S + poll.REPLAY_POLL_S + 1e-9


def test_separate_async_keeps_verls_interval():
    buffer = types.SimpleNamespace(poll_interval=2.0)
    assert poll.shorten_poll(buffer, "separate_async").poll_interval == 2.0


def test_environment_sets_the_interval_and_bad_values_are_refused(monkeypatch):
    monkeypatch.setenv(poll.POLL_ENV, "2.0")
    assert poll.shorten_poll(types.SimpleNamespace(poll_interval=2.0), "sync").poll_interval == 2.0
    for bad in ("0", "-1", "fast"):
        monkeypatch.setenv(poll.POLL_ENV, bad)
        with pytest.raises(ValueError, match=poll.POLL_ENV):
            poll.poll_interval_s()


def test_trainer_mixin_builds_every_replay_buffer_with_the_short_poll():
    from workbench.runner.trainer import workbench_trainer

    class VerlTrainer:  # stands in for verl's PPOTrainer: only the method the mixin overrides
        trainer_mode = "sync"

        def _build_replay_buffer(self):
            return types.SimpleNamespace(poll_interval=2.0)

    trainer = object.__new__(workbench_trainer(VerlTrainer))
    assert trainer._build_replay_buffer().poll_interval == poll.REPLAY_POLL_S
