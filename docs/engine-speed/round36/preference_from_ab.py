"""Round 36: where the gate's full preference for plain decoding starts, now 64 sequences (`gate.FULL_PREFERENCE_FROM`,
`from64`), against 32 (`from32`: the 32-63 load takes 10% too, as every load did before this round). A wave of 64
sequences passes through the 32-63 load as its sequences end. Each side has a gate of its own, kept from run to run,
each over `ar` of the same round, taking turns (round 33's `ab.compare`); outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round36/preference_from_ab.py math 64 8
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding import gate  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402

FULL_FROM = {"from64": 64, "from32": 32}


def full_from(side: str, engine: Engine) -> Callable[[], None]:
    """The side's gate takes its loads' preferences with the full one from FULL_FROM[side] sequences."""
    def preference(sequences: int) -> float:
        if sequences <= 1:
            return 0.0
        return gate.PLAIN_PREFERENCE if sequences >= FULL_FROM[side] else gate.SMALL_PLAIN_PREFERENCE

    engine.scheduler.gate.plain_preference = preference
    return lambda: None


if __name__ == "__main__":
    compare(tuple(FULL_FROM), full_from)
