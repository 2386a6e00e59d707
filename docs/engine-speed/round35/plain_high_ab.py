"""Round 35: what the plan arm costs a loaded run where it does not win: the gate as it is (`gate`) against the same
gate held to plain decoding from MIN_SEQUENCES running sequences (`plain_high`: below them it chooses as it would);
each side with a gate of its own kept from run to run, each over `ar` of the same round, in the order ar, gate,
plain_high, reversed every other round; outputs equal. A measurement, not a policy: where the plan arm wins under load
(multilingual at 32) the hold would forgo it.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/plain_high_ab.py chat 32 8
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402

MIN_SEQUENCES = 16


def held(side: str, engine: Engine) -> Callable[[], None]:
    """On the plain_high side, the gate's calls at MIN_SEQUENCES or more go to plain decoding, unobserved."""
    gate = engine.scheduler.gate
    choose = gate.choose

    def plain_high(sequences: int) -> Arm:
        arm = choose(sequences)
        if sequences < MIN_SEQUENCES:
            return arm
        gate._load = None  # (not observed: the gate learns nothing at these loads)
        return Arm.PLAIN

    if side == "plain_high":
        gate.choose = plain_high

    def undo() -> None:
        gate.__dict__.pop("choose", None)

    return undo


if __name__ == "__main__":
    compare(("gate", "plain_high"), held)
