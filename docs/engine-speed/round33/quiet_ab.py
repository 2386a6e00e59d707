"""Round 33: a gate that tries no arm but the leader while a closed workload drains (`quiet`: no request waits; an
arm's first CONFIRM_BLOCKS blocks still run), against the gate as it is (`gate`); each side with a gate of its own
kept from run to run, each over `ar` of the same round, in the order ar, gate, quiet, reversed every other round;
outputs equal. The quiet gate is patched in here; the engine is unchanged.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/quiet_ab.py math 64 6
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.gate import Arm, PlanGate  # noqa: E402

QUIET = {"now": False}  # set before each step of the quiet side: whether the workload drains
overdue = gate_module._Load.overdue


def quiet_overdue(load: gate_module._Load, leader: Arm) -> Arm | None:
    """`_Load.overdue`, but none while QUIET says the workload drains, once every arm has its first blocks."""
    if QUIET["now"] and all(n >= gate_module.CONFIRM_BLOCKS for n in load.blocks.values()):
        return None
    return overdue(load, leader)


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    gate_module._Load.overdue = quiet_overdue
    cell = load(domain)
    engine = cell.engine()
    scheduler = engine.scheduler
    gates = {"gate": PlanGate(arms=scheduler.gate.arms), "quiet": PlanGate(arms=scheduler.gate.arms)}
    over: dict[str, list[float]] = {side: [] for side in gates}
    runs = Runs(cell.ids, concurrency)
    step = engine.step

    def quiet_step():
        QUIET["now"] = not scheduler.waiting
        return step()

    for r in range(rounds):
        rates, plan = {}, {}
        for side in in_turn(["ar", "gate", "quiet"], r):
            if side in gates:
                scheduler.gate = gates[side]
                calls = gates[side].tally[Arm.PLAN].calls
            engine.step = quiet_step if side == "quiet" else step
            QUIET["now"] = False
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
            engine.step = step
            if side in gates:
                plan[side] = gates[side].tally[Arm.PLAN].calls - calls
        for side in over:
            over[side].append(rates[side] / rates["ar"])
        print(r, {k: round(v[-1], 3) for k, v in over.items()}, "plan calls", plan, flush=True)
    for side, ratios in over.items():
        print(f"{domain} c={concurrency} {side} / ar median {statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
