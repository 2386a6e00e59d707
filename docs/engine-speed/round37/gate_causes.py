"""Round 37: why a gated run's calls go to the plan arm, load by load. Each block of the gate is classed by why its arm
was chosen: `first` (a load's first measure of an arm), `confirm` (an arm measured in fewer than CONFIRM_BLOCKS
blocks, tried again), `explore` (an arm behind, tried once its regret allows), `challenge` (a second block after a
try that put the arm past the leader), `lead` (the arm leads). `ar` and gated adaflash take turns (reversed every
other round), a gate kept from run to run; outputs equal. Per run: calls by load bucket, arm and cause.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/gate_causes.py chat 32 6
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import gate as gate_module  # noqa: E402
from adaflash.decoding.gate import CONFIRM_BLOCKS, PlanGate  # noqa: E402

Key = tuple[int, str, str]  # (load bucket, arm, cause)


def classify(load: gate_module._Load) -> str:
    """Why the load's block under way runs its arm (called right after the arm was chosen)."""
    if load.confirming:
        return "challenge"
    if load.blocks[load.arm] == 0:
        return "first"
    if load.arm is load.leading:
        return "lead"
    return "confirm" if load.blocks[load.arm] < CONFIRM_BLOCKS else "explore"


def traced(gate: PlanGate, calls: dict[Key, int]) -> None:
    """Count each call the gate is told of under its load, arm and the cause of its block."""
    end_block, observe = gate_module._Load.end_block, gate.observe
    causes: dict[int, str] = {}

    def end(load: gate_module._Load) -> None:
        end_block(load)
        causes[id(load)] = classify(load)

    gate_module._Load.end_block = end

    def observed(arm, tokens, ms, plain_rate=1.0):
        load = gate._load
        if load is not None and arm is load.arm and ms > 0:
            bucket = next(b for b, v in gate.loads.items() if v is load)
            calls[(bucket, arm.value, causes.get(id(load), "first"))] += 1
        observe(arm, tokens, ms, plain_rate)

    gate.observe = observed


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    calls: dict[Key, int] = defaultdict(int)
    traced(engine.scheduler.gate, calls)
    runs, ratios = Runs(cell.ids, concurrency), []
    for r in range(rounds):
        rates = {side: runs.rate(engine, side) for side in in_turn(["ar", "adaflash"], r)}
        ratios.append(rates["adaflash"] / rates["ar"])
        print(r, round(ratios[-1], 3), flush=True)
    print(f"{domain} c={concurrency}, {rounds} rounds: adaflash / ar median {statistics.median(ratios):.3f}; "
          "observed calls a run by load (sequences from 2**(b-1)), arm, cause")
    for (bucket, arm, cause), n in sorted(calls.items(), reverse=True):
        print(f"  {1 << (bucket - 1):>3}+ {arm:>5} {cause:>9}: {n / rounds:6.1f}")


if __name__ == "__main__":
    main()
