"""Round 34: how much one mode's runs swing on this machine, in wall time and in the process's CPU time: `ar` on a
domain's shared prompts at a concurrency, 12 runs in a row. Why: if the swings were time taken by other tenants, CPU
time would be a quieter yardstick for the A/Bs than wall time.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round34/noise.py math 64
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell  # noqa: E402

from adaflash.decoding.sequence import Request  # noqa: E402

RUNS = 12


def main() -> None:
    domain, concurrency = sys.argv[1], int(sys.argv[2])
    cell = load_cell(domain)
    engine = cell.engine()
    walls, cpus = [], []
    for _ in range(RUNS):
        t0, c0 = time.perf_counter(), time.process_time()
        engine.generate([Request(i, MAX_TOKENS, mode="ar") for i in cell.ids], concurrency=concurrency)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    for name, xs in (("wall", walls), ("cpu", cpus)):
        print(f"{name:4s} s {[round(x, 3) for x in xs]} coefficient of variation "
              f"{statistics.stdev(xs) / statistics.mean(xs):.3f}")
    print(f"cpu / wall {statistics.median(c / w for c, w in zip(cpus, walls)):.2f}")


if __name__ == "__main__":
    main()
