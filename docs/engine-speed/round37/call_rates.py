"""Round 37: each call's time against the cost table's plain decoding step at its sequences (`CostModel.plain_rate`),
for `ar` and for gated adaflash taking turns (reversed every other round, a gate kept from run to run), by side, arm
and sequences; outputs equal. A ratio above 1: the call committed more than plain decoding's table step would in its
time.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/call_rates.py math 64 6
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

BANDS = (1, 4, 8, 12, 16, 20, 24, 28, 32, 40, 48, 56, 64)


def band(n: int) -> int:
    return max(b for b in BANDS if b <= n)


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    scheduler, step, choose, cost = engine.scheduler, engine.step, engine.scheduler._arm, engine.cost
    log: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    state = {"side": "ar", "arm": None}

    def arm(active, admitted):
        state["arm"] = choose(active, admitted)
        return state["arm"]

    def traced():
        active = [s for s in scheduler.running.values() if not s.finished]
        before, waiting = sum(len(s.output) for s in active), len(scheduler.waiting)
        state["arm"] = None
        t0 = time.perf_counter()
        out = step()
        ms = (time.perf_counter() - t0) * 1000
        admitted = waiting > len(scheduler.waiting) or any(s.admitted_at and s.admitted_at >= t0 for s in out)
        if active and not admitted:
            entry = log[(state["side"], state["arm"].value if state["arm"] else "-", band(len(active)))]
            entry[0] += 1
            entry[1] += ms
            entry[2] += sum(len(s.output) for s in active) - before
            entry[3] += ms * cost.plain_rate(len(active))
        return out

    scheduler._arm, engine.step = arm, traced
    runs = Runs(cell.ids, concurrency)
    for r in range(rounds):
        for side in in_turn(["ar", "adaflash"], r):
            state["side"] = side
            runs.rate(engine, side)
        print("round", r, flush=True)
    print(f"{domain} c={concurrency}, {rounds} rounds, calls that admit nothing: per run, by side, arm and sequences "
          "(from): calls, ms a call, tokens a call, rate over the table's plain step")
    for (side, arm_, n), (calls, ms, tokens, table) in sorted(log.items(), key=lambda kv: (kv[0][0], -kv[0][2], kv[0][1])):
        print(f"  {side:>8} {arm_:>5} {n:>3}+: {calls / rounds:6.1f} calls {ms / calls:6.2f} ms {tokens / calls:6.1f} "
              f"tokens {tokens / table:6.3f}")


if __name__ == "__main__":
    main()
