"""Round 33: the share of a run spent in Python's garbage collector, by generation, for `ar` and adaflash, as the
engine runs now (`as is`) and with the objects alive after the first round frozen out of the collector's scans
(`gc.freeze`); sides in turn, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/gc_share.py math 64 6
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402


class Collections:
    """Seconds and counts of collections per generation, from gc.callbacks."""

    def __init__(self) -> None:
        self.seconds, self.count, self._start = defaultdict(float), defaultdict(int), 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds[info["generation"]] += time.perf_counter() - self._start
            self.count[info["generation"]] += 1

    def reset(self) -> None:
        self.seconds.clear()
        self.count.clear()


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    runs = Runs(cell.ids, concurrency)
    tracked = Collections()
    for frozen in (False, True):
        if frozen:
            gc.collect()
            gc.freeze()
        shares: dict[str, list[float]] = defaultdict(list)
        rates: dict[str, list[float]] = defaultdict(list)
        for r in range(rounds):
            for mode in in_turn(["ar", "adaflash"], r):
                tracked.reset()
                t0 = time.perf_counter()
                rates[mode].append(runs.rate(engine, mode))
                wall = time.perf_counter() - t0
                shares[mode].append(sum(tracked.seconds.values()) / wall)
                print("frozen" if frozen else "as is", r, mode, f"{rates[mode][-1]:.0f} tok/s",
                      f"gc {shares[mode][-1]:.2%}", dict(tracked.count),
                      {g: round(s * 1000, 1) for g, s in tracked.seconds.items()}, "ms", flush=True)
        for mode in ("ar", "adaflash"):
            print(f"{'frozen' if frozen else 'as is'} {domain} c={concurrency} {mode}: gc share median "
                  f"{statistics.median(shares[mode]):.2%} (max {max(shares[mode]):.2%}), tok/s median "
                  f"{statistics.median(rates[mode]):.0f}", flush=True)
        print(f"adaflash / ar median {statistics.median(a / b for a, b in zip(rates['adaflash'], rates['ar'])):.3f}",
              flush=True)


if __name__ == "__main__":
    main()
