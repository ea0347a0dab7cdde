"""Shared fixtures for the plan tests: a tiny local model and a plan that passes every check.

verl's `validate_config` instantiates the critic's HFModelConfig, which loads a tokenizer and an HF config from
`critic.model.path`. Tests run offline, so they point the models at a tiny Qwen2 config + word-level tokenizer
written here (no weights: validation never loads them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.plan import Plan


def write_tiny_model(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config

    vocabulary = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{str(digit): digit + 3 for digit in range(10)}}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>",
                            unk_token="<unk>").save_pretrained(directory)
    Qwen2Config(vocab_size=len(vocabulary), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1,
                architectures=["Qwen2ForCausalLM"]).save_pretrained(directory)
    return directory


def runnable_overrides(model: Path) -> list[str]:
    """A small one-GPU PPO setup that passes the workbench's and verl's validation."""
    return [
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=1",
    ]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def default_plan() -> Plan:
    return Plan.from_verl([])


@pytest.fixture(scope="session")
def runnable_plan(tiny_model) -> Plan:
    return Plan.from_verl(runnable_overrides(tiny_model))
