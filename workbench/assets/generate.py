"""Make, fully offline, a model directory and a dataset that verl's PPO trainer runs on.

- model: Qwen2ForCausalLM with random (seeded) weights, bf16 safetensors, plus a GenerationConfig.
- tokenizer: byte-level BPE trained here on generated text, saved into the model directory as a
  PreTrainedTokenizerFast with a ChatML-like chat template (eos <|im_end|>, pad <|endoftext|>).
- data: train.parquet / test.parquet of generated word problems in verl's gsm8k schema, so verl's
  built-in rule reward scores them.

The recipe of a script that real verl 0.9.1 PPO trained on (H200, "qwen2.5-0.5b" shape), except that the
tokenizer is now trained with the pre-tokeniser verl actually loads it with (see build_tokenizer).
"tiny" is the same recipe at about 1 MB.
Layout: OUT/model/, OUT/data/, and OUT/assets.json, written last, which marks the set complete.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.assets.convert import verl_row, write_parquet_atomically

MANIFEST = "assets.json"

# Qwen2Config arguments per shape. A shape without vocab_size sizes its embedding to the tokenizer
# (rounded up to a multiple of 64, as real checkpoints pad theirs) so "tiny" stays a few MB.
SHAPES: dict[str, dict[str, int]] = {
    "qwen2.5-0.5b": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
    ),
    # Qwen2.5-1.5B's dimensions (1.54B parameters with the tied embedding).
    "qwen2.5-1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2,
    ),
}
VOCAB_MULTIPLE = 64

PAD_TOKEN, CHAT_START, CHAT_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The instruction verl's gsm8k preprocessing appends, so prompts ask for the "#### N" the reward reads.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

NAMES = ["Tom", "Ana", "Li", "Sara", "Omar", "Mia", "Ken", "Zoe", "Ravi", "Ida"]
ITEMS = ["apples", "books", "coins", "pens", "cards", "stones", "cups", "shells", "tickets", "eggs"]
PROBLEMS_IN_TOKENIZER_CORPUS = 20000
FILLER_LINES_IN_TOKENIZER_CORPUS = 20000  # random words, so BPE has enough text for a few thousand merges


def make_problem(rng: random.Random) -> tuple[str, str, str]:
    """(question, answer, worked solution) of a one-step word problem."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 9)
    kind = rng.randrange(4)
    if kind == 0:
        question = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
        answer, solution = a + b, f"{a} + {b} = {a + b}"
    elif kind == 1:
        a = a + b
        question = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        answer, solution = a - b, f"{a} - {b} = {a - b}"
    elif kind == 2:
        question = f"{name} buys {c} boxes with {b} {item} in each box. How many {item} is that in total?"
        answer, solution = c * b, f"{c} * {b} = {c * b}"
    else:
        question = (
            f"{name} has {a} {item}, buys {b} more and then shares them equally among {c} friends, "
            f"keeping the rest. How many {item} does {name} keep?"
        )
        answer, solution = (a + b) % c, f"({a} + {b}) mod {c} = {(a + b) % c}"
    return question, str(answer), solution


# Where transformers defines PreTrainedTokenizerFast: 5.x, then 4.x.
TOKENIZER_MODULES = ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast")


def tokenizer_class() -> type:
    """PreTrainedTokenizerFast from the module that defines it. Through the package's lazy namespace
    (`from transformers import PreTrainedTokenizerFast`) a failure reads only "cannot import name" (as on the H200,
    2026-12-01); from the defining module the real error comes out. A version that lacks one module tries the next."""
    for name in TOKENIZER_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name != name:
                raise  # a module it needs is missing: that is the error to see
            continue
        return module.PreTrainedTokenizerFast
    raise ImportError(f"this transformers defines PreTrainedTokenizerFast in neither {' nor '.join(TOKENIZER_MODULES)}")


def build_tokenizer(model_dir: Path, rng: random.Random, vocab: int):
    # Imported here: transformers takes seconds to import and the rest of the CLI doesn't need it.
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    PreTrainedTokenizerFast = tokenizer_class()

    corpus = []
    for _ in range(PROBLEMS_IN_TOKENIZER_CORPUS):
        question, answer, solution = make_problem(rng)
        corpus.append(
            f"{CHAT_START}user\n{question} {INSTRUCTION}{CHAT_END}\n"
            f"{CHAT_START}assistant\n{solution}\n#### {answer}{CHAT_END}"
        )
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(3000)]
    for _ in range(FILLER_LINES_IN_TOKENIZER_CORPUS):
        corpus.append(" ".join(rng.choice(words) for _ in range(12)) + ".")
    bpe = Tokenizer(models.BPE())
    # The normaliser and pre-tokeniser Qwen2Tokenizer rebuilds around our vocab and merges: AutoTokenizer
    # (which verl and vLLM use) loads a model_type "qwen2" directory as Qwen2Tokenizer, so training with
    # anything else would make verl tokenise differently from tokenizer.json (e.g. "12" vs "1", "2").
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[PAD_TOKEN, CHAT_START, CHAT_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=None,
        eos_token=CHAT_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[CHAT_START, CHAT_END],
        model_max_length=32768,
        padding_side="left",  # decoder-only generation pads on the left
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    return tokenizer


def build_model(model_dir: Path, tokenizer, shape: str, device: str, seed: int) -> int:
    """Save a randomly initialised model of SHAPE and return its parameter count."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    dims = dict(SHAPES[shape])
    dims.setdefault("vocab_size", math.ceil(len(tokenizer) / VOCAB_MULTIPLE) * VOCAB_MULTIPLE)
    eos = tokenizer.convert_tokens_to_ids(CHAT_END)
    pad = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        **dims,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        hidden_act="silu",
        initializer_range=0.02,
        architectures=["Qwen2ForCausalLM"],
        dtype="bfloat16",
    )
    on_cpu = torch.device(device).type == "cpu"
    # Seed a forked RNG: the same seed gives the same weights without disturbing the caller's RNG.
    with torch.random.fork_rng(devices=[] if on_cpu else None):
        torch.manual_seed(seed)
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16).to("cpu")
    model.save_pretrained(model_dir, safe_serialization=True)
    GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad, do_sample=True).save_pretrained(model_dir)
    return sum(p.numel() for p in model.parameters())


def build_data(data_dir: Path, rng: random.Random, n_train: int, n_test: int) -> dict[str, Path]:
    paths = {}
    for split, count in (("train", n_train), ("test", n_test)):
        rows = []
        for index in range(count):
            question, answer, _ = make_problem(rng)
            extra_info = {"split": split, "index": index, "answer": f"#### {answer}", "question": question}
            rows.append(verl_row([{"role": "user", "content": f"{question} {INSTRUCTION}"}], answer, extra_info))
        paths[split] = data_dir / f"{split}.parquet"
        write_parquet_atomically(pd.DataFrame(rows), paths[split])
    return paths


def _paths(out: Path) -> dict[str, str]:
    data_dir = out / "data"
    return {
        "model_dir": str(out / "model"),
        "data_dir": str(data_dir),
        "train_path": str(data_dir / "train.parquet"),
        "test_path": str(data_dir / "test.parquet"),
    }


def _complete_manifest(out: Path, recipe: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of a finished set made from RECIPE with all its files still present, else None."""
    try:
        manifest = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("recipe") != recipe:
        return None
    if not all((out / name).is_file() for name in manifest.get("files", [])):
        return None
    return manifest


def generate_assets(
    out_dir: str | os.PathLike,
    shape: str = "tiny",
    n_train: int = 512,
    n_test: int = 64,
    vocab: int = 4096,
    device: str = "cpu",
    seed: int = 1234,
) -> dict[str, Any]:
    """Make OUT_DIR/model and OUT_DIR/data; return info (params, paths, tokenizer size, timings).

    Idempotent: when OUT_DIR already holds a complete set made from the same shape, counts, vocab and
    seed, nothing is regenerated and the info comes back with reused=True. `device` only picks where
    the weights are initialised (a GPU is faster for the big shape); files are always saved from CPU.
    """
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    if n_train < 1 or n_test < 1:
        raise ValueError(f"n_train and n_test must be at least 1, got {n_train} and {n_test}")
    out = Path(out_dir)
    recipe = {"shape": shape, "n_train": n_train, "n_test": n_test, "vocab": vocab, "seed": seed}
    manifest = _complete_manifest(out, recipe)
    if manifest is not None:
        return {**manifest["info"], **_paths(out), "reused": True}

    # Drop any old manifest first, so a run that dies half-way never leaves a set that looks complete.
    (out / MANIFEST).unlink(missing_ok=True)
    model_dir, data_dir = out / "model", out / "data"
    model_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    started = time.perf_counter()
    tokenizer = build_tokenizer(model_dir, rng, vocab)
    tokenizer_done = time.perf_counter()
    params = build_model(model_dir, tokenizer, shape, device, seed)
    model_done = time.perf_counter()
    build_data(data_dir, rng, n_train, n_test)
    finished = time.perf_counter()

    files = sorted(str(p.relative_to(out)) for d in (model_dir, data_dir) for p in d.rglob("*") if p.is_file())
    info = {
        **recipe,
        "params": params,
        "tokenizer_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "size_bytes": sum((out / name).stat().st_size for name in files),
        "t_tokenizer_s": round(tokenizer_done - started, 2),
        "t_model_s": round(model_done - tokenizer_done, 2),
        "t_data_s": round(finished - model_done, 2),
        "t_total_s": round(finished - started, 2),
    }
    manifest_tmp = out / f".{MANIFEST}.tmp"
    manifest_tmp.write_text(json.dumps({"recipe": recipe, "files": files, "info": info}, indent=2))
    os.replace(manifest_tmp, out / MANIFEST)
    return {**info, **_paths(out), "reused": False}


def generate_assets_apart(out_dir: str | os.PathLike, **recipe: Any) -> dict[str, Any]:
    """generate_assets in a process of its own; the same info back. A caller that goes on measuring keeps no CUDA
    memory from a GPU generation, and no import of transformers or torch in it races another thread's (two
    generations in one process, one per thread, failed on the H200 with "cannot import name
    'PreTrainedTokenizerFast' from 'transformers'"). Raises RuntimeError with the child's own last error lines."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    code = ("import json, sys\n"
            "from workbench.assets.generate import generate_assets\n"
            "print(json.dumps(generate_assets(sys.argv[1], **json.loads(sys.argv[2]))))\n")
    child = subprocess.run([sys.executable, "-c", code, str(out_dir), json.dumps(recipe)], env=env,
                           capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if child.returncode != 0:
        said = child.stderr.strip().splitlines()[-12:] or ["(it said nothing)"]
        raise RuntimeError(f"generating assets in {out_dir} failed (exit {child.returncode}): {said[-1]}\n"
                           + "\n".join(said[:-1]))
    return json.loads(child.stdout.strip().splitlines()[-1])
