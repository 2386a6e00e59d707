"""Round 30: what adaflash's plain arm costs over `ar` under load: `ar`, adaflash with every call on the plain arm (its
sequences still keep the target's features for the drafter), and the same without a drafter (no features kept), on
one engine, alternating by round; tokens per second over `ar`'s, every output equal (quoted in the round's note as a
measurement for the next step).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/plain_arm.py code 32 4
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cells import MAX_TOKENS, Always, load  # noqa: E402

from adaflash.decoding.gate import Arm  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    sch = engine.scheduler
    over: dict[str, list[float]] = {"plain arm": [], "plain arm, no features": []}
    reference = None
    for r in range(rounds):
        rates = {}
        for side in ["ar", *(list(over) if r % 2 == 0 else list(over)[::-1])]:
            sch.gate = Always(Arm.PLAIN)
            sch.has_drafter = side != "plain arm, no features"
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode="ar" if side == "ar" else "adaflash")
                                    for i in cell.ids], concurrency=concurrency)
            rates[side] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
            reference = reference or [s.output for s in seqs]
            assert [s.output for s in seqs] == reference, "an output differs"
        for side in over:
            over[side].append(rates[side] / rates["ar"])
    for side, ratios in over.items():
        print(f"{domain} c={concurrency} {side} / ar {[round(x, 3) for x in ratios]}, median "
              f"{statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
