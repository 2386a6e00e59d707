"""Round 37: a try of an arm behind weighs at most MAX_WEIGHT in its running rate (`capped`), where it replaced it
once the leader had run many blocks since (`gate`, `gate.WEIGHT`'s rule). Why: at math c=64 the plan arm's blocks at
32-63 sequences read 0.76-1.27 of the table's plain step (`block-trace-math64.txt`); a lucky try put it within reach
and it was tried again two blocks later, each try putting the batch out of step. Each side a gate of its own kept
from run to run, each over `ar` of the same round, in the order ar, gate, capped, reversed every other round; outputs
equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/try_weight_ab.py math 64 12
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402

MAX_WEIGHT = 0.5
end_block = gate_module._Load.end_block


def capped_end_block(load: gate_module._Load) -> None:
    """`_Load.end_block` with the block's weight capped: the arm's `since` is cut to the count that gives MAX_WEIGHT."""
    arm = load.arm
    if not load.confirming and load.rates[arm] is not None:
        weight = 1 - (1 - gate_module.WEIGHT) ** (1 + load.since[arm])
        while weight > MAX_WEIGHT and load.since[arm] > 0:
            load.since[arm] -= 1
            weight = 1 - (1 - gate_module.WEIGHT) ** (1 + load.since[arm])
    end_block(load)


def patch(side: str, engine: Engine):
    if side == "capped":
        gate_module._Load.end_block = capped_end_block

    def undo() -> None:
        gate_module._Load.end_block = end_block

    return undo


if __name__ == "__main__":
    compare(("gate", "capped"), patch)
