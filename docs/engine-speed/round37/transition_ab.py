"""Round 37: a call that moves the batch to another load, after a stretch of at least STRETCH calls at the load it
leaves on another arm, is a warm-up of the load it enters (not measured), as a load's own change of arm is
(`transition`), against the gate as it is (`gate`). Why: at math c=64 the plan arm's first calls at 16-31 sequences,
after the plain stretch at 32-63, copy what plain decoding wrote meanwhile and read 1.25 of the table's plain step,
where its later calls there read 0.83-0.97 (`call-rates-math64.txt`); the switch's gain, like its cost, is not what
the arm commits while it leads. Each side a gate of its own kept from run to run, each over `ar` of the same round, in
the order ar, gate, transition, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/transition_ab.py math 64 12
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import BLOCK_CALLS, WARMUP_CALLS  # noqa: E402

STRETCH = BLOCK_CALLS


def patch(side: str, engine: Engine):
    gate = engine.scheduler.gate
    choose = gate.choose
    last = {"load": None, "arm": None, "stretch": 0}

    def transition_choose(sequences: int):
        arm = choose(sequences)
        load = gate._load
        if load is not None and load is not last["load"]:
            if last["load"] is not None and last["arm"] is not arm and last["stretch"] >= STRETCH:
                load.warmup = max(load.warmup, WARMUP_CALLS)
            last["stretch"] = 0
        last["load"], last["arm"], last["stretch"] = load, arm, last["stretch"] + 1
        return arm

    if side == "transition":
        gate.choose = transition_choose

    def undo() -> None:
        if side == "transition":
            del gate.choose

    return undo


if __name__ == "__main__":
    compare(("gate", "transition"), patch)
