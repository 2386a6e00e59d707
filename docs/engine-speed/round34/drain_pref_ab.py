"""Round 34: plain decoding preferred more while a closed workload drains at 16 sequences and more (`drain`: no
request waits; plain's score raised by DRAIN_PREFERENCE instead of PLAIN_PREFERENCE), against the gate as it is
(`gate`); each side with a gate of its own kept from run to run, each over `ar` of the same round, in the order ar,
gate, drain, reversed every other round; outputs equal. The preference is patched in here; the engine is unchanged.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round34/drain_pref_ab.py math 64 6
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare, draining  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402

DRAIN_PREFERENCE = float(os.environ.get("DRAIN_PREFERENCE", "0.25"))
DRAIN_FROM = int(os.environ.get("DRAIN_FROM", "16"))  # the fewest sequences of a load that gets it
DRAINING = {"now": False}  # set before each step of the drain side
score = gate_module._Load.score


def drain_score(load: gate_module._Load, arm: Arm) -> float:
    """`_Load.score`, with plain's preference DRAIN_PREFERENCE while DRAINING says the workload drains."""
    if arm is Arm.PLAIN and DRAINING["now"] and load.sequences >= DRAIN_FROM:
        return load.rates[arm] * (1 + DRAIN_PREFERENCE)
    return score(load, arm)


if __name__ == "__main__":
    gate_module._Load.score = drain_score
    compare(("gate", "drain"), draining(DRAINING, "drain"))
