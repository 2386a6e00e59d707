"""Round 33's A/B records share this: `ar` and two adaflash sides, each side with a gate of its own kept from run to run
as a server keeps it, taking turns (reversed every other round), each over `ar` of the same round; outputs equal.
A side's difference is a patch applied before its run and undone after it."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm, PlanGate  # noqa: E402
from adaflash.decoding.scheduler import Scheduler  # noqa: E402

Patch = Callable[[str, Engine], Callable[[], None]]  # (side, engine) -> undo


def unpatched(engine: Engine, *names: str) -> Callable[[], None]:
    """An undo that gives the scheduler back the class's own methods `names` (those the checkout's class has)."""
    scheduler = engine.scheduler

    def undo() -> None:
        for name in names:
            if hasattr(Scheduler, name):
                setattr(scheduler, name, getattr(Scheduler, name).__get__(scheduler))

    return undo


def draining(flag: dict[str, bool], side: str) -> Patch:
    """A patch under which `side`'s steps first set flag["now"] to whether the workload drains (no request waits);
    the other side's never do, and its undo clears the flag."""

    def patch(name: str, engine: Engine) -> Callable[[], None]:
        step = engine.step

        def flagged_step():
            flag["now"] = not engine.scheduler.waiting
            return step()

        if name == side:
            engine.step = flagged_step

        def undo() -> None:
            engine.step, flag["now"] = step, False

        return undo

    return patch


def compare(sides: tuple[str, str], patch: Patch) -> None:
    """argv: domain, concurrency, rounds. Prints each round's ratios and the sides' plan calls, then the medians."""
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    gates = {side: PlanGate(arms=engine.scheduler.gate.arms) for side in sides}
    over: dict[str, list[float]] = {side: [] for side in sides}
    runs = Runs(cell.ids, concurrency)
    for r in range(rounds):
        rates, plan = {}, {}
        for side in in_turn(["ar", *sides], r):
            if side == "ar":
                rates[side] = runs.rate(engine, "ar")
                continue
            engine.scheduler.gate = gates[side]
            calls = gates[side].tally[Arm.PLAN].calls
            undo = patch(side, engine)
            rates[side] = runs.rate(engine, "adaflash")
            undo()
            plan[side] = gates[side].tally[Arm.PLAN].calls - calls
        for side in over:
            over[side].append(rates[side] / rates["ar"])
        print(r, {k: round(v[-1], 3) for k, v in over.items()}, "plan calls", plan, flush=True)
    for side, ratios in over.items():
        print(f"{domain} c={concurrency} {side} / ar median {statistics.median(ratios):.3f}", flush=True)
