"""Round 31: what the gate costs where plain decoding is best: `ar`, adaflash with every call on the plain arm
(`plain`), and adaflash gated (`gated`, its gate kept from run to run as a server keeps it), each over `ar` of the same
round, in the order ar, plain, gated, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/gate_tax.py code 32 6
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import Always, load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding.gate import Arm  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    gate = engine.scheduler.gate
    over: dict[str, list[float]] = {"plain": [], "gated": []}
    runs = Runs(cell.ids, concurrency)
    for r in range(rounds):
        rates = {}
        for side in in_turn(["ar", "plain", "gated"], r):
            engine.scheduler.gate = Always(Arm.PLAIN) if side == "plain" else gate
            calls = gate.tally[Arm.PLAN].calls
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
            if side == "gated":
                plan_calls = gate.tally[Arm.PLAN].calls - calls
        for side in over:
            over[side].append(rates[side] / rates["ar"])
        print(r, {k: round(v[-1], 3) for k, v in over.items()}, "plan calls", plan_calls, flush=True)
    for side, ratios in over.items():
        print(f"{domain} c={concurrency} {side} / ar median {statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
