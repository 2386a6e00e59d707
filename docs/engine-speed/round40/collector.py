"""Round 40: whether Python's collector is what the features' views cost a plain step. adaflash held plain against
`ar` in lockstep (round 38's method: `../round38/lockstep.py`, `../round38/plain_overhead.py`), with the collector
on (as served) or off for the whole process (`off` as the third argument).
  ar, ar2   `ar` twice: what two identical sides differ by;
  plain     adaflash held plain: features captured and kept as views until a draft;
  nocap     adaflash held plain capturing nothing.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round40/collector.py math 64 on 8
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "round38"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402
from least_times import report  # noqa: E402
from lockstep import Lockstep, Side  # noqa: E402
from plain_overhead import held, one_step, step_times, uncaptured  # noqa: E402


def main() -> None:
    domain, concurrency, collector, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    if collector == "off":
        gc.disable()
    sides = {"ar": Side("ar", one_step), "ar2": Side("ar", one_step), "plain": Side("adaflash", held),
             "nocap": Side("adaflash", uncaptured)}
    lock = Lockstep(load(domain), sides, concurrency)
    counts = gc.get_count()
    runs = [step_times(lock) for _ in range(rounds)]
    report(domain, concurrency, runs, list(sides),
           f"collector {collector} (counts {counts} -> {gc.get_count()}, "
           f"collections {[s['collections'] for s in gc.get_stats()]}), ")


if __name__ == "__main__":
    main()
