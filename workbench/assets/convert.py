"""Turn a JSONL file of question/answer records into a parquet file that verl's PPO trainer reads.

verl's rule reward for data_source "openai/gsm8k" (verl.utils.reward_score.gsm8k) takes the number after
the last "#### " in the model's response and compares it with reward_model.ground_truth, so each row
carries the ground truth already extracted from the answer text.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

GSM8K_DATA_SOURCE = "openai/gsm8k"
GSM8K_ANSWER_PATTERN = r"####\s*(.+)$"
ERRORS_SHOWN = 20

# A number written with thousands separators ("1,200"); verl strips commas from the model's answer
# before comparing, so the ground truth must not keep them.
_NUMBER_WITH_COMMAS = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


class ConvertError(ValueError):
    """The source can't be converted; `problems` holds every bad (line number, reason)."""

    def __init__(self, message: str, problems: list[tuple[int, str]] = ()):
        super().__init__(message)
        self.problems = list(problems)

    @classmethod
    def bad_lines(cls, src: str | os.PathLike, problems: list[tuple[int, str]]) -> "ConvertError":
        shown = [f"  line {line}: {reason}" for line, reason in problems[:ERRORS_SHOWN]]
        if len(problems) > ERRORS_SHOWN:
            shown.append(f"  ... and {len(problems) - ERRORS_SHOWN} more")
        return cls(f"{src}: {len(problems)} bad line(s), nothing written:\n" + "\n".join(shown), problems)


def verl_row(
    messages: list[dict[str, str]], ground_truth: str, extra_info: dict[str, Any], data_source: str = GSM8K_DATA_SOURCE
) -> dict[str, Any]:
    """One row in the column layout of verl's own examples/data_preprocess/gsm8k.py."""
    return {
        "data_source": data_source,
        "prompt": messages,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def extract_ground_truth(answer: str, answer_pattern: str | re.Pattern = GSM8K_ANSWER_PATTERN) -> str:
    """The last match of the pattern's first group, else the whole answer (both stripped)."""
    pattern = re.compile(answer_pattern, re.MULTILINE) if isinstance(answer_pattern, str) else answer_pattern
    matches = list(pattern.finditer(answer))
    truth = (matches[-1].group(1) if matches else answer).strip()
    return truth.replace(",", "") if _NUMBER_WITH_COMMAS.fullmatch(truth) else truth


def _text_field(record: dict[str, Any], field: str) -> tuple[str | None, str | None]:
    """(text, None) or (None, reason): numbers are accepted as text, blank text is not."""
    if field not in record:
        return None, f"missing field {field!r}"
    value = record[field]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return None, f"field {field!r} is {type(value).__name__}, expected text"
    text = str(value)
    if not text.strip():
        return None, f"field {field!r} is empty"
    return text, None


def convert_jsonl(
    src: str | os.PathLike,
    dst_parquet: str | os.PathLike,
    prompt_field: str = "question",
    answer_field: str = "answer",
    system: str | None = None,
    data_source: str = GSM8K_DATA_SOURCE,
    answer_pattern: str = GSM8K_ANSWER_PATTERN,
    progress: bool = True,
) -> int:
    """Convert SRC (one JSON object a line) to verl parquet at DST and return the row count.

    Every line is checked before anything is written; bad lines raise ConvertError naming each one.
    Blank lines are skipped. `system`, when given, becomes a system message ahead of each prompt.
    """
    src, dst = Path(src), Path(dst_parquet)
    pattern = re.compile(answer_pattern, re.MULTILINE)
    if pattern.groups < 1:
        raise ValueError(f"answer_pattern {answer_pattern!r} needs a group that captures the ground truth")
    rows: list[dict[str, Any]] = []
    problems: list[tuple[int, str]] = []
    with open(src, "rb") as f, tqdm(
        total=src.stat().st_size, unit="B", unit_scale=True, desc=f"convert {src.name}",
        file=sys.stderr, disable=not progress,
    ) as bar:
        for line_no, raw in enumerate(f, start=1):
            bar.update(len(raw))
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                problems.append((line_no, f"not UTF-8 ({e.reason} at byte {e.start})"))
                continue
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append((line_no, f"bad JSON ({e.msg} at column {e.colno})"))
                continue
            if not isinstance(record, dict):
                problems.append((line_no, f"expected a JSON object, got {type(record).__name__}"))
                continue
            prompt, prompt_problem = _text_field(record, prompt_field)
            answer, answer_problem = _text_field(record, answer_field)
            reasons = [reason for reason in (prompt_problem, answer_problem) if reason]
            if reasons:
                problems.append((line_no, "; ".join(reasons)))
                continue
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}
            ]
            extra_info = {"index": len(rows), "line": line_no, "answer": answer, "question": prompt}
            rows.append(verl_row(messages, extract_ground_truth(answer, pattern), extra_info, data_source))
    if problems:
        raise ConvertError.bad_lines(src, problems)
    if not rows:
        raise ConvertError(f"{src}: no records (the file is empty or blank), nothing written")
    write_parquet_atomically(pd.DataFrame(rows), dst)
    return len(rows)


def write_parquet_atomically(frame: pd.DataFrame, dst: Path) -> None:
    """Write beside DST, then rename, so a reader never sees a half-written file."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dst.parent, prefix=f".{dst.name}.", suffix=".tmp")
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
