"""Round 33: how sure a cell's verdict is. For each cell of one or more `bench_gate.py` JSON files run on the same code
(their rounds pooled): adaflash over the cell's best fixed mode (the fixed mode with the highest median over every
round), round by round (the variants of a round run back to back, so the machine's drift cancels within it); the
median of those ratios, its 90% bootstrap interval (rounds resampled with replacement, 10,000 times, seed 0) and the
share of resamples whose median reaches 0.97.

    .venv/bin/python docs/engine-speed/round33/intervals.py docs/engine-speed/round33/gate-high-load-12.json \
        docs/engine-speed/round32/gate-shared.json
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

import numpy as np

FIXED = ("ar", "ngram", "dflash")
BAR = 0.97


def rounds_by_cell(paths: list[str]) -> dict[tuple[str, int], list[dict[str, float]]]:
    """Per (domain, concurrency), each round's tokens/s by variant, from every file."""
    cells: dict[tuple[str, int], dict[tuple[str, int], dict[str, float]]] = defaultdict(dict)
    for path in paths:
        for row in json.load(open(path))["rows"]:
            cells[(row["domain"], row["concurrency"])].setdefault((path, row["repeat"]), {})[row["variant"]] = \
                row["tokens_per_s"]
    return {cell: list(rounds.values()) for cell, rounds in sorted(cells.items())}


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"{'cell':22s} rounds best  median  90% interval   share >= {BAR}")
    for (domain, c), rounds in rounds_by_cell(sys.argv[1:]).items():
        best = max(FIXED, key=lambda v: statistics.median(r[v] for r in rounds))
        ratios = np.array([r["adaflash"] / r[best] for r in rounds])
        medians = np.median(ratios[rng.integers(0, len(ratios), (10_000, len(ratios)))], axis=1)
        low, high = np.percentile(medians, [5, 95])
        print(f"{domain + ' c=' + str(c):22s} {len(ratios):6d} {best:5s} {np.median(ratios):.3f}  "
              f"{low:.3f}-{high:.3f}    {np.mean(medians >= BAR):.2f}")


if __name__ == "__main__":
    main()
