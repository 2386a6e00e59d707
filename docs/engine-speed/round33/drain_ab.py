"""Round 33: the gate credited by how much nearer a draining batch's end a call brought (`drain`), against the gate
told every token committed (`tokens`, round 32), each gate kept from run to run as a server keeps it, each over `ar`
of the same round, in the order ar, tokens, drain, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/drain_ab.py math 64 6

It runs at commit 2f31d96, where `Scheduler._credited` exists; the change was not kept (drain-ab.txt).
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
from adaflash.decoding.scheduler import Scheduler  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    scheduler = engine.scheduler
    arms = scheduler.gate.arms
    gates = {"tokens": PlanGate(arms=arms), "drain": PlanGate(arms=arms)}
    over: dict[str, list[float]] = {side: [] for side in gates}
    runs = Runs(cell.ids, concurrency)
    for r in range(rounds):
        rates, plan = {}, {}
        for side in in_turn(["ar", "tokens", "drain"], r):
            if side in gates:
                scheduler.gate = gates[side]
                calls = gates[side].tally[Arm.PLAN].calls
            if side == "tokens":
                scheduler._credited = lambda active, tokens, horizon: tokens
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
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
