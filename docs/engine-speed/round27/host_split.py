"""Round 27: where a run's host time goes, adaflash with the gate held on an arm (plan or plain) or gated: wall time
and the summed milliseconds of `Planner.plan`, the controller's choices, the forwards and the drafts, by a timing
wrapper around each (two runs; output in host-split.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/host_split.py code 8 plan
"""
import sys
import time

from adaflash.decoding.gate import Arm
from adaflash.decoding.sequence import Request
from cell import MAX_TOKENS, load_cell

domain, c, held = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cell = load_cell(domain)
if c == 1:
    cell.ids = cell.ids[:16]
engine = cell.engine()
sch = engine.scheduler
if held != "gated":
    sch.gate.choose = lambda n, a=Arm(held): a
acc = {}
def timed(obj, name, label):
    f = getattr(obj, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; return r
    setattr(obj, name, w)
def atimed(obj, name, label):
    f = getattr(obj, name)
    async def w(*a, **k):
        t = time.perf_counter(); r = await f(*a, **k); acc[label] = acc.get(label, 0) + time.perf_counter() - t; return r
    setattr(obj, name, w)
timed(sch.planner, "plan", "plan")
ctl = sch.planner.controller
for n in ("prefers_copy", "copy_lengths", "choose_drafters"):
    timed(ctl, n, n)
timed(ctl, "observe", "observe")
atimed(sch, "_forward", "_forward")
atimed(sch.backend, "forward", "backend.forward")
atimed(sch.backend, "draft", "draft")
atimed(sch, "step", "step")
for r in range(2):
    acc.clear()
    t = time.perf_counter()
    s = engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids], concurrency=c)
    wall = time.perf_counter() - t
    print(f"wall {wall*1000:.0f} ms", {k: round(v * 1000) for k, v in acc.items()},
          "forward-post", round((acc["_forward"] - acc["backend.forward"]) * 1000))
