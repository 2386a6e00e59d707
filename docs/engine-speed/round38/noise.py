"""Round 38: how much one run's time swings on this machine, step by step. `ar` runs the chat prompts at 32 sequences
ROUNDS times; each step's time is set against the least that step took in any round (the steps of `ar` are alike from
run to run). Per round: its total, the excess over the least times, the median step's excess and the five largest.
`--no-gc`: Python's collector frozen and off throughout (whether the stalls are its own).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/noise.py 6 [--no-gc]
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, load  # noqa: E402

from adaflash.decoding.sequence import Request  # noqa: E402


def main() -> None:
    rounds = int(sys.argv[1])
    cell = load("chat")
    engine = cell.engine()
    if "--no-gc" in sys.argv:
        gc.collect()
        gc.freeze()
        gc.disable()
    runs = []
    for _ in range(rounds):
        engine.scheduler.max_active = 32
        for ids in cell.ids:
            engine.submit(Request(ids, MAX_TOKENS, mode="ar"))
        times = []
        while engine.has_work:
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        runs.append(times)
    n = min(map(len, runs))
    least = [min(r[i] for r in runs) for i in range(n)]
    print(f"{rounds} runs of {n} steps; sum of each step's least time {sum(least):.3f} s")
    for r in runs:
        excess = sorted(r[i] - least[i] for i in range(n))
        print(f"total {sum(r):.3f} s  excess {sum(excess):.3f} s  median step's {1000 * statistics.median(excess):.2f} ms"
              f"  largest (ms) {[round(1000 * x, 1) for x in excess[-5:]]}")


if __name__ == "__main__":
    main()
