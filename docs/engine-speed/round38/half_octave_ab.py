"""Round 38: the gate's loads from 16 sequences in half octaves (16-23, 24-31, 32-47, 48-63, ...) against its powers of
two. Why: at math c=64 the plan arm's calls at 28-31 sequences read 1.25 of the table's plain step and those at 16-27
0.83-0.97, where plain decoding's read 0.95-1.06 (round 37, `call-rates-math64.txt`): one load of 16-31 followed the
plan arm on the strength of its first calls. Each side a gate of its own kept from run to run, each over `ar` of the
same round, in turn; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/half_octave_ab.py math 64 12
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm, PlanGate, _Load  # noqa: E402

HALVED_FROM = 16


def half_octaves(gate: PlanGate) -> Callable[[int], Arm]:
    """`PlanGate.choose` with loads of half an octave from HALVED_FROM sequences."""

    def choose(sequences: int) -> Arm:
        if sequences < gate.min_sequences:
            gate._load = None
            return Arm.PLAN
        bits = sequences.bit_length()
        fewest = 1 << (bits - 1)
        upper = sequences >= HALVED_FROM and sequences >= fewest + fewest // 2
        key = 2 * bits + upper
        if key not in gate.loads:
            low = fewest + fewest // 2 if upper else fewest
            gate.loads[key] = _Load(gate.arms, gate.plain_preference(fewest), low)
        gate._load = gate.loads[key]
        return gate._load.arm

    return choose


def patch(side: str, engine: Engine) -> Callable[[], None]:
    gate = engine.scheduler.gate
    if side == "halves":
        gate.choose = half_octaves(gate)

    def undo() -> None:
        gate.__dict__.pop("choose", None)

    return undo


if __name__ == "__main__":
    compare(("gate", "halves"), patch)
