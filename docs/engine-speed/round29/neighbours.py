"""Round 29: adaflash at one sequence on one engine, run right after `ngram` alone or right after `ngram` and `dflash`
(bench_gate.py's order runs `ar`, `ngram`, `dflash`, then adaflash on one engine), alternating by round: whether the
fixed modes' runs just before change adaflash's speed (they teach the engine-wide acceptance estimates and the live
cost scales that adaflash's plan reads). Tokens per second over `ngram`'s in the same round, and every output equal
(output in neighbours.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/neighbours.py prose 6
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from adaflash.decoding.sequence import Request

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell  # noqa: E402


def main() -> None:
    domain, rounds = sys.argv[1], int(sys.argv[2])
    cell = load_cell(domain)
    engine = cell.engine()
    ids = cell.ids[:16]
    over: dict[str, list[float]] = {"after ngram": [], "after ngram, dflash": []}
    reference = None
    for r in range(rounds):
        for side in list(over) if r % 2 == 0 else list(over)[::-1]:
            rates = {}
            for mode in ("ngram", "dflash", "adaflash") if "dflash" in side else ("ngram", "adaflash"):
                t0 = time.perf_counter()
                seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=1)
                rates[mode] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
                reference = reference or [s.output for s in seqs]
                assert [s.output for s in seqs] == reference, "an output differs"
            over[side].append(rates["adaflash"] / rates["ngram"])
    for side, ratios in over.items():
        print(f"{domain} c=1 adaflash / ngram, {side}: {[round(x, 3) for x in ratios]}, median "
              f"{statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
