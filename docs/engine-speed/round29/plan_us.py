"""Round 29: the wall time of 16 prompts at one sequence and `Planner.plan`'s microseconds per call, `ngram` and
adaflash alternating, three rounds; with a second argument, also the policy's parts (each timed by a wrapper of its
own, which adds its own cost). Run with `GOMP_SPINCOUNT=0` to see whether the OpenMP workers' spin after the forward
slows the plan (quoted in docs/results.md, round 29).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/plan_us.py code [parts]
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
from adaflash.decoding import planner as P, policy as Q
domain = sys.argv[1]
cell = load_cell(domain)
ids = cell.ids[:16]
engine = cell.engine()
acc = {}
def timed(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; acc[label + "#"] = acc.get(label + "#", 0) + 1; return r
    setattr(obj, name, w)
sch = engine.scheduler
if len(sys.argv) > 2:
    timed(P.ngram, "lookup", "lookup")
    timed(Q.LengthController, "prefers_copy", "prefers_copy")
    timed(Q.LengthController, "copy_lengths", "copy_lengths")
    timed(Q.LengthController, "choose_drafters", "choose_drafters")
    timed(Q.LengthController, "_plan", "_plan"); timed(Q.LengthController, "_probes", "_probes")
    timed(Q.LengthController, "observe", "observe")
    f0 = P.Planner._load; P.Planner._load = staticmethod(lambda *a: (lambda t: (f0(*a), acc.__setitem__("_load", acc.get("_load", 0) + time.perf_counter() - t))[0])(time.perf_counter()))
    timed(P.Planner, "_copy", "_copy")
timed(sch.planner, "plan", "plan")
for r in range(3):
    for mode in ("ngram", "adaflash"):
        acc.clear()
        t = time.perf_counter()
        engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=1)
        wall = time.perf_counter() - t
        n = acc["plan#"]
        print(mode, f"wall {wall*1000:.0f} plans {n}", " ".join(f"{k} {v/n*1e6:.1f}us" for k, v in acc.items() if not k.endswith("#")))
