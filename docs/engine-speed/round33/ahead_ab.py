"""Round 33: while a closed workload drains, only the sequences with the most tokens left may speculate (`ahead`: the
others step plainly) and the gate is told what a call brought the batch's end nearer (drain_ab.py's credit), against
every sequence planning as before (`all`); each side with a gate of its own kept from run to run, each over `ar` of
the same round, in the order ar, all, ahead, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/ahead_ab.py math 64 6 8

The last argument is AHEAD_SLACK. It runs at commit db8d6ae (with the credit; 0a240c1 without it); neither change was
kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab import compare, unpatched  # noqa: E402
from cells import load  # noqa: E402
from turns import Runs  # noqa: E402

from adaflash.decoding import scheduler as scheduler_module  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import PlanGate  # noqa: E402

SIDES = ("all", "ahead")


def patch(side: str, engine: Engine):
    """The `all` side: nobody counts as ahead, and the gate is told every token committed."""
    if side == "all":
        engine.scheduler._ahead = lambda active: set()
        engine.scheduler._credited = lambda active, tokens, horizon: tokens
    return unpatched(engine, "_ahead", "_credited")


def sides(domain: str, concurrency: int, slack: int) -> tuple[Engine, dict[str, PlanGate], Runs]:
    """A cell's engine at AHEAD_SLACK `slack`, a gate of its own for each side, and its runs: where loads_ab.py and
    phase_ab.py start."""
    scheduler_module.AHEAD_SLACK = slack
    cell = load(domain)
    engine = cell.engine()
    return engine, {side: PlanGate(arms=engine.scheduler.gate.arms) for side in SIDES}, Runs(cell.ids, concurrency)


if __name__ == "__main__":
    scheduler_module.AHEAD_SLACK = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    compare(SIDES, patch)
