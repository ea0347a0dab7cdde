"""Bounds on what the workbench takes in: how much of a bad input an error message quotes, and how large, deep and
aliased a YAML document may be before anything builds it.

A message about bad input names it, but never echoes a 10 MB string or a 10 000-item list back: `quoted` keeps
QUOTE_LIMIT characters of it. A plan YAML is read in three steps: its size (MAX_YAML_BYTES), then its node graph
(PyYAML's composer, linear in the text: an alias is one shared node), walked with aliases expanded and stopped at
MAX_YAML_DEPTH levels or MAX_YAML_NODES nodes; only then is it built. A self-referencing anchor, a "billion laughs"
document or a 30 MB file are refused in one line, in milliseconds and kilobytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

QUOTE_LIMIT = 200
MAX_YAML_BYTES = 1024 * 1024  # verl's whole composed config is ~30 KB
MAX_YAML_DEPTH = 64
MAX_YAML_NODES = 100_000  # counted with every alias expanded


class InputTooLarge(ValueError):
    """An input past one of the bounds above (the message says which)."""


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """repr(value), cut to `limit` characters with how much was left out: what an error message may echo."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    if len(text) <= limit:
        return text
    size = f"{len(value):,} characters" if isinstance(value, str) else (
        f"{len(value):,} items" if hasattr(value, "__len__") else "more")
    return f"{text[:limit]}… ({size})"


def check_yaml_file(path: str | os.PathLike) -> None:
    """Raise InputTooLarge (one line) when the YAML file at `path` is too large, too deep or expands too far
    through its aliases; OSError when it can't be read; yaml.YAMLError when it is not YAML."""
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise InputTooLarge(f"{path.name} is {size:,} bytes: a plan YAML may hold at most {MAX_YAML_BYTES:,}")
    with open(path, "rb") as stream:
        text = stream.read(MAX_YAML_BYTES + 1)
    try:
        for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
            _walk(document, path.name)
    except RecursionError:  # PyYAML's composer recurses once per level
        raise InputTooLarge(f"{path.name} nests deeper than {MAX_YAML_DEPTH} levels") from None


def _walk(root: yaml.Node | None, name: str) -> None:
    nodes, stack = 0, [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if node is None:
            continue
        nodes += 1
        if depth > MAX_YAML_DEPTH:
            raise InputTooLarge(f"{name} nests deeper than {MAX_YAML_DEPTH} levels (a self-referencing anchor?)")
        if nodes > MAX_YAML_NODES:
            raise InputTooLarge(f"{name} expands to more than {MAX_YAML_NODES:,} values through its aliases")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend((part, depth + 1) for pair in node.value for part in pair)
