import argparse
import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.gsm8k_rule import gsm8k_strict_score
from workbench.assets import generate_assets
from workbench.assets.generate import INSTRUCTION
from workbench.cli.data import add_data_commands


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """One tiny asset set for the whole module: generating takes a few seconds."""
    out = tmp_path_factory.mktemp("assets")
    return out, generate_assets(out, shape="tiny")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_info_describes_a_small_fresh_set(tiny):
    out, info = tiny
    assert info["reused"] is False
    assert info["shape"] == "tiny"
    assert info["tokenizer_size"] == 4096
    assert 100_000 < info["params"] < 1_000_000
    assert info["size_bytes"] < 5_000_000
    assert info["model_dir"] == str(out / "model")
    assert Path(info["train_path"]).is_file() and Path(info["test_path"]).is_file()
    manifest = json.loads((out / "assets.json").read_text())
    assert manifest["recipe"]["shape"] == "tiny"
    assert "model/model.safetensors" in manifest["files"]


def test_model_loads_and_runs_a_forward_pass(tiny):
    _, info = tiny
    model = AutoModelForCausalLM.from_pretrained(info["model_dir"])
    tokenizer = AutoTokenizer.from_pretrained(info["model_dir"])
    config = model.config
    assert config.model_type == "qwen2" and config.tie_word_embeddings
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (64, 2, 4)
    # The embedding covers the tokenizer, padded to a multiple of 64.
    assert config.vocab_size % 64 == 0 and config.vocab_size >= len(tokenizer)
    assert (config.eos_token_id, config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)

    ids = tokenizer("Tom has 3 apples.", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size)
    assert torch.isfinite(logits.float()).all()


def test_chat_template_renders_a_prompt(tiny):
    _, info = tiny
    tokenizer = AutoTokenizer.from_pretrained(info["model_dir"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.padding_side) == ("<|im_end|>", "<|endoftext|>", "left")
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text  # byte-level BPE round-trips
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_autotokenizer_matches_the_trained_tokenizer(tiny):
    """verl loads the directory with AutoTokenizer (a Qwen2Tokenizer); it must split text as trained."""
    _, info = tiny
    tokenizer = AutoTokenizer.from_pretrained(info["model_dir"])
    trained = Tokenizer.from_file(str(Path(info["model_dir"]) / "tokenizer.json"))
    text = "<|im_start|>user\nOmar has 1,234 cups and  buys 56 more.<|im_end|>\n<|im_start|>assistant\n#### 1290"
    assert tokenizer(text).input_ids == trained.encode(text).ids


def test_parquet_has_verl_gsm8k_columns(tiny):
    _, info = tiny
    for path, count in ((info["train_path"], 512), (info["test_path"], 64)):
        frame = pd.read_parquet(path)
        assert list(frame.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
        assert len(frame) == count
        assert set(frame.data_source) == {"openai/gsm8k"}
        first_prompt = list(frame.prompt[0])
        assert len(first_prompt) == 1 and first_prompt[0]["role"] == "user"
        assert first_prompt[0]["content"].endswith(INSTRUCTION)
        assert {r["style"] for r in frame.reward_model} == {"rule"}


def test_ground_truth_is_what_verls_rule_reads(tiny):
    _, info = tiny
    frame = pd.read_parquet(info["train_path"])
    for reward, extra in zip(frame.reward_model, frame.extra_info):
        truth = reward["ground_truth"]
        assert gsm8k_strict_score(f"some working\n{extra['answer']}", truth) == 1.0
        assert gsm8k_strict_score(f"#### {int(truth) + 1}", truth) == 0.0


def test_second_call_reuses_the_set(tiny):
    out, info = tiny
    weights = out / "model" / "model.safetensors"
    written_at = weights.stat().st_mtime_ns
    again = generate_assets(out, shape="tiny")
    assert again["reused"] is True
    assert {k: v for k, v in again.items() if k != "reused"} == {k: v for k, v in info.items() if k != "reused"}
    assert weights.stat().st_mtime_ns == written_at


def test_incomplete_set_is_regenerated_identically(tiny, tmp_path):
    out, _ = tiny
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "data" / "test.parquet").unlink()
    info = generate_assets(copy, shape="tiny")
    assert info["reused"] is False
    # Same seed, same bytes: weights, tokenizer and data are deterministic.
    for name in ("model/model.safetensors", "model/tokenizer.json", "data/train.parquet", "data/test.parquet"):
        assert _digest(copy / name) == _digest(out / name), name


def test_unknown_shape_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown shape"):
        generate_assets(tmp_path, shape="huge")


def test_cli_generate_reports_the_reused_set(tiny, capsys):
    out, info = tiny
    parser = argparse.ArgumentParser(prog="verl-workbench")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["data", "generate", str(out), "--shape", "tiny"])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert "already there, reused" in printed and info["train_path"] in printed


def test_the_1_5b_shape_has_qwen2_5_1_5b_parameter_count():
    """Counted on the meta device (no weights): Qwen2.5-1.5B has 1.54B parameters with its tied embedding."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from workbench.assets.generate import SHAPES

    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPES["qwen2.5-1.5b"], tie_word_embeddings=True))
    assert 1.50e9 < sum(p.numel() for p in model.parameters()) < 1.56e9


def test_the_tokenizer_class_comes_from_where_transformers_defines_it():
    """transformers 5.x defines PreTrainedTokenizerFast in tokenization_utils_tokenizers (4.x:
    tokenization_utils_fast); the package's lazy namespace is not asked."""
    import transformers.tokenization_utils_tokenizers as defining

    from workbench.assets.generate import tokenizer_class

    assert tokenizer_class() is defining.PreTrainedTokenizerFast


def test_a_tokenizer_class_that_cannot_import_says_the_real_error(monkeypatch):
    import sys
    import types

    from workbench.assets.generate import tokenizer_class

    broken = types.ModuleType("transformers.tokenization_utils_tokenizers")

    def fail(name):
        raise ImportError("libtokenizers: undefined symbol tk_bpe_train")  # the real cause, as a broken build says it

    broken.__getattr__ = fail
    monkeypatch.setitem(sys.modules, "transformers.tokenization_utils_tokenizers", broken)
    with pytest.raises(ImportError, match="undefined symbol tk_bpe_train"):
        tokenizer_class()
    # transformers 4.x: no tokenization_utils_tokenizers; the class comes from tokenization_utils_fast
    monkeypatch.setitem(sys.modules, "transformers.tokenization_utils_tokenizers", None)
    fast = types.ModuleType("transformers.tokenization_utils_fast")
    fast.PreTrainedTokenizerFast = object
    monkeypatch.setitem(sys.modules, "transformers.tokenization_utils_fast", fast)
    assert tokenizer_class() is object
    monkeypatch.setitem(sys.modules, "transformers.tokenization_utils_fast", None)
    with pytest.raises(ImportError, match="defines PreTrainedTokenizerFast in neither"):
        tokenizer_class()


@pytest.mark.slow
def test_assets_generated_apart_match_and_a_failure_says_why(tiny, tmp_path):
    """generate_assets in a process of its own (the campaign's way: a GPU generation there keeps no CUDA memory in
    the caller, and no import of transformers races another thread's): the same set and info, reused when there;
    a failure raises with the child's own error."""
    from workbench.assets.generate import generate_assets_apart

    out, info = tiny
    again = generate_assets_apart(out, shape="tiny")
    assert again == {**info, "reused": True}
    fresh = generate_assets_apart(tmp_path / "fresh", shape="tiny")
    assert fresh["reused"] is False and fresh["params"] == info["params"]
    for name in ("model/model.safetensors", "model/tokenizer.json", "data/train.parquet"):
        assert _digest(tmp_path / "fresh" / name) == _digest(out / name), name
    with pytest.raises(RuntimeError, match=r"generating assets in .*bad failed \(exit 1\): .*unknown shape 'huge'"):
        generate_assets_apart(tmp_path / "bad", shape="huge")
