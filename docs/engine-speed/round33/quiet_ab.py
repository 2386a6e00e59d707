"""Round 33: a gate that tries no arm but the leader while a closed workload drains (`quiet`: no request waits; an
arm's first CONFIRM_BLOCKS blocks still run), against the gate as it is (`gate`); each side with a gate of its own
kept from run to run, each over `ar` of the same round, in the order ar, gate, quiet, reversed every other round;
outputs equal. The quiet gate is patched in here; the engine is unchanged.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/quiet_ab.py math 64 6
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab import compare, draining  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402

QUIET = {"now": False}  # set before each step of the quiet side: whether the workload drains
overdue = gate_module._Load.overdue


def quiet_overdue(load: gate_module._Load, leader: Arm) -> Arm | None:
    """`_Load.overdue`, but none while QUIET says the workload drains, once every arm has its first blocks."""
    if QUIET["now"] and all(n >= gate_module.CONFIRM_BLOCKS for n in load.blocks.values()):
        return None
    return overdue(load, leader)


if __name__ == "__main__":
    gate_module._Load.overdue = quiet_overdue
    compare(("gate", "quiet"), draining(QUIET, "quiet"))
