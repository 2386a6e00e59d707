"""Round 28: the gate with the copy arm (plan, copy, plain: what graphed hosts run) against without it (plan, plain:
the CPU's since round 25) on one engine, each gate kept for its own runs and swapped in before each, `ar` and `ngram`
beside them, rounds alternating the two gates' order; every output equal to `ar`'s (output in copy-arm-ab.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round28/copy_arm_ab.py code 1,8 4
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from adaflash.decoding.gate import ARMS, Arm, PlanGate
from adaflash.decoding.sequence import Request

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell  # noqa: E402


def main() -> None:
    domain, concurrencies, rounds = sys.argv[1], [int(c) for c in sys.argv[2].split(",")], int(sys.argv[3])
    cell = load_cell(domain)
    engine = cell.engine()
    for c in concurrencies:
        ids = cell.ids[:16] if c == 1 else cell.ids
        gates = {"two arms": PlanGate(arms=(Arm.PLAN, Arm.PLAIN)), "three arms": PlanGate(arms=ARMS)}
        rates: dict[str, list[float]] = {k: [] for k in ("ar", "ngram", *gates)}

        def run(mode: str) -> tuple[float, list[list[int]]]:
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=c)
            return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0), [s.output for s in seqs]

        for r in range(rounds):
            rate, reference = run("ar")
            rates["ar"].append(rate)
            rates["ngram"].append(run("ngram")[0])
            for name in (("two arms", "three arms") if r % 2 == 0 else ("three arms", "two arms")):
                engine.scheduler.gate = gates[name]
                rate, outputs = run("adaflash")
                assert outputs == reference, "an output departs from ar's"
                rates[name].append(rate)
        best = [max(a, n) for a, n in zip(rates["ar"], rates["ngram"])]
        shares = {name: {a.value: g.tally[a].calls for a in g.arms} for name, g in gates.items()}
        print(f"{domain} c={c}: medians " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in rates.items())
              + "; over the best fixed mode by round: " + "; ".join(
                  f"{name} {[round(x / b, 3) for x, b in zip(rates[name], best)]}" for name in gates)
              + f"; three over two, median of rounds "
              f"{statistics.median(t / w for t, w in zip(rates['three arms'], rates['two arms'])):.3f}; calls {shares}",
              flush=True)


if __name__ == "__main__":
    main()
