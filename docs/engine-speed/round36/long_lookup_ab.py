"""Round 36: the planner's copies with matches of up to 16 tokens (`planner.COPY_MATCH`, `long`, the engine as it is)
against up to 3 (`short`, the lookup before this round; its matches fall in the same estimates as before, buckets 1-3).
Each side has a gate of its own and copy estimates of its own, kept from run to run, each over `ar` of the same
round, taking turns (round 33's `ab.compare`); outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round36/long_lookup_ab.py math 64 12
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding import ngram, planner  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.policy import AcceptanceStats  # noqa: E402

MATCH = {"long": planner.COPY_MATCH, "short": ngram.MAX_N}
STATS: dict[str, tuple[list[AcceptanceStats], AcceptanceStats]] = {}


def lookup_of(side: str, engine: Engine) -> Callable[[], None]:
    """The side's longest match, and its own engine-wide copy estimates."""
    controller = engine.scheduler.planner.controller
    fresh = (controller._copy_estimates(), AcceptanceStats(controller.block_size - 1))
    controller.global_copy, controller._pooled_copy = STATS.setdefault(side, fresh)
    planner.COPY_MATCH = MATCH[side]

    def undo() -> None:
        planner.COPY_MATCH = MATCH["long"]
        STATS[side] = (controller.global_copy, controller._pooled_copy)

    return undo


if __name__ == "__main__":
    compare(tuple(MATCH), lookup_of)
