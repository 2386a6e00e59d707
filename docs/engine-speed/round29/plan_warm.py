"""Round 29: `Planner.plan` at one sequence timed in place, right after the forward, and the same call made again at
once (its decisions then taken twice: a diagnosis only), microseconds per plan, `ngram` and adaflash on 16 prompts of
a domain (quoted in docs/results.md, round 29; run at d3449c8).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/plan_warm.py code
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
cell = load_cell(sys.argv[1])
ids = cell.ids[:16]
engine = cell.engine()
sch = engine.scheduler
acc = {"cold": 0, "warm": 0, "n": 0}
f = sch.planner.plan
def w(seqs, *a, **k):
    t = time.perf_counter(); r = f(seqs, *a, **k); t1 = time.perf_counter()
    f(seqs, *a, **k); t2 = time.perf_counter()
    acc["cold"] += t1 - t; acc["warm"] += t2 - t1; acc["n"] += 1
    return r
sch.planner.plan = w
for mode in ("ngram", "adaflash", "ngram", "adaflash"):
    for k in acc: acc[k] = 0
    engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=1)
    print(mode, f"cold {acc['cold']/acc['n']*1e6:.1f}us warm {acc['warm']/acc['n']*1e6:.1f}us")
