"""Round 33: gate_loads.py's breakdown, load by load, for ahead_ab.py's two sides (`all`: every sequence plans as
before; `ahead`: while a closed workload drains only the sequences within AHEAD_SLACK of the most tokens left speculate,
and the gate is told what a call brought the batch's end nearer), each with a gate of its own, beside `ar`. It runs at
commit db8d6ae, where `Scheduler._ahead` and `Scheduler._credited` exist; neither was kept.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/loads_ab.py multilingual 32 4
"""

import sys, time
from collections import defaultdict
sys.path.insert(0, "docs/engine-speed/round30"); sys.path.insert(0, "docs/engine-speed/round31"); sys.path.insert(0, "docs/engine-speed/round33")
from cells import load
from turns import Runs, in_turn
from gate_loads import traced
from adaflash.decoding.gate import PlanGate
from adaflash.decoding import scheduler as sm
from adaflash.decoding.scheduler import Scheduler
domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sm.AHEAD_SLACK = 8
cell = load(domain); engine = cell.engine(); sch = engine.scheduler; arms = sch.gate.arms
gates = {"all": PlanGate(arms=arms), "ahead": PlanGate(arms=arms)}
runs = Runs(cell.ids, c)
logs = {s: defaultdict(lambda: [0, 0.0, 0, 0]) for s in gates}
secs = defaultdict(float)
for r in range(rounds):
    for side in in_turn(["ar", "all", "ahead"], r):
        if side in gates: sch.gate = gates[side]
        if side == "all":
            sch._ahead = lambda a: set(); sch._credited = lambda a, t, h: t
        log = defaultdict(lambda: [0, 0.0, 0, 0]); step = engine.step
        if side in gates: traced(engine, log)
        t0 = time.perf_counter(); runs.rate(engine, "ar" if side == "ar" else "adaflash"); secs[side] += time.perf_counter() - t0
        engine.step = step; sch._arm = Scheduler._arm.__get__(sch)
        sch._ahead = Scheduler._ahead.__get__(sch); sch._credited = Scheduler._credited.__get__(sch)
        if side in gates:
            for k, v in log.items(): logs[side][k] = [a + b for a, b in zip(logs[side][k], v)]
print({s: round(secs["ar"] / v, 3) for s, v in secs.items()})
for side, log in logs.items():
    print(side, f"{secs[side]/rounds*1000:.0f} ms a run")
    for (b, arm), (calls, ms, tokens, adm) in sorted(log.items(), reverse=True):
        print(f"  {1 << (b-1):>3}+ {arm:>5}: {calls/rounds:6.1f} calls {ms/rounds:8.1f} ms {tokens/rounds:7.1f} tokens {tokens/ms:6.2f} tok/ms {adm/rounds:.1f} adm")
