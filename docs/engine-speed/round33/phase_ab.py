"""Round 33: ahead_ab.py's sides split by phase (run at commit db8d6ae with the pace rule of pace-uncapped.diff, the
drain credit still capped at the tokens committed, slack 8): calls and milliseconds a run while requests still wait
(`steady`) and once none does (`drain`), beside `ar`; and each gate's rates at the 32-63 and 16-31 loads at the end
(`phase-ab-multilingual32.txt`).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/phase_ab.py \
        multilingual 32 4
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
sys.path.insert(0, str(Path(__file__).parent))
from ahead_ab import patch, sides  # noqa: E402
from turns import in_turn  # noqa: E402


LOADS = {6: "32-load", 5: "16-load"}  # gate load buckets whose rates are printed


def phased(engine, scheduler, tally: dict[str, float]):
    """engine.step, adding each call's milliseconds and count to `tally` by phase: requests waiting or not."""
    step = engine.step

    def wrapped():
        phase = "steady" if scheduler.waiting else "drain"
        t0 = time.perf_counter()
        out = step()
        tally[phase + " ms"] += (time.perf_counter() - t0) * 1000
        tally[phase + " calls"] += 1
        return out

    return wrapped


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    engine, gates, runs = sides(domain, concurrency, 8)
    scheduler = engine.scheduler
    tallies = {side: defaultdict(float) for side in ("ar", "all", "ahead")}
    for r in range(rounds):
        for side in in_turn(["ar", "all", "ahead"], r):
            if side in gates:
                scheduler.gate = gates[side]
            undo = patch(side, engine)
            step = engine.step
            engine.step = phased(engine, scheduler, tallies[side])
            runs.rate(engine, "ar" if side == "ar" else "adaflash")
            engine.step = step
            undo()
    for side, tally in tallies.items():
        print(side, {k: round(v / rounds, 1) for k, v in sorted(tally.items())})
    for side, gate in gates.items():
        print(side, *(f"{name} rates {({a.value: r and round(r, 3) for a, r in gate.loads[b].rates.items()})}"
                      for b, name in LOADS.items() if b in gate.loads))


if __name__ == "__main__":
    main()
