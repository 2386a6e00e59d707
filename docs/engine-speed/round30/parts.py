"""Round 30: where one sequence's step goes, `ngram`, adaflash and adaflash with no drafter (copies only, `copyonly`), one
engine of 64 slots, three rounds on chat: per step, microseconds in the plan, the target forward calls, drafter
forwards, observe, admissions and retirement, and the rest (each part timed by a wrapper, which adds its own cost).
Ran before the fix of the cost table (output in parts.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/parts.py chat
"""
import sys, time
sys.path.insert(0, "docs/engine-speed/round27")
from cell import MAX_TOKENS, load_cell
from adaflash.decoding import gate
from adaflash.decoding.sequence import Request
domain = sys.argv[1]
cell = load_cell(domain); engine = cell.engine(); sch = engine.scheduler; ids = cell.ids[:16]
acc = {}
def wrap(obj, name, label, coro=False):
    f = getattr(obj, name)
    if coro:
        async def w(*a, **k):
            t = time.perf_counter(); r = await f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; return r
    else:
        def w(*a, **k):
            t = time.perf_counter(); r = f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; return r
    setattr(obj, name, w)
wrap(sch.planner, "plan", "plan")
wrap(engine.backend, "draft", "draft", True)
wrap(engine.backend, "forward", "forward", True)
wrap(sch.planner.controller, "observe", "observe")
wrap(sch, "_retire", "retire", True)
wrap(sch, "_admit", "admit")
gates = {"adaflash": sch.gate, "copyonly": gate.PlanGate(arms=sch.gate.arms)}
for r in range(3):
    for v in ("ngram", "adaflash", "copyonly"):
        sch.gate = gates.get(v, sch.gate); sch.has_drafter = v != "copyonly"
        acc.clear(); t = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode="ngram" if v == "ngram" else "adaflash") for i in ids], concurrency=1)
        wall = time.perf_counter() - t; n = sum(len(s.steps) for s in seqs)
        rest = wall - sum(acc.values())
        print(v, f"steps {n} wall/step {wall/n*1e6:.0f}us", " ".join(f"{k} {v2/n*1e6:.1f}" for k, v2 in acc.items()), f"rest {rest/n*1e6:.1f}")
