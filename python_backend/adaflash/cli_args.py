"""Command-line conventions shared by every adaflash command, the core's and the plugins' (serve, sweep).

Standard library only, so the client tools and Locust processes can use it too.
"""

from __future__ import annotations

import argparse
import json
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


def add_placement_args(p: argparse.ArgumentParser) -> None:
    """--device and --dtype, read by `adaflash.models.placement.placement` (which checks them)."""
    p.add_argument("--device", default="auto",
                   help="auto (CUDA when this PyTorch sees a GPU, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="the models' floating dtype (default: bfloat16 on CUDA, float32 on CPU)")
