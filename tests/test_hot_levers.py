"""Fused kernels and gradient checkpointing switched in a live worker (runner/levers.py) give what a worker built
with the new setting gives: verl 0.9.1's own model patch and its FSDP engine's forward step, on a tiny Qwen2 (CPU).

The engine is verl's FSDPEngineWithLMHead with the attributes its forward step reads (building one needs a GPU); the
worker process is verl's colocated WorkerDict as the runner meets it (worker_dict -> ActorRolloutRefWorker with its
actor and ref TrainingWorkers, and the critic's TrainingWorker). Gradient checkpointing is switched under the FSDP
wrapping verl uses (FSDP1, one rank, gloo).
"""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

import verl.workers.engine.fsdp.transformer_impl as transformer_impl
from verl.models.transformers import monkey_patch
from verl.utils import tensordict_utils as tu
from tests.plan_fixtures import runnable_plan, tiny_model  # noqa: F401 (fixtures)
from workbench.runner import levers, worker_hooks
from workbench.runner import trainer as runner_trainer

PLAIN_QWEN2_FORWARD = Qwen2ForCausalLM.forward
SEQUENCES = [(3, 11, 27, 5, 9), (8, 1, 44, 2, 90, 17, 33, 6, 61), (12, 7, 7, 100, 4, 58, 3)]
FUSED = {"fused_kernels": {"roles": ["actor", "ref"], "backend": "torch"}}
PLAIN = {"fused_kernels": {"roles": ["actor", "ref"], "backend": None}}
USED_POSITIONS = torch.tensor([i < len(s) - 1 for s in SEQUENCES for i in range(len(s))])


@pytest.fixture(autouse=True)
def verl_engine_on_cpu(monkeypatch):
    """verl's engine asks for a CUDA device id; the class-level forward patch is undone after each test."""
    monkeypatch.setattr(transformer_impl, "get_device_id", lambda: "cpu")
    monkeypatch.setattr(transformer_impl, "get_device_name", lambda: "cpu")
    worker_hooks.keep_plain_forward(monkey_patch)  # what the Ray worker hook does when verl's module is imported
    yield
    Qwen2ForCausalLM.forward = PLAIN_QWEN2_FORWARD
    levers.PLAIN_FORWARD.clear()


def tiny_config(**extra) -> Qwen2Config:
    return Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, **extra)


def tiny_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(tiny_config())


def build_as_verl(model, fused: bool, checkpointing: bool = False):
    """What verl's FSDP engine does to a model it builds (transformer_impl.py _build_module), padded path (no
    flash-attn)."""
    monkey_patch.apply_monkey_patch(model=model, use_remove_padding=False, ulysses_sp_size=1,
                                    use_fused_kernels=fused, fused_kernels_backend="torch")
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def training_worker(module, fused: bool, model_type: str = "language_model"):
    """verl's TrainingWorker as levers.py reaches it: its engine (the model it holds, what its forward step reads)
    and its engine config (the per-call default of use_fused_kernels)."""
    engine = object.__new__(transformer_impl.FSDPEngineWithLMHead)
    engine.module = module
    engine.pad_to_length, engine.use_ulysses_sp, engine.ulysses_sequence_parallel_size = False, False, 1
    engine._autocast_dtype = torch.float32
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False, use_fused_kernels=fused)
    return SimpleNamespace(engine=engine, engine_config=engine.engine_config,
                           config=SimpleNamespace(model_type=model_type))


def worker_process(actor, ref=None, critic=None):
    """verl's colocated WorkerDict: the ActorRolloutRefWorker (actor, ref) and the critic's TrainingWorker."""
    parts = {"actor_rollout_ref": SimpleNamespace(actor=actor, ref=ref)}
    if critic is not None:
        parts["critic"] = critic
    return SimpleNamespace(worker_dict=parts)


def log_probs(worker) -> torch.Tensor:
    """One forward step of verl's engine, as TrainingWorker.infer_batch runs it: use_fused_kernels from the engine
    config, everything else as the padded log-prob path sets it."""
    ids = torch.nested.as_nested_tensor([torch.tensor(s) for s in SEQUENCES], layout=torch.jagged)
    positions = torch.nested.as_nested_tensor([torch.arange(len(s)) for s in SEQUENCES], layout=torch.jagged)
    batch = tu.get_tensordict(
        tensor_dict={"input_ids": ids, "position_ids": positions},
        non_tensor_dict={"temperature": 1.0, "use_remove_padding": False, "calculate_entropy": False,
                         "use_fused_kernels": worker.engine_config.use_fused_kernels},
    )
    with torch.no_grad():
        _, output = worker.engine.forward_step(batch, loss_function=None, forward_only=True)
    return output["model_output"]["log_probs"].values()


def test_fused_kernels_switched_on_live_give_the_log_probs_of_a_worker_built_fused():
    model = tiny_lm()
    twin = copy.deepcopy(model)
    actor = training_worker(build_as_verl(model, fused=False), fused=False)
    plain = log_probs(actor)

    report = levers.put_in_force(worker_process(actor), FUSED)

    assert report["problems"] == []
    assert report["engines"]["actor"] == {"fused_backend": "torch", "use_fused_kernels": True,
                                          "gradient_checkpointing": False, "model": "Qwen2ForCausalLM"}
    live = log_probs(actor)
    fresh = log_probs(training_worker(build_as_verl(twin, fused=True), fused=True))
    assert torch.equal(live, fresh)
    # The fused kernel computes the same log-probs another way: equal up to float rounding where verl reads them. Each
    # sequence's last position predicts past its end (its label wraps differently in the two paths); verl's
    # response_from_nested leaves it out.
    assert (live - plain)[USED_POSITIONS].abs().max() < 1e-4


def test_fused_kernels_switched_off_live_give_the_plain_forward_back():
    model = tiny_lm()
    twin = copy.deepcopy(model)
    actor = training_worker(build_as_verl(model, fused=True), fused=True)
    fused = log_probs(actor)

    levers.put_in_force(worker_process(actor), PLAIN)

    assert Qwen2ForCausalLM.forward is PLAIN_QWEN2_FORWARD
    assert not actor.engine_config.use_fused_kernels and levers.fused_backend(model) is None
    assert torch.equal(log_probs(actor), log_probs(training_worker(build_as_verl(twin, fused=False), fused=False)))
    levers.put_in_force(worker_process(actor), FUSED)  # and on again, as often as the operator likes
    assert torch.equal(log_probs(actor), fused)


def test_actor_and_ref_switch_together():
    # verl patches the model class, which the actor and the reference model in one process share
    actor = training_worker(build_as_verl(tiny_lm(), fused=False), fused=False)
    ref = training_worker(build_as_verl(tiny_lm(), fused=False), fused=False)
    report = levers.put_in_force(worker_process(actor, ref), FUSED)
    assert {role: state["fused_backend"] for role, state in report["engines"].items()} == {"actor": "torch",
                                                                                           "ref": "torch"}
    assert ref.engine_config.use_fused_kernels and torch.equal(log_probs(ref), log_probs(actor))


def test_a_switch_that_cannot_be_made_live_is_refused_and_changes_nothing():
    model = tiny_lm()
    actor = training_worker(build_as_verl(model, fused=True), fused=True)
    before = log_probs(actor)
    levers.PLAIN_FORWARD.clear()  # a model fused before the worker hook could keep its plain forward

    report = levers.put_in_force(worker_process(actor), PLAIN)
    assert report["problems"] and "needs a restart" in report["problems"][0]
    bad_backend = levers.put_in_force(worker_process(actor), {"fused_kernels": {"roles": ["actor"],
                                                                              "backend": "triton"}})
    assert "triton" in bad_backend["problems"][0]
    assert actor.engine_config.use_fused_kernels and levers.fused_backend(model) == "torch"
    assert torch.equal(log_probs(actor), before)


def test_check_only_reports_and_changes_nothing():
    actor = training_worker(build_as_verl(tiny_lm(), fused=False), fused=False)
    report = levers.put_in_force(worker_process(actor), FUSED, check_only=True)
    assert report["problems"] == [] and report["engines"]["actor"]["fused_backend"] is None
    assert not actor.engine_config.use_fused_kernels


def test_the_engines_of_a_colocated_worker_process_are_found_by_role():
    actor = training_worker(build_as_verl(tiny_lm(), fused=False), fused=False)
    critic = training_worker(Qwen2ForTokenClassification(tiny_config(num_labels=1)), fused=False,
                             model_type="value_model")
    found = levers.engines(worker_process(actor, critic=critic))
    assert found == {"actor": actor, "critic": critic}


# ------------------------------------------------------------------------------ gradient checkpointing under FSDP
@pytest.fixture(scope="module")
def one_rank_process_group(tmp_path_factory):
    if not dist.is_initialized():
        store = tmp_path_factory.mktemp("dist") / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        yield
        dist.destroy_process_group()
    else:
        yield


def fsdp_wrapped(model):
    """As verl's FSDP engine wraps a model (transformer_impl.py _build_fsdp_module, strategy fsdp), on the CPU."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from verl.utils.fsdp_utils import get_fsdp_wrap_policy

    policy = get_fsdp_wrap_policy(module=model, config={"min_num_params": 0}, is_lora=False)
    return FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"), use_orig_params=False)


def train_step(wrapped) -> tuple[list[torch.Tensor], int]:
    """One forward and backward in training mode: the gradients, and how often the decoder layers started a forward
    (again in the backward pass under checkpointing, which stops recomputing early: counted where a forward starts)."""
    layers = [m for m in wrapped.modules() if type(m).__name__ == "Qwen2DecoderLayer"]
    calls = []
    hooks = [layer.register_forward_pre_hook(lambda *_: calls.append(1)) for layer in layers]
    wrapped.train()
    wrapped.zero_grad()
    ids = torch.tensor([SEQUENCES[1]])
    wrapped(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits.float().pow(2).mean().backward()
    for hook in hooks:
        hook.remove()
    return [p.grad.clone() for p in wrapped.parameters()], len(calls) // len(layers)


@pytest.mark.parametrize("built_with, switched_to", [(True, False), (False, True)])
def test_gradient_checkpointing_switched_live_under_fsdp_trains_like_a_worker_built_that_way(
        one_rank_process_group, built_with, switched_to):
    model = tiny_lm()
    twin = copy.deepcopy(model)
    live = fsdp_wrapped(build_as_verl(model, fused=False, checkpointing=built_with))
    fresh = fsdp_wrapped(build_as_verl(twin, fused=False, checkpointing=switched_to))
    actor = training_worker(live, fused=False)
    assert train_step(live)[1] == (2 if built_with else 1)

    report = levers.put_in_force(worker_process(actor), {"gradient_checkpointing": {"roles": ["actor", "critic"],
                                                                                    "on": switched_to}})

    assert report["engines"]["actor"]["gradient_checkpointing"] is switched_to
    live_grads, live_runs = train_step(live)
    fresh_grads, fresh_runs = train_step(fresh)
    assert live_runs == fresh_runs == (2 if switched_to else 1)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(live_grads, fresh_grads))


def test_the_hook_keeps_the_plain_forward_when_verl_patches_a_model():
    build_as_verl(tiny_lm(), fused=True)
    assert levers.PLAIN_FORWARD[Qwen2ForCausalLM] is PLAIN_QWEN2_FORWARD
    assert Qwen2ForCausalLM.forward is not PLAIN_QWEN2_FORWARD


# ------------------------------------------------------------------------------ through the runner's step boundary
class WorkerHandle:
    """A Ray actor handle of a worker process, run in this process: `__ray_call__.remote(fn, *args)` calls
    fn(worker, *args) (the runner's ray.get is the identity in these tests)."""

    def __init__(self, worker):
        self.__ray_call__ = SimpleNamespace(remote=lambda fn, *args: fn(worker, *args))


@pytest.fixture
def live_trainer(runnable_plan, monkeypatch):
    """The workbench trainer around a stand-in for verl's (its config is a real composed one), with one worker
    process holding a real verl engine on the tiny model, built the way the plan says (no fused kernels)."""
    from omegaconf import OmegaConf

    monkeypatch.setattr(runner_trainer.ray, "get", lambda refs: refs)

    class VerlTrainer:
        trainer_mode = "sync"

    trainer = object.__new__(runner_trainer.workbench_trainer(VerlTrainer))
    trainer.config = OmegaConf.create(OmegaConf.to_container(runnable_plan.config, resolve=False))
    actor = training_worker(build_as_verl(tiny_lm(), fused=False), fused=False)
    trainer.actor_rollout_wg = SimpleNamespace(workers=[WorkerHandle(worker_process(actor))])
    trainer._wb_step_batch = object()  # this step's batch: the probe below stands in for reading it back
    trainer._wb_probe_log_probs = lambda per_rank: log_probs(actor)[USED_POSITIONS]
    trainer.actor = actor
    return trainer


def test_the_fused_lever_goes_through_the_step_boundary_with_its_log_prob_check(tmp_path, runnable_plan, live_trainer):
    from workbench import control as c
    from workbench.boundary import StepBoundary
    from workbench.store import Store

    store = Store(tmp_path)
    boundary = StepBoundary(store, store.begin_segment(runnable_plan.to_json()), hot_apply=live_trainer._wb_hot_apply,
                            checkpoint=lambda step: "", end_run=lambda: None, token="t")
    changes = {"fused_kernels": True, "gradient_checkpointing": False}
    user = store.put_command(c.APPLY, {})
    store.put_command(c.RUNNER_HOT_APPLY, c.signed("t", c.RUNNER_HOT_APPLY, {
        "changes": changes, "plan_json": runnable_plan.with_changes(changes).to_json(), "command": user}))

    boundary(3)

    assert store.command(user)["state"] == c.APPLIED
    applied = next(e for e in store.rows("events") if e["kind"] == c.EV_APPLIED)
    assert applied["data"]["from_step"] == 4 and applied["data"]["mode"] == "hot"
    [worker] = applied["data"]["workers"]
    assert worker["engines"]["actor"]["fused_backend"] == "torch"
    assert worker["engines"]["actor"]["gradient_checkpointing"] is False
    check = applied["data"]["logprob_check"]
    # Before: verl's plain path (fp32 here: logit minus logsumexp); after: the fused one (log_softmax, then gather).
    # On the CPU in fp32 they round apart, so a check that compares the two passes sees a difference above 0. (On CUDA
    # under bf16 autocast both are one bf16 matmul and a fp32 log-softmax, and may agree to the bit.)
    assert check["tokens"] == int(USED_POSITIONS.sum()) and 0 < check["max_abs_diff"] < 1e-4
    assert "max |Δ|" in applied["text"]
    assert live_trainer._wb_live("fused_kernels") is True
    assert live_trainer.actor.engine_config.use_fused_kernels
    store.close()


def test_a_switch_under_which_log_probs_fail_is_switched_back(live_trainer):
    before = log_probs(live_trainer.actor)
    probes = iter([lambda: before, None])  # the pass under the new setting fails

    def probe(per_rank):
        result = next(probes)
        if result is None:
            raise RuntimeError("CUDA error: an illegal memory access")
        return result()

    live_trainer._wb_probe_log_probs = probe
    with pytest.raises(ValueError, match="switched back"):
        live_trainer._wb_hot_apply({"fused_kernels": True}, "{}", 3)
    assert live_trainer._wb_live("fused_kernels") is False
    assert levers.fused_backend(hf_of(live_trainer.actor)) is None
    assert not live_trainer.actor.engine_config.use_fused_kernels
    assert torch.equal(log_probs(live_trainer.actor), before)


def test_a_worker_that_refuses_leaves_the_run_as_it_was(live_trainer):
    levers.PLAIN_FORWARD.clear()
    levers.set_fused(hf_of(live_trainer.actor), "torch")  # fused before the plain forward was kept: can't go back
    live_trainer.actor.engine_config.use_fused_kernels = True
    live_trainer._wb_set_config({"fused_kernels": True})
    levers.PLAIN_FORWARD.clear()
    with pytest.raises(ValueError, match="needs a restart"):
        live_trainer._wb_hot_apply({"fused_kernels": False, "use_dynamic_bsz": True}, "{}", 3)
    assert live_trainer._wb_live("fused_kernels") is True and live_trainer._wb_live("use_dynamic_bsz") is False


def hf_of(training_worker_):
    return levers.hf_model(training_worker_.engine.module)


def test_each_call_gets_every_batching_setting_in_force(live_trainer):
    class Batch:
        def __init__(self):
            self.extra_info = {}

    batch = Batch()  # one batch through the step's calls: what one call sets stays in its extra_info
    live_trainer._wb_call_settings(batch, "_compute_old_log_prob")
    assert batch.extra_info["use_dynamic_bsz"] is False and batch.extra_info["micro_batch_size_per_gpu"] == 2
    live_trainer._wb_call_settings(batch, "_compute_values")
    # verl 0.9.1's V1 critic packs by tokens whatever the plan says: the actor call's False must not reach it, nor
    # the log-prob call's budget: the plan sets no critic budget, and verl's CriticConfig default is 32 768
    assert batch.extra_info["use_dynamic_bsz"] is True
    assert batch.extra_info["max_token_len_per_gpu"] == live_trainer._wb_live("critic_token_budget") == 32768

    live_trainer._wb_hot_apply({"use_dynamic_bsz": True, "actor_token_budget": 6000}, "{}", 3)
    live_trainer._wb_call_settings(batch, "_update_actor")
    assert batch.extra_info["use_dynamic_bsz"] is True and batch.extra_info["max_token_len_per_gpu"] == 6000
    live_trainer._wb_hot_apply({"use_dynamic_bsz": False, "actor_micro_batch": 1}, "{}", 4)
    live_trainer._wb_call_settings(batch, "_update_actor")
    assert batch.extra_info["use_dynamic_bsz"] is False and batch.extra_info["micro_batch_size_per_gpu"] == 1


def test_the_probe_takes_whole_micro_batches_before_and_after(live_trainer):
    """Without dynamic batching verl asserts a rank's share divides into micro batches of exactly the micro-batch
    size (workers/engine/utils.py prepare_micro_batches): the probe's share is a multiple of both passes' sizes."""
    def per_rank(changes):
        probe, why_not = live_trainer._wb_logprob_probe(changes)
        return probe.args[0] if probe else why_not

    assert live_trainer._wb_live("logprob_micro_batch") == 2
    assert per_rank({"fused_kernels": True}) == 4
    assert per_rank({"logprob_micro_batch": 3}) == 12
    assert per_rank({"use_dynamic_bsz": True, "logprob_token_budget": 8192}) == 4
    assert per_rank({"gradient_checkpointing": False}) == {}  # log-probs don't move: nothing to check
    live_trainer.trainer_mode = "colocate_async"
    assert "generation runs during the step boundary" in per_rank({"fused_kernels": True})["skipped"]


class TransferQueueStandIn:
    """transfer_queue as verl 0.9.1 meets it, row by row: fields per (partition, key); a put adds or overwrites a key's
    fields (TransferQueue 0.1.10 and 0.1.11's SimpleStorageUnit.put_data); a read returns the fields asked for (every
    field of the keys with None) as jagged nested tensors and fails on a field a key lacks; a clear drops the keys."""

    def __init__(self):
        import dataclasses

        @dataclasses.dataclass
        class KVBatchMeta:  # transfer_queue's, field for field
            keys: list = dataclasses.field(default_factory=list)
            tags: list = dataclasses.field(default_factory=list)
            partition_id: str | None = None
            fields: list | None = None
            extra_info: dict = dataclasses.field(default_factory=dict)

        self.KVBatchMeta = KVBatchMeta
        self.rows: dict[tuple[str, str], dict[str, torch.Tensor]] = {}

    def kv_batch_put(self, keys, partition_id, fields, tags=None):
        for name in fields.keys():
            for key, row in zip(keys, fields[name].unbind(), strict=True):
                self.rows.setdefault((partition_id, key), {})[name] = row

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        names = select_fields or sorted(self.rows[(partition_id, keys[0])])
        missing = [(key, name) for key in keys for name in names if name not in self.rows[(partition_id, key)]]
        if missing:
            raise ValueError(f"fields never written: {missing}")
        return tu.get_tensordict({name: torch.nested.as_nested_tensor(
            [self.rows[(partition_id, key)][name] for key in keys], layout=torch.jagged) for name in names})

    def kv_clear(self, keys, partition_id):
        for key in keys:
            self.rows.pop((partition_id, key), None)

    def module(self):
        import types

        module = types.ModuleType("transfer_queue")
        for name in ("KVBatchMeta", "kv_batch_get", "kv_batch_put", "kv_clear"):
            setattr(module, name, getattr(self, name))
        return module


PROMPT, RESPONSES = 3, [2, 4, 1, 3]  # four sequences: 3 prompt tokens, then responses of these lengths
STEP_KEYS = ["a", "b", "c", "d"]


def computed_log_probs(call: int, sequence: int) -> torch.Tensor:
    """What log-prob call `call` computes for a sequence: position t holds t + 10 sequence + 1000 call."""
    return torch.arange(PROMPT + RESPONSES[sequence], dtype=torch.float32) + 10 * sequence + 1000 * call


def response_log_probs(call: int, sequences=range(len(RESPONSES))) -> torch.Tensor:
    """The response tokens' log-probs the probe reads back from that call: log_probs[t] scores token t+1, so a response
    of n tokens after 3 prompt tokens is positions 2 .. 2+n-1 (verl's response_from_nested)."""
    return torch.cat([torch.arange(PROMPT - 1, PROMPT - 1 + RESPONSES[i], dtype=torch.float32) + 10 * i + 1000 * call
                      for i in sequences])


def step_rows() -> dict[str, list[torch.Tensor]]:
    """This step's rows as verl leaves them in the queue: inputs (input_ids: the sequence's index, repeated) and the
    step's own log_probs (its old_log_prob pass: call -1)."""
    return {"input_ids": [torch.full((PROMPT + n,), i) for i, n in enumerate(RESPONSES)],
            "response_mask": [torch.ones(n, dtype=torch.int64) for n in RESPONSES],
            "log_probs": [computed_log_probs(-1, i) for i in range(len(RESPONSES))]}


@pytest.fixture
def queued_step(live_trainer, monkeypatch):
    """The runner's probe against the stand-in queue holding this step's rows, two data-parallel ranks."""
    queue = TransferQueueStandIn()
    queue.kv_batch_put(STEP_KEYS, "train", tu.get_tensordict({
        name: torch.nested.as_nested_tensor(rows, layout=torch.jagged) for name, rows in step_rows().items()}))
    monkeypatch.setitem(sys.modules, "transfer_queue", queue.module())
    live_trainer._wb_step_batch = queue.KVBatchMeta(keys=STEP_KEYS, tags=[{}] * 4, partition_id="train")
    live_trainer.actor_rollout_wg._dispatch_info = {"actor": [0, 1]}
    live_trainer.config.actor_rollout_ref.rollout.temperature = 1.0
    del live_trainer._wb_probe_log_probs  # the real one, not the fixture's stand-in
    return queue


def test_the_probe_reads_back_what_each_log_prob_call_computed(live_trainer, queued_step):
    """verl's compute_log_prob reads the fields of the keys it is handed and writes its log_probs under them
    (tqbridge). The probe hands it the first sequences of each rank's share, copied to rows of its own (a partition
    verl's sampler never reads, fresh keys per call) with the log-prob call's settings, and reads back the response
    tokens' log-probs of THAT call: never the step's, never the previous call's; the step's rows stay as they were."""
    queue, asked, seen = queued_step, [], []

    def compute_log_prob(probe):
        asked.append(probe)
        rows = queue.kv_batch_get(probe.keys, probe.partition_id)
        seen.append(sorted(rows.keys()))
        computed = [computed_log_probs(len(asked), int(ids[0])) for ids in rows["input_ids"].unbind()]
        queue.kv_batch_put(probe.keys, probe.partition_id, tu.get_tensordict(
            {"log_probs": torch.nested.as_nested_tensor(computed, layout=torch.jagged)}))
        return queue.KVBatchMeta(keys=probe.keys, partition_id=probe.partition_id, fields=["log_probs"])

    live_trainer.actor_rollout_wg.compute_log_prob = compute_log_prob
    before_rows = {key: dict(row) for key, row in queue.rows.items()}

    first, second = live_trainer._wb_probe_log_probs(2), live_trainer._wb_probe_log_probs(2)

    assert torch.equal(first, response_log_probs(1)) and torch.equal(second, response_log_probs(2))
    assert seen == [["input_ids", "response_mask"]] * 2  # the step's inputs, none of its log_probs
    probe = asked[0]
    assert probe.partition_id == runner_trainer.PROBE_PARTITION != "train" and len(probe.keys) == 4
    assert not set(asked[0].keys) & set(asked[1].keys) and not set(probe.keys) & set(STEP_KEYS)
    assert probe.extra_info["use_dynamic_bsz"] is False and probe.extra_info["micro_batch_size_per_gpu"] == 2
    assert probe.extra_info["compute_loss"] is False and probe.extra_info["temperature"] == 1.0
    assert queue.rows.keys() == before_rows.keys()  # the probe's rows are gone, the step's untouched
    assert all(torch.equal(queue.rows[key]["log_probs"], row["log_probs"]) for key, row in before_rows.items())
    with pytest.raises(ValueError, match="the probe needs 4 for each of 2 ranks"):
        live_trainer._wb_probe_log_probs(4)


def test_a_log_prob_call_that_writes_nothing_back_is_never_read_as_its_result(live_trainer, queued_step):
    """The step's own log_probs lie in the queue under its keys. A call that writes none back (a rank that does not
    collect, a put that did not land) must fail the pass, never hand back values it did not compute: read from the
    step's rows, before and after a switch they are the same, a max |Δ| of 0 that measured nothing."""
    queue = queued_step
    live_trainer.actor_rollout_wg.compute_log_prob = lambda probe: queue.KVBatchMeta(
        keys=probe.keys, partition_id=probe.partition_id)

    with pytest.raises(ValueError, match="the log-prob pass wrote no log-probs back"):
        live_trainer._wb_probe_log_probs(2)
    assert {key for _, key in queue.rows} == set(STEP_KEYS)  # its own rows cleared all the same


@pytest.mark.slow
def test_the_probe_reads_each_calls_log_probs_through_a_real_transfer_queue(live_trainer, monkeypatch):
    """The same through transfer_queue itself (a GPU-side package: skipped where it is not installed) and verl's own
    TransferQueue bridge: the probe's KVBatchMeta goes through verl's dispatch (BatchData.chunk turns it into the
    queue's BatchMeta) to a compute_log_prob wrapped as verl's workers are (tqbridge: read the keys' fields, compute,
    put the output); the probe's read after each call returns that call's log-probs, and its rows are gone after."""
    tq = pytest.importorskip("transfer_queue")
    import ray

    from verl.protocol import BatchData
    from verl.utils.transferqueue_utils import tqbridge

    monkeypatch.setattr(ray, "get", ray._private.worker.get)  # the fixture's stand-in for the trainer's calls
    ray.init(num_cpus=16, include_dashboard=False)  # the queue's actors ask for CPUs
    try:
        tq.init()
        tq.kv_batch_put(keys=STEP_KEYS, partition_id="train", fields=tu.get_tensordict({
            name: torch.nested.as_nested_tensor(rows, layout=torch.jagged) for name, rows in step_rows().items()}))
        calls = []

        @tqbridge()
        def worker_compute_log_prob(data):
            calls.append(sorted(data.keys()))
            return tu.get_tensordict({"log_probs": torch.nested.as_nested_tensor(
                [computed_log_probs(len(calls), int(ids[0])) for ids in data["input_ids"].unbind()],
                layout=torch.jagged)})

        def compute_log_prob(probe):  # one data-parallel rank: verl's dispatch and collect around the worker
            return BatchData([worker_compute_log_prob(chunk) for chunk in BatchData(probe).chunk(1)]).concat()

        live_trainer._wb_step_batch = tq.KVBatchMeta(keys=STEP_KEYS, tags=[{}] * 4, partition_id="train")
        live_trainer.actor_rollout_wg._dispatch_info = {"actor": [0]}
        live_trainer.actor_rollout_wg.compute_log_prob = compute_log_prob
        live_trainer.config.actor_rollout_ref.rollout.temperature = 1.0
        del live_trainer._wb_probe_log_probs

        for call in (1, 2):
            got = live_trainer._wb_probe_log_probs(4)
            assert torch.equal(got, response_log_probs(call)), f"call {call} read {got.tolist()}"
        assert [("log_probs" in fields) for fields in calls] == [False, False]
        step = tq.kv_batch_get(keys=STEP_KEYS, partition_id="train", select_fields=["log_probs"])["log_probs"]
        assert all(torch.equal(row, computed_log_probs(-1, i)) for i, row in enumerate(step.unbind()))
        assert not tq.kv_list(runner_trainer.PROBE_PARTITION).get(runner_trainer.PROBE_PARTITION)
    finally:
        ray.shutdown()
