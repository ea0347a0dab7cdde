"""Offline assets: a generated model + tokenizer + dataset, and JSONL-to-verl-parquet conversion.

Also holds packaged recordings (assets/recordings/) that replay needs without a GPU.
"""

from workbench.assets.convert import ConvertError, convert_jsonl
from workbench.assets.generate import SHAPES, generate_assets, generate_assets_apart

__all__ = ["SHAPES", "ConvertError", "convert_jsonl", "generate_assets", "generate_assets_apart"]
