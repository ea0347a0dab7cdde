"""`verl-workbench data ...`: convert a JSONL dataset to verl parquet, or generate offline assets."""

from __future__ import annotations

import argparse
import sys

from workbench.assets.convert import GSM8K_DATA_SOURCE, ConvertError, convert_jsonl
from workbench.assets.generate import SHAPES, generate_assets
from . import described

from .args import positive_int, torch_device


def add_data_commands(subparsers) -> None:
    data = subparsers.add_parser("data", **described("data"))
    commands = data.add_subparsers(dest="data_command", metavar="{convert,generate}", required=True)

    convert = commands.add_parser(
        "convert",
        help="convert a JSONL file of question/answer records to verl parquet",
        description="Each line is a JSON object. The ground truth is the text after '####' in the answer, "
        "or the whole answer when it has none. Bad lines are all reported, with line numbers, "
        "and nothing is written.",
    )
    convert.add_argument("src", help="JSONL file, one record per line")
    convert.add_argument("dst", help="parquet file to write")
    convert.add_argument("--prompt-field", default="question", help="record field holding the prompt (default: question)")
    convert.add_argument("--answer-field", default="answer", help="record field holding the answer (default: answer)")
    convert.add_argument("--system", default=None, help="system message put ahead of every prompt")
    convert.add_argument(
        "--data-source", default=GSM8K_DATA_SOURCE,
        help=f"data_source column; picks verl's reward function (default: {GSM8K_DATA_SOURCE})",
    )
    convert.add_argument("--no-progress", action="store_true", help="don't draw a progress bar")
    convert.set_defaults(func=run_convert)

    generate = commands.add_parser(
        "generate",
        help="generate an offline model + tokenizer + dataset (no model hub needed)",
        description="Writes OUT/model (random-weight Qwen2, trained BPE tokenizer) and OUT/data "
        "(train.parquet, test.parquet); does nothing when OUT already holds the same set.",
    )
    generate.add_argument("out", help="directory to write")
    generate.add_argument("--shape", choices=list(SHAPES), default="tiny", help="model shape (default: tiny)")
    generate.add_argument("--n-train", type=positive_int, default=512, help="training prompts (default: 512)")
    generate.add_argument("--n-test", type=positive_int, default=64, help="test prompts (default: 64)")
    generate.add_argument("--device", type=torch_device, default="cpu", help="where to initialise the weights, e.g. cuda (default: cpu)")
    generate.set_defaults(func=run_generate)


def run_convert(args: argparse.Namespace) -> int:
    try:
        rows = convert_jsonl(
            args.src, args.dst,
            prompt_field=args.prompt_field, answer_field=args.answer_field, system=args.system,
            data_source=args.data_source, progress=not args.no_progress,
        )
    except (ConvertError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {rows} rows to {args.dst}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    try:
        info = generate_assets(args.out, shape=args.shape, n_train=args.n_train, n_test=args.n_test, device=args.device)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    how = "already there, reused" if info["reused"] else f"generated in {info['t_total_s']} s"
    print(f"{args.shape} assets {how}: {info['params']:,} parameters, tokenizer of {info['tokenizer_size']} tokens")
    print(f"  model: {info['model_dir']}")
    print(f"  train: {info['train_path']} ({info['n_train']} rows)")
    print(f"  test:  {info['test_path']} ({info['n_test']} rows)")
    return 0
