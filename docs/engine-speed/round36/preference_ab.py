"""Round 36: the gate's preference for plain decoding at 10% (`gate.PLAIN_PREFERENCE`) against a smaller one, each the
same at every load of more than one sequence (as the gate had it before this round), now that the plan arm's copies
follow matches of up to 16 tokens. Each side has a gate of its own, kept from run to run, with its preference, each
over `ar` of the same round, taking turns (round 33's `ab.compare`); outputs equal. It chose the gate's preference
by load (`gate.plain_preference`).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round36/preference_ab.py code 8 8 \
        [0.05]

The second side's preference is the last argument (0.05 unless given).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding import gate  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402

OTHER = float(sys.argv.pop(4)) if len(sys.argv) > 4 else 0.05
PREFERENCES = {"p10": gate.PLAIN_PREFERENCE, f"p{round(OTHER * 100):02d}": OTHER}


def preference(side: str, engine: Engine) -> Callable[[], None]:
    """The side's gate takes its preference before its first run (each load reads it when first seen)."""
    engine.scheduler.gate.plain_preference = lambda sequences: 0.0 if sequences <= 1 else PREFERENCES[side]
    return lambda: None


if __name__ == "__main__":
    compare(tuple(PREFERENCES), preference)
