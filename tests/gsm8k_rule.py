"""verl's gsm8k rule reward (verl.utils.reward_score.gsm8k, strict method), restated for the tests.

verl isn't installed where the CPU tests run, so the rule the generated and converted data must satisfy
is written out here: take the last "#### <number>" in the last 300 characters of the response, drop
commas and dollar signs, and compare the text with reward_model.ground_truth.
"""

import re

_CLIP_CHARS = 300
_STRICT_ANSWER = re.compile(r"#### (\-?[0-9\.\,]+)")


def gsm8k_strict_score(response: str, ground_truth: str) -> float:
    found = _STRICT_ANSWER.findall(response[-_CLIP_CHARS:])
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "").replace("$", "") == ground_truth else 0.0
