"""The runner-side fixes for verl 0.9.1's LoRA critic and missing flash-attn, on a tiny random value model (CPU).

The GPU proof (bench/gpu/session_proof.py) shows the same code training a LoRA critic inside real verl on an H200.
"""

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, PeftModelForTokenClassification, TaskType, get_peft_model
from transformers import Qwen2Config, Qwen2ForTokenClassification

from workbench.runner import worker_hooks


def tiny_value_model() -> Qwen2ForTokenClassification:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_labels=1,
    )
    return Qwen2ForTokenClassification(config)


def lora_settings(rank=4, alpha=8, targets="all-linear"):
    return SimpleNamespace(lora_rank=rank, lora_alpha=alpha, target_modules=targets, exclude_modules=None)


def test_verl_way_of_applying_peft_to_the_critic_fails_as_on_the_h200():
    # What verl 0.9.1's FSDP engine does for a critic: PEFT as CAUSAL_LM on a token-classification model.
    with pytest.raises(AttributeError, match="prepare_inputs_for_generation"):
        get_peft_model(tiny_value_model(), LoraConfig(task_type=TaskType.CAUSAL_LM, r=4, lora_alpha=8, target_modules="all-linear"))


def test_value_lora_trains_adapters_and_the_head_only():
    model = worker_hooks.build_value_lora(tiny_value_model(), lora_settings())
    assert isinstance(model, PeftModelForTokenClassification)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "score" in n for n in trainable)
    assert any("score" in n for n in trainable), "the value head must be trainable"
    frozen_base = [n for n, p in model.named_parameters() if not p.requires_grad and "lora_" not in n]
    assert frozen_base

    ids = torch.randint(0, 128, (2, 7))
    values = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert values.shape == (2, 7, 1)
    loss = (values.squeeze(-1) - 1.0).pow(2).mean()
    loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert any("lora_" in n for n in grads) and any("score" in n for n in grads)


def test_value_lora_loss_falls_with_a_few_steps():
    model = worker_hooks.build_value_lora(tiny_value_model(), lora_settings(rank=8, alpha=16))
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 128, (4, 9))
    target = torch.linspace(-1, 1, 9).expand(4, 9)
    losses = []
    for _ in range(20):
        values = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.squeeze(-1)
        loss = (values - target).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_value_lora_refuses_a_model_without_a_value_head():
    with pytest.raises(ValueError, match="no value head"):
        worker_hooks.build_value_lora(torch.nn.Linear(2, 2), lora_settings())


@pytest.mark.slow
def test_setup_patches_verl_modules_when_they_are_imported_later():
    # A fresh interpreter, as in a Ray worker: the hook runs first, verl is imported afterwards.
    code = textwrap.dedent(
        """
        from workbench.runner import worker_hooks
        worker_hooks.setup()
        worker_hooks.setup()  # idempotent
        import verl.workers.engine.fsdp.transformer_impl as impl
        import verl.utils.model  # noqa: F401
        import verl.models.transformers.monkey_patch as monkey_patch
        from transformers import AutoModelForTokenClassification
        assert monkey_patch.patch_forward_with_backends._workbench_keeps_plain_forward
        assert impl.FSDPEngineWithValueHead._workbench_value_lora
        assert impl.FSDPEngineWithValueHead._build_lora_module is not impl.FSDPEngineWithLMHead._build_lora_module
        assert worker_hooks.flash_attn_available() or AutoModelForTokenClassification._workbench_sdpa
        print("patched")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "patched" in out.stdout


def test_critic_loader_keyword_is_rewritten_without_flash_attn(monkeypatch, tmp_path):
    if worker_hooks.flash_attn_available():
        pytest.skip("flash-attn is installed here: nothing to rewrite")
    model = tiny_value_model()
    model.save_pretrained(tmp_path)
    from transformers import AutoModelForTokenClassification

    worker_hooks.patch_critic_attention(None)
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path, attn_implementation="flash_attention_2")
    assert loaded.config._attn_implementation == "sdpa"
