"""Round 33: bench_gate's summary of the rounds of one or more of its JSON files run on the same code, pooled (each
file's rounds kept apart): per cell, the median of adaflash's ratios to each round's best fixed mode and its bootstrap
interval (`bench_gate.median_interval`).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/intervals.py \
        docs/engine-speed/round33/gate-high-load-12.json docs/engine-speed/round32/gate-shared.json
"""

from __future__ import annotations

import json
import sys

from bench_gate import INTERVAL, summarise


def pooled_rows(paths: list[str]) -> list[dict]:
    """Every file's rows, each file's rounds numbered after the previous files'."""
    rows: list[dict] = []
    for path in paths:
        offset = 1 + max((r["repeat"] for r in rows), default=-1)
        rows += [{**row, "repeat": row["repeat"] + offset} for row in json.load(open(path))["rows"]]
    return rows


def main() -> None:
    print(f"{'cell':22s} rounds  median  {INTERVAL:.0%} interval")
    for cell in summarise(pooled_rows(sys.argv[1:])):
        interval = cell["adaflash_round_median_interval"]
        print(f"{cell['domain'] + ' c=' + str(cell['concurrency']):22s} {len(cell['adaflash_over_best_by_round']):6d}"
              f"  {interval['median']:.3f}  {interval['low']:.3f}-{interval['high']:.3f}")


if __name__ == "__main__":
    main()
