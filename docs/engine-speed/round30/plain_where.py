"""Round 30: where the plain arm's cost over `ar` lies at 64 sequences (chat, 64 prompts): milliseconds a run spends in
the target's forwards (prefills included) and in the decode steps' `verify_batch`, for `ar`, adaflash on the plain arm
keeping its features (`kept`), and adaflash without a drafter (`none`), three rounds (output in plain-where.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/plain_where.py
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from cells import MAX_TOKENS, load
from adaflash.decoding.gate import Arm
from cells import Always
from adaflash.decoding import steps as ST
from adaflash.decoding.sequence import Request
cell = load("chat"); engine = cell.engine(); sch = engine.scheduler
acc = {}
def wrap(mod, name):
    f = getattr(mod, name)
    def w(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[name] = acc.get(name, 0) + time.perf_counter() - t; return r
    setattr(mod, name, w)
wrap(ST, "verify_batch")
fo = engine.target.forward
def tf(*a, **k):
    t = time.perf_counter(); r = fo(*a, **k); acc["target.forward"] = acc.get("target.forward", 0) + time.perf_counter() - t; return r
engine.target.forward = tf
for r in range(3):
    for side in ("ar", "kept", "none"):
        sch.gate = Always(Arm.PLAIN); sch.has_drafter = side != "none"
        acc.clear(); t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode="ar" if side == "ar" else "adaflash") for i in cell.ids], concurrency=64)
        wall = time.perf_counter() - t0; n = max(len(s.steps) for s in seqs)
        print(side, f"wall {wall*1000:.0f} ms", {k: round(v * 1000) for k, v in acc.items()}, flush=True)
