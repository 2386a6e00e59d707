"""Round 28: where a step's time goes for `ngram` and adaflash on the same prompts (16 of a domain at concurrency 1 by
default), alternating in one process: per step, the whole step, the target forward, `Planner.plan`, drafter forwards
and the gate, by timing wrappers around each (output in c1-split.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round28/c1_split.py code 1 3
"""
import sys
import time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cell = load_cell(domain)
ids = cell.ids[:16] if c == 1 else cell.ids
engine = cell.engine()
sch = engine.scheduler
acc = {}
def timed(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; acc[label + "#"] = acc.get(label + "#", 0) + 1; return r
    setattr(obj, name, w)
def atimed(obj, name, label):
    f = getattr(obj, name)
    async def w(*a, **k):
        t = time.perf_counter(); r = await f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; acc[label + "#"] = acc.get(label + "#", 0) + 1; return r
    setattr(obj, name, w)
timed(sch.planner, "plan", "plan")
atimed(sch.backend, "forward", "fwd")
atimed(sch.backend, "draft", "draft")
atimed(sch, "step", "step")
timed(sch.gate, "choose", "gate.choose")
timed(sch.gate, "observe", "gate.observe")
for r in range(rounds):
    for mode in (("ngram", "adaflash") if r % 2 == 0 else ("adaflash", "ngram")):
        acc.clear()
        t = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=c)
        wall = time.perf_counter() - t
        tok = sum(len(s.output) for s in seqs)
        steps = acc["step#"]
        print(f"{mode:9s} {tok / wall:6.0f} tok/s wall {wall*1000:5.0f} steps {steps} | per step: step {acc['step']/steps*1000:.3f} fwd {acc['fwd']/steps*1000:.3f} plan {acc.get('plan',0)/steps*1000:.3f} draft {acc.get('draft',0)/steps*1000:.3f} gate {(acc.get('gate.choose',0)+acc.get('gate.observe',0))/steps*1000:.3f} outside-step {(wall-acc['step'])/steps*1000:.3f} ms; fwd calls {acc['fwd#']}")
