"""Round 35: the gate's exploring regret (`gate.EXPLORE_REGRET`) at 1% (`r1`, round 34's) against a quarter of it
(`r025`), and against a quarter of it only for a speculating arm tried while plain decoding leads a load of several
sequences (`asym`; plain decoding tried while another arm leads keeps 1%); each side with a gate of its own kept from
run to run, each over `ar` of the same round, in the order ar, then the sides, reversed every other round; outputs
equal. Each side's rule is set here, so the record compares the same ones on either side of a change.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/regret_ab.py chat 32 8 [sides]

`sides`: comma-separated, of SIDES (default r1,r025).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402

SIDES = ("r1", "r025", "asym")
explore_after = gate_module._Load._explore_after


def asym_explore_after(load: gate_module._Load, leader: gate_module.Arm, arm: gate_module.Arm) -> int:
    """`_Load._explore_after` at 1%, or at a quarter of it for a speculating arm while plain decoding leads a load
    whose plain preference is not zero (more than one sequence)."""
    quarter = leader is gate_module.Arm.PLAIN and load.plain_preference > 0
    gate_module.EXPLORE_REGRET = 0.0025 if quarter else 0.01
    return explore_after(load, leader, arm)


def with_rule(side: str, engine: Engine) -> Callable[[], None]:
    """Set the side's rule for its run; the undo puts the module's own back."""
    own = gate_module.EXPLORE_REGRET
    if side == "asym":
        gate_module._Load._explore_after = asym_explore_after
    else:
        gate_module.EXPLORE_REGRET = {"r1": 0.01, "r025": 0.0025}[side]

    def undo() -> None:
        gate_module.EXPLORE_REGRET = own
        gate_module._Load._explore_after = explore_after

    return undo


if __name__ == "__main__":
    sides = tuple(sys.argv.pop(4).split(",")) if len(sys.argv) > 4 else ("r1", "r025")
    compare(sides, with_rule)
