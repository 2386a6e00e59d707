"""Command-line conventions shared by every adaflash command, the core's and the plugins' (serve, sweep).

Standard library only, so the client tools and Locust processes can use it too.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# The model folder commands use when given none (relative to the working directory, like `make models` writes it).
DEFAULT_MODEL_DIR = Path("models/default")


def split_csv(text: str) -> list[str]:
    """The items of a comma-separated list, stripped; empty items (and an empty text) give nothing."""
    return [item.strip() for item in (text or "").split(",") if item.strip()]


def csv_list(kind: Callable[[str], T], choices: tuple[T, ...] | None = None) -> Callable[[str], list[T]]:
    """An argparse `type` for a non-empty comma-separated list of `kind`, each one of `choices` when given."""
    def parse(text: str) -> list[T]:
        try:
            items = [kind(x) for x in split_csv(text)]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        if choices is not None and (bad := [x for x in items if x not in choices]):
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(map(str, choices))}")
        return items

    return parse


def json_object(text: str) -> dict:
    """An argparse `type` for a JSON object (a chat template's switches: '{"enable_thinking": false}')."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {type(value).__name__}")
    return value


def existing_file(text: str) -> str:
    """An argparse `type` for a file that must exist (a certificate, a key): a typo fails at parsing, not later
    inside a library that opens it. The text as given, not a Path: Locust sends its options to workers as msgpack."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text}")
    return text


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
