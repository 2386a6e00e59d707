"""Round 27: where a run's host time goes, adaflash with the gate held on an arm (plan or plain) or gated: wall time
and the summed milliseconds of `Planner.plan`, the controller's choices, the forwards and the drafts, by a timing
wrapper around each (two runs; output in host-split.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/host_split.py code 8 plan
"""
import sys
import time
from pathlib import Path
from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import Arm
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
domain, c, held = sys.argv[1], int(sys.argv[2]), sys.argv[3]
bundle = load_bundle(Path("models/default"))
prompts = [p for p in eval_set_prompts(Path("../shared/data"), 64, training_template=True) if p.domain == domain]
ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
if c == 1: ids = ids[:16]
max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
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
    s = engine.generate([Request(i, 96, mode="adaflash") for i in ids], concurrency=c)
    wall = time.perf_counter() - t
    print(f"wall {wall*1000:.0f} ms", {k: round(v * 1000) for k, v in acc.items()},
          "forward-post", round((acc["_forward"] - acc["backend.forward"]) * 1000))
