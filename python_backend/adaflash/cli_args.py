"""Command-line conventions of the core's commands and the plugins' (serve, sweep). The argparse types every command
shares, the client's included, live in the contract (`adaflash_contract.cli_args`) and are handed on from here.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from adaflash_contract.cli_args import csv_list, existing_file, json_object, split_csv


__all__ = ["DEFAULT_MODEL_DIR", "csv_list", "existing_file", "json_object", "split_csv"]

# The model folder commands use when given none (relative to the working directory, like `make models` writes it).
DEFAULT_MODEL_DIR = Path("models/default")


UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def byte_size(text: str) -> int:
    """An argparse type for a memory size: bytes, or a number with a unit (141GB = 141e9, 139GiB = 139 x 2^30)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if match is None or match.group(2) not in UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 141GB, 139GiB, 40e9)")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def positive_int(text: str) -> int:
    """An argparse type for a count that must be at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def add_placement_args(p: argparse.ArgumentParser) -> None:
    """--device and --dtype, read by `adaflash.models.placement.placement` (which checks them)."""
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when this PyTorch sees a GPU, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="the models' floating dtype (default: bfloat16 on CUDA, float32 on CPU)")
