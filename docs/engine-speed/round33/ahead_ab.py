"""Round 33: while a closed workload drains, only the sequences with the most tokens left may speculate (`ahead`: the
others step plainly) and the gate is told what a call brought the batch's end nearer (drain_ab.py's credit), against
every sequence planning as before (`all`); each side with a gate of its own kept from run to run, each over `ar` of
the same round, in the order ar, all, ahead, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/ahead_ab.py math 64 6 8

The last argument is AHEAD_SLACK. It runs at commit db8d6ae (with the credit; 0a240c1 without it); neither change was
kept.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding.gate import Arm, PlanGate  # noqa: E402
from adaflash.decoding import scheduler as scheduler_module  # noqa: E402
from adaflash.decoding.scheduler import Scheduler  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    scheduler_module.AHEAD_SLACK = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    cell = load(domain)
    engine = cell.engine()
    scheduler = engine.scheduler
    arms = scheduler.gate.arms
    gates = {"all": PlanGate(arms=arms), "ahead": PlanGate(arms=arms)}
    over: dict[str, list[float]] = {side: [] for side in gates}
    runs = Runs(cell.ids, concurrency)
    for r in range(rounds):
        rates, plan = {}, {}
        for side in in_turn(["ar", "all", "ahead"], r):
            if side in gates:
                scheduler.gate = gates[side]
                calls = gates[side].tally[Arm.PLAN].calls
            if side == "all":
                scheduler._ahead = lambda active: set()
                scheduler._credited = lambda active, tokens, horizon: tokens
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
            scheduler._ahead = Scheduler._ahead.__get__(scheduler)
            scheduler._credited = Scheduler._credited.__get__(scheduler)
            if side in gates:
                plan[side] = gates[side].tally[Arm.PLAN].calls - calls
        for side in over:
            over[side].append(rates[side] / rates["ar"])
        print(r, {k: round(v[-1], 3) for k, v in over.items()}, "plan calls", plan, flush=True)
    for side, ratios in over.items():
        print(f"{domain} c={concurrency} {side} / ar median {statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
