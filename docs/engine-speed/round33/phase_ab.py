"""Round 33: ahead_ab.py's sides split by phase (run at commit db8d6ae with the pace rule of pace-uncapped.diff, the
drain credit still capped at the tokens committed, slack 8): calls and milliseconds a run while requests still wait
(`steady`) and once none does (`drain`), beside `ar`; and each gate's rates at the 32-63 and 16-31 loads at the end
(`phase-ab-multilingual32.txt`).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/phase_ab.py multilingual 32 4
"""

import sys
import time
from collections import defaultdict
sys.path.insert(0, "docs/engine-speed/round30"); sys.path.insert(0, "docs/engine-speed/round31")
from cells import load
from turns import Runs, in_turn
from adaflash.decoding.gate import PlanGate
from adaflash.decoding import scheduler as sm
from adaflash.decoding.scheduler import Scheduler
domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sm.AHEAD_SLACK = 8
cell = load(domain); engine = cell.engine(); sch = engine.scheduler; arms = sch.gate.arms
gates = {"all": PlanGate(arms=arms), "ahead": PlanGate(arms=arms)}
runs = Runs(cell.ids, c)
acc = {s: defaultdict(float) for s in ["ar", "all", "ahead"]}
for r in range(rounds):
    for side in in_turn(["ar", "all", "ahead"], r):
        if side in gates: sch.gate = gates[side]
        if side == "all":
            sch._ahead = lambda a: set(); sch._credited = lambda a, t, h: t
        step = engine.step
        def wrapped(side=side, step=step):
            phase = "steady" if sch.waiting else "drain"
            t0 = time.perf_counter(); out = step(); ms = (time.perf_counter() - t0) * 1000
            acc[side][phase + " ms"] += ms; acc[side][phase + " calls"] += 1
            return out
        engine.step = wrapped
        runs.rate(engine, "ar" if side == "ar" else "adaflash")
        engine.step = step
        sch._ahead = Scheduler._ahead.__get__(sch); sch._credited = Scheduler._credited.__get__(sch)
for side, d in acc.items():
    print(side, {k: round(v / rounds, 1) for k, v in sorted(d.items())})
for side in gates:
    print(side, "gate 32-load rates", {a.value: r and round(r, 3) for a, r in gates[side].loads.get(6).rates.items()} if 6 in gates[side].loads else None,
          "16-load", {a.value: r and round(r, 3) for a, r in gates[side].loads[5].rates.items()} if 5 in gates[side].loads else None)
