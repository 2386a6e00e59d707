"""Round 27: bench_gate's order with and without an untimed `ngram` run between `dflash` and adaflash, alternating
round by round in one process (one engine, as bench_gate's `ar`, `ngram`, `dflash` and adaflash share one), code c=8:
whether a `dflash` run just before costs adaflash's timed run (output in spacer-ab.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/spacer_ab.py code 8 6
"""

from __future__ import annotations

import statistics
import sys

from cell import load_cell


def main() -> None:
    domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load_cell(domain)
    engine = cell.engine()

    def run(mode: str) -> float:
        return cell.tokens_per_s(engine, mode, c)

    ratios: dict[str, list[float]] = {"right after dflash": [], "ngram between": []}
    for repeat in range(2 * rounds):
        spaced = repeat % 2 == 1
        ar = run("ar")
        run("ngram")
        run("dflash")
        if spaced:
            run("ngram")
        key = "ngram between" if spaced else "right after dflash"
        ratios[key].append(run("adaflash") / ar)
        print(key, round(ratios[key][-1], 3), flush=True)
    print({k: round(statistics.median(v), 3) for k, v in ratios.items()})


if __name__ == "__main__":
    main()
