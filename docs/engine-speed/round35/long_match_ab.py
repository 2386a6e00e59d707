"""Round 35: the planner's copies looked up with matches of up to LONGEST tokens, their match lengths bucketed for the
copy estimates (1, 2, 3, 4-7, 8-15, LONGEST; `long`), against the planner as it is (matches of up to ngram.MAX_N = 3,
`as_is`). `match_lengths.py` found acceptance rising with the match far past 3 tokens, and `replay.py` found copies
verified only behind long matches gaining under load. Each side has a gate of its own and copy estimates of its own,
kept from run to run, each over `ar` of the same round, in the order ar, as_is, long, reversed every other round;
outputs equal. The long lookup is patched in here; the engine is unchanged.

Runs at commit 6922405: round 36 built the long lookup into the planner (`planner.COPY_MATCH`), which this patches in.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/long_match_ab.py chat 32 6 [plan]

With `plan`, both sides are held to the plan arm (every call plans): the plan arm itself compared, without the gate.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from adaflash.decoding import ngram, planner  # noqa: E402

BUCKETS = 6  # the copy estimates' match lengths: 1, 2, 3, then 4-7, 8-15, LONGEST
ngram.MAX_N = BUCKETS  # (read where the controller sizes its estimates; lookup's own default stays 3)
from ab import compare  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.policy import AcceptanceStats  # noqa: E402
from cells import Always  # noqa: E402  (on the path through `ab`)

LONGEST = 16
lookup = ngram.lookup


def bucket(matched: int) -> int:
    return matched if matched <= 3 else 4 if matched < 8 else 5 if matched < LONGEST else 6


class LongLookup:
    """What the planner reads of `ngram` on the long side."""

    MAX_N = BUCKETS

    @staticmethod
    def lookup(tokens: list[int], k: int) -> tuple[list[int], int]:
        proposal, matched = lookup(tokens, k, LONGEST)
        return proposal, bucket(matched)


STATS: dict[str, tuple[list[AcceptanceStats], AcceptanceStats]] = {}
LONG_SIDES = {"long"}  # the sides given the long lookup
HELD = False  # both sides held to the plan arm (`plan` on the command line)


def long_side(side: str, engine: Engine) -> Callable[[], None]:
    """Give the side its own engine-wide copy estimates, the long lookup on LONG_SIDES, and with HELD the plan
    arm."""
    controller = engine.scheduler.planner.controller
    size = controller.block_size - 1
    own = STATS.setdefault(side, ([AcceptanceStats(size) for _ in range(BUCKETS + 1)], AcceptanceStats(size)))
    controller.global_copy, controller._pooled_copy = own
    controller._decision = None
    if side in LONG_SIDES:
        planner.ngram = LongLookup
    gate = engine.scheduler.gate
    if HELD:
        engine.scheduler.gate = Always(Arm.PLAN)

    def undo() -> None:
        planner.ngram = ngram
        engine.scheduler.gate = gate
        STATS[side] = (controller.global_copy, controller._pooled_copy)

    return undo


if __name__ == "__main__":
    HELD = len(sys.argv) > 4 and sys.argv.pop(4) == "plan"
    compare(("as_is", "long"), long_side)
