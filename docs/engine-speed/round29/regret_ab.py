"""Round 29: the gate's regret budget at one sequence, as it is (EXPLORE_REGRET 1%) and at a quarter of it, each side
with its own gate on one engine, alternating by round, `ngram` first in every round: adaflash's tokens per second over
`ngram`'s, the calls each side ran on the plain arm, and every output equal (output in regret-ab.txt). A measurement
for the next step, not a change.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/regret_ab.py chat 6
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from adaflash.decoding import gate
from adaflash.decoding.gate import Arm
from adaflash.decoding.sequence import Request

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell  # noqa: E402


def main() -> None:
    domain, rounds = sys.argv[1], int(sys.argv[2])
    cell = load_cell(domain)
    engine = cell.engine()
    sch = engine.scheduler
    ids = cell.ids[:16]
    sides = {0.01: sch.gate, 0.0025: gate.PlanGate(arms=sch.gate.arms)}
    over: dict[float, list[float]] = {k: [] for k in sides}
    plain: dict[float, int] = {k: 0 for k in sides}
    reference = None
    for r in range(rounds):
        rates = {}
        for side in ["ngram", *(list(sides) if r % 2 == 0 else list(sides)[::-1])]:
            if side != "ngram":
                sch.gate, gate.EXPLORE_REGRET = sides[side], side
                before = sides[side].tally[Arm.PLAIN].calls
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode="ngram" if side == "ngram" else "adaflash")
                                    for i in ids], concurrency=1)
            rates[side] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
            reference = reference or [s.output for s in seqs]
            assert [s.output for s in seqs] == reference, "an output differs"
            if side != "ngram":
                plain[side] += sides[side].tally[Arm.PLAIN].calls - before
        for side in sides:
            over[side].append(rates[side] / rates["ngram"])
    for side, ratios in over.items():
        print(f"{domain} c=1 regret {side}: adaflash / ngram {[round(x, 3) for x in ratios]}, median "
              f"{statistics.median(ratios):.3f}; plain calls {plain[side]}", flush=True)


if __name__ == "__main__":
    main()
