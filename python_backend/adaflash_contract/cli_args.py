"""argparse types every command shares, the client's tools included (so they need nothing of the core).

Standard library only: Locust processes and the client CLI use them too.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


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
