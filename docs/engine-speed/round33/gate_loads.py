"""Round 33: where a gated run's time goes, load by load, against `ar`'s and against adaflash held to the plain arm:
each call's running sequences (bucketed by power of two as the gate's loads are), its arm, its milliseconds and the
tokens it committed; sides in the order ar, plain, gated, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/gate_loads.py math 64 4
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import Always, load  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding.gate import Arm  # noqa: E402

Key = tuple[int, str]  # (load bucket, arm)


def traced(engine, log: dict[Key, list[float]]) -> None:
    """Log each step's (bucket, arm) -> [calls, ms, tokens, prefill calls] into `log`."""
    scheduler, step, choose = engine.scheduler, engine.step, engine.scheduler._arm
    chosen: list = [None]

    def arm(active, admitted):
        chosen[0] = choose(active, admitted)
        return chosen[0]

    def wrapped():
        active = [s for s in scheduler.running.values() if not s.finished]
        before, waiting = sum(len(s.output) for s in active), len(scheduler.waiting)
        chosen[0] = None
        t0 = time.perf_counter()
        out = step()
        ms = (time.perf_counter() - t0) * 1000
        if active:
            entry = log[(len(active).bit_length(), chosen[0].value if chosen[0] else "-")]
            entry[0] += 1
            entry[1] += ms
            entry[2] += sum(len(s.output) for s in active) - before
            entry[3] += waiting > len(scheduler.waiting)
        return out

    scheduler._arm, engine.step = arm, wrapped


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    gate = engine.scheduler.gate
    runs = Runs(cell.ids, concurrency)
    logs: dict[str, dict[Key, list[float]]] = {side: defaultdict(lambda: [0, 0.0, 0, 0]) for side in
                                               ("ar", "plain", "gated")}
    seconds = defaultdict(float)
    for r in range(rounds):
        for side in in_turn(["ar", "plain", "gated"], r):
            engine.scheduler.gate = Always(Arm.PLAIN) if side == "plain" else gate
            log: dict[Key, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0])
            step = engine.step
            traced(engine, log)
            t0 = time.perf_counter()
            runs.rate(engine, "ar" if side == "ar" else "adaflash")
            seconds[side] += time.perf_counter() - t0
            engine.step, engine.scheduler._arm = step, type(engine.scheduler)._arm.__get__(engine.scheduler)
            for key, v in log.items():
                logs[side][key] = [a + b for a, b in zip(logs[side][key], v)]
        print(r, {side: round(seconds["ar"] / s, 3) for side, s in seconds.items()}, flush=True)
    print(f"{domain} c={concurrency}, {rounds} rounds: per load bucket (sequences from 2**(b-1)), arm: calls, ms, "
          "tokens, calls that admitted (per run)")
    for side, log in logs.items():
        print(f"{side}: {seconds[side] / rounds * 1000:.0f} ms a run")
        for (bucket, arm), (calls, ms, tokens, admits) in sorted(log.items(), reverse=True):
            print(f"  {1 << (bucket - 1):>3}+ {arm:>5}: {calls / rounds:6.1f} calls {ms / rounds:8.1f} ms "
                  f"{tokens / rounds:7.1f} tokens {tokens / ms:6.2f} tok/ms, {admits / rounds:.1f} admitting")


if __name__ == "__main__":
    main()
