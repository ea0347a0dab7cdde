"""Argument types for the command line: each reads one option's text or says, in one line, why it can't.

argparse reports a type's ArgumentTypeError as `argument --speed: …`; the top-level parser (cli/__init__.py) prints
that one line, not a usage screen, so a bad argument reads like any other refusal.
"""

from __future__ import annotations

import argparse
import math

from ..bounds import quoted
from ..knob import MAX_GPUS

MAX_PORT = 65535


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{quoted(text, 40)} is not {'an integer' if kind is int else 'a number'}")


def positive_number(text: str) -> float:
    """A finite number above 0 (a speed, a rate, a duration)."""
    value = _number(text, float)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{quoted(text, 40)} is not a finite number above 0")
    return value


def positive_int(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not an integer of at least 1")
    return value


def nonnegative_int(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def port(text: str) -> int:
    """A TCP port, or 0 for any free one."""
    value = _number(text, int)
    if not 0 <= value <= MAX_PORT:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to {MAX_PORT}; 0: any free one)")
    return value


def gpu_list(text: str) -> list[int]:
    """'0,1' → [0, 1]: distinct GPU indices."""
    indices = []
    for part in (part.strip() for part in text.split(",")):
        if not part.isdigit() or int(part) >= MAX_GPUS:
            raise argparse.ArgumentTypeError(f"{quoted(part, 40)} is not a GPU index (0, 1, …): give e.g. 0,1")
        indices.append(int(part))
    if len(set(indices)) != len(indices):
        raise argparse.ArgumentTypeError(f"{quoted(text, 80)} names a GPU twice")
    return indices


def torch_device(text: str) -> str:
    """A torch device this machine has: cpu, cuda, cuda:N (checked before anything is written)."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{quoted(text, 40)} is not a device (cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{quoted(text, 40)}: no CUDA GPU on this machine (use cpu)")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{quoted(text, 40)}: the assets are made on cpu or cuda")
    return text
