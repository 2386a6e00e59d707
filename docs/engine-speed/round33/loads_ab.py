"""Round 33: gate_loads.py's breakdown, load by load, for ahead_ab.py's two sides (`all`: every sequence plans as
before; `ahead`: while a closed workload drains only the sequences within AHEAD_SLACK of the most tokens left speculate,
and the gate is told what a call brought the batch's end nearer), each with a gate of its own, beside `ar`
(`loads-ab-multilingual32.txt`). It runs at commit db8d6ae, where `Scheduler._ahead` and `Scheduler._credited` exist;
neither was kept.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/loads_ab.py \
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
from gate_loads import traced  # noqa: E402
from turns import in_turn  # noqa: E402

from ab import unpatched  # noqa: E402
from ahead_ab import patch, sides  # noqa: E402


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    engine, gates, runs = sides(domain, concurrency, 8)
    scheduler = engine.scheduler
    logs = {side: defaultdict(lambda: [0, 0.0, 0, 0]) for side in gates}
    seconds: dict[str, float] = defaultdict(float)
    for r in range(rounds):
        for side in in_turn(["ar", "all", "ahead"], r):
            if side in gates:
                scheduler.gate = gates[side]
            undo = patch(side, engine)
            log: dict = defaultdict(lambda: [0, 0.0, 0, 0])
            step = engine.step
            if side in gates:
                traced(engine, log)
            t0 = time.perf_counter()
            runs.rate(engine, "ar" if side == "ar" else "adaflash")
            seconds[side] += time.perf_counter() - t0
            engine.step = step
            undo()
            unpatched(engine, "_arm")()
            if side in gates:
                for key, v in log.items():
                    logs[side][key] = [a + b for a, b in zip(logs[side][key], v)]
    print({side: round(seconds["ar"] / s, 3) for side, s in seconds.items()})
    for side, log in logs.items():
        print(side, f"{seconds[side] / rounds * 1000:.0f} ms a run")
        for (bucket, arm), (calls, ms, tokens, admits) in sorted(log.items(), reverse=True):
            print(f"  {1 << (bucket - 1):>3}+ {arm:>5}: {calls / rounds:6.1f} calls {ms / rounds:8.1f} ms "
                  f"{tokens / rounds:7.1f} tokens {tokens / ms:6.2f} tok/ms {admits / rounds:.1f} adm")


if __name__ == "__main__":
    main()
