"""Round 31: the plan arm's blocks at 32 sequence steps (the committed gate) against longer ones, at one load: `ar`,
adaflash gated with each block size (a gate of its own each, kept from run to run as a server keeps it) and adaflash
planning every step (`no-gate`), over `ar` of the same round, the order reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/block_ab.py broad:translation 8 4 128
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.gate import Arm, PlanGate  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sizes = [gate_module.BLOCK_SEQUENCE_STEPS, *map(int, sys.argv[4:])]
    cell = load(domain)
    ids = cell.ids[:16] if concurrency == 1 else cell.ids  # as bench_gate's LOW_LOAD_PROMPTS
    engine = cell.engine()
    arms = engine.scheduler.gate.arms
    gates = {f"gated-{n}": (n, PlanGate(arms=arms)) for n in sizes}
    sides = ["ar", *gates, "no-gate"]
    over: dict[str, list[float]] = {side: [] for side in sides[1:]}
    plan_share: dict[str, list[float]] = {side: [] for side in gates}
    runs = Runs(ids, concurrency)
    for r in range(rounds):
        rates = {}
        for side in in_turn(sides, r):
            n, gate = gates.get(side, (sizes[0], None))
            gate_module.BLOCK_SEQUENCE_STEPS = n
            engine.scheduler.gate = gate
            before = {arm: t.calls for arm, t in gate.tally.items()} if gate else {}
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
            if gate:
                calls = {arm: gate.tally[arm].calls - before[arm] for arm in before}
                plan_share[side].append(calls[Arm.PLAN] / max(1, sum(calls.values())))
        for side in over:
            over[side].append(rates[side] / rates["ar"])
        print(r, {k: round(v[-1], 3) for k, v in over.items()}, flush=True)
    for side, ratios in over.items():
        share = f", plan arm's share of calls {statistics.mean(plan_share[side]):.2f}" if side in plan_share else ""
        print(f"{domain} c={concurrency} {side} / ar median {statistics.median(ratios):.3f}{share}", flush=True)


if __name__ == "__main__":
    main()
