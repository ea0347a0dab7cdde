import argparse
from pathlib import Path

import pandas as pd
import pytest

from tests.gsm8k_rule import gsm8k_strict_score
from workbench.assets.convert import ERRORS_SHOWN, ConvertError, convert_jsonl, extract_ground_truth
from workbench.cli.data import add_data_commands

DATA = Path(__file__).parent / "data"
VERL_COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


def test_good_jsonl_converts_to_verl_rows(tmp_path, capsys):
    dst = tmp_path / "out" / "train.parquet"
    assert convert_jsonl(DATA / "gsm8k_style_good.jsonl", dst) == 3
    assert "convert gsm8k_style_good.jsonl" in capsys.readouterr().err  # the progress bar

    frame = pd.read_parquet(dst)
    assert list(frame.columns) == VERL_COLUMNS
    assert set(frame.data_source) == {"openai/gsm8k"}
    assert [list(p) for p in frame.prompt] == [
        [{"role": "user", "content": q}]
        for q in (
            "Tom has 3 apples and buys 4 more. How many apples does Tom have now?",
            "A shop sells 1,000 pens a day for 12 days minus 10,800 returned. How many pens are kept?",
            "Ana had 10 coins and lost 12. What is her balance?",
        )
    ]
    truths = [r["ground_truth"] for r in frame.reward_model]
    assert truths == ["7", "1200", "-2"]
    assert {r["style"] for r in frame.reward_model} == {"rule"}
    # The blank third line is skipped but source line numbers are kept.
    assert [e["line"] for e in frame.extra_info] == [1, 2, 4]
    assert [e["index"] for e in frame.extra_info] == [0, 1, 2]
    # verl's rule gives full reward to a response that repeats the source's own "#### N".
    for extra, truth in zip(frame.extra_info, truths):
        assert gsm8k_strict_score(extra["answer"], truth) == 1.0


def test_bad_lines_are_all_reported_and_nothing_is_written(tmp_path):
    dst = tmp_path / "train.parquet"
    dst.write_bytes(b"previous contents")
    with pytest.raises(ConvertError) as caught:
        convert_jsonl(DATA / "gsm8k_style_bad.jsonl", dst, progress=False)

    assert [line for line, _ in caught.value.problems] == [2, 3, 4, 5, 7]
    message = str(caught.value)
    for expected in (
        "line 2: bad JSON",
        "line 3: expected a JSON object, got list",
        "line 4: missing field 'answer'",
        "line 5: field 'question' is empty",
        "line 7: field 'answer' is list, expected text",
    ):
        assert expected in message
    assert dst.read_bytes() == b"previous contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.parquet"]  # no temp file left behind


def test_many_bad_lines_show_the_first_ones_and_a_count(tmp_path):
    src = tmp_path / "broken.jsonl"
    src.write_text("not json\n" * (ERRORS_SHOWN + 5))
    with pytest.raises(ConvertError) as caught:
        convert_jsonl(src, tmp_path / "out.parquet", progress=False)
    assert len(caught.value.problems) == ERRORS_SHOWN + 5
    message = str(caught.value)
    assert f"line {ERRORS_SHOWN}: bad JSON" in message
    assert f"line {ERRORS_SHOWN + 1}:" not in message
    assert "... and 5 more" in message
    assert not (tmp_path / "out.parquet").exists()


def test_empty_file_is_an_error(tmp_path):
    src = tmp_path / "empty.jsonl"
    src.write_text("\n\n")
    with pytest.raises(ConvertError, match="no records"):
        convert_jsonl(src, tmp_path / "out.parquet", progress=False)
    assert not (tmp_path / "out.parquet").exists()


def test_field_mapping_system_and_answer_pattern(tmp_path):
    dst = tmp_path / "custom.parquet"
    rows = convert_jsonl(
        DATA / "custom_fields.jsonl", dst,
        prompt_field="problem", answer_field="solution", system="Answer briefly.",
        data_source="my/source", answer_pattern=r"Answer:\s*(\d+)", progress=False,
    )
    assert rows == 3
    frame = pd.read_parquet(dst)
    assert set(frame.data_source) == {"my/source"}
    first = list(frame.prompt[0])
    assert first == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Zoe buys 3 boxes with 5 shells in each box. How many shells?"},
    ]
    # No match: the whole stripped answer is the ground truth; a number answer becomes text.
    assert [r["ground_truth"] for r in frame.reward_model] == ["15", "blue", "5"]


def test_wrong_field_name_reports_every_line(tmp_path):
    with pytest.raises(ConvertError) as caught:
        convert_jsonl(DATA / "gsm8k_style_good.jsonl", tmp_path / "out.parquet", prompt_field="problem", progress=False)
    assert caught.value.problems == [(line, "missing field 'problem'") for line in (1, 2, 4)]


@pytest.mark.parametrize(
    "answer, truth",
    [
        ("steps\n#### 72", "72"),
        ("#### 1,234,567", "1234567"),
        ("#### 3.5\n", "3.5"),
        ("first #### 1\nthen #### 2", "2"),
        ("#### red, green", "red, green"),  # commas only go from numbers
        ("  just the answer  ", "just the answer"),
    ],
)
def test_extract_ground_truth(answer, truth):
    assert extract_ground_truth(answer) == truth


def _data_parser():
    parser = argparse.ArgumentParser(prog="verl-workbench")
    add_data_commands(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_convert(tmp_path, capsys):
    dst = tmp_path / "train.parquet"
    args = _data_parser().parse_args(
        ["data", "convert", str(DATA / "custom_fields.jsonl"), str(dst),
         "--prompt-field", "problem", "--answer-field", "solution", "--system", "Be brief.",
         "--data-source", "my/source", "--no-progress"]
    )
    assert args.func(args) == 0
    out = capsys.readouterr()
    assert f"wrote 3 rows to {dst}" in out.out
    assert out.err == ""
    frame = pd.read_parquet(dst)
    assert frame.prompt[0][0]["content"] == "Be brief."
    assert set(frame.data_source) == {"my/source"}


def test_cli_convert_reports_bad_lines(tmp_path, capsys):
    dst = tmp_path / "train.parquet"
    args = _data_parser().parse_args(["data", "convert", str(DATA / "gsm8k_style_bad.jsonl"), str(dst), "--no-progress"])
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert "5 bad line(s)" in err and "line 4: missing field 'answer'" in err
    assert not dst.exists()
