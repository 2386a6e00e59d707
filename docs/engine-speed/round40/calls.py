"""Round 40: every call of one adaflash run with the gate as the engine has it, logged: the load the gate was asked
about, its arm, the plain run's steps per sequence, the tokens committed, the step's ms, the yardstick's plain rate.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round40/calls.py DOMAIN C WARM

WARM: adaflash runs before the logged one, which the gate learns from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402

from adaflash.decoding.gate import PlanGate  # noqa: E402


class Logged(PlanGate):
    def __init__(self, inner: PlanGate, log: list) -> None:
        self.__dict__.update(inner.__dict__)
        self.log = log

    def choose(self, sequences: int):
        arm = super().choose(sequences)
        self.log.append({"load": sequences, "arm": arm.value})
        return arm

    def observe(self, arm, tokens, ms, plain_rate=1.0):
        load = self._load
        self.log[-1].update(tokens=tokens, ms=round(ms, 3), plain_rate=round(plain_rate, 4),
                            warmup=bool(load and load.warmup), observed=True)
        super().observe(arm, tokens, ms, plain_rate)


def main(domain: str, concurrency: int, warm: int) -> None:
    cell = load(domain)
    engine = cell.engine()
    for _ in range(warm):  # the gate learns over runs, as bench_gate's engine keeps it
        cell.tokens_per_s(engine, "adaflash", concurrency)
    log: list = []
    sched = engine.scheduler
    sched.gate = Logged(sched.gate, log)
    runs_of = sched._runs

    def runs(active, arm):
        r = runs_of(active, arm)
        if log:
            log[-1]["runs"] = None if r is None else sorted(r)
        return r

    sched._runs = runs
    tps = cell.tokens_per_s(engine, "adaflash", concurrency)
    print(json.dumps({"tokens_per_s": round(tps, 1), "calls": log}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
