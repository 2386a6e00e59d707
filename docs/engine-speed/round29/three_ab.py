"""Round 29: three sides in one engine, alternating order by round, with `ngram` first in each round: the planner and
policy at d3449c8 with plain blocks as long as the plan arm's (before), this checkout's planner and policy with those
long plain blocks, and this checkout whole (plain blocks of 8 sequence steps); tokens per second over `before`'s by
round (output appended to plan-ab-c8.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/three_ab.py code 8 6 [ar]

(the fourth argument: the fixed mode run first in each round and compared against, `ngram` by default)
"""
import sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent)); sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from plan_ab import planner_at
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
from adaflash.decoding import gate
domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cell = load_cell(domain)
engine = cell.engine()
sch = engine.scheduler
old = planner_at("d3449c8", sch.planner)
from adaflash.decoding.planner import Planner
from adaflash.decoding.policy import LengthController
new2 = Planner(LengthController(sch.planner.controller.cost, sch.planner.controller.block_size))
sides = {"before": (old, gate.PlanGate(arms=sch.gate.arms), 32), "newplan-oldgate": (new2, gate.PlanGate(arms=sch.gate.arms), 32),
         "after": (sch.planner, sch.gate, 8)}
REF = sys.argv[4] if len(sys.argv) > 4 else "ngram"  # the fixed mode run first in each round
rates = {k: [] for k in [REF, *sides]}
ids = cell.ids[:16] if c == 1 else cell.ids
for r in range(rounds):
    order = list(sides) if r % 2 == 0 else list(sides)[::-1]
    for side in [REF, *order]:
        if side != REF:
            sch.planner, sch.gate, gate.PLAIN_BLOCK_SEQUENCE_STEPS = sides[side]
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode=REF if side == REF else "adaflash") for i in ids], concurrency=c)
        rates[side].append(sum(len(s.output) for s in seqs) / (time.perf_counter() - t0))
for k in sides:
    rr = [round(a / b, 3) for a, b in zip(rates[k], rates["before"])]
    over = [round(a / b, 3) for a, b in zip(rates[k], rates[REF])]
    print(domain, c, k, f"{statistics.median(rates[k]):.0f}", "vs before", rr, statistics.median(rr), f"vs {REF}", over,
          statistics.median(over), flush=True)
