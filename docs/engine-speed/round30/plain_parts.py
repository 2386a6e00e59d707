"""Round 30: the plain arm under load with the kept target features as they are (`kept`), dropped as they come
(`dropped`), copied out of the step's tensor (`cloned`), and not captured at all (`none`: no drafter), each over `ar`
in the same round, alternating (output in plain-parts.txt). Shows that the plain arm's cost over `ar` is capturing the
features each step, not holding them.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/plain_parts.py chat 64 4
"""
import statistics, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parent))
from cells import MAX_TOKENS, load
from adaflash.decoding.gate import Arm
from cells import Always
from adaflash.decoding import scheduler as S
from adaflash.decoding.sequence import Request
domain, conc, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cell = load(domain); engine = cell.engine(); sch = engine.scheduler
orig_q = S.Scheduler._queue_context
def drop(seq, res): pass
def clone(seq, res):
    if res.features is not None and seq.can_draft:
        seq.pending_context.append(res.features.clone())
sides = {"kept": orig_q, "dropped": drop, "cloned": clone, "none": orig_q}
over = {k: [] for k in sides}
for r in range(rounds):
    rates = {}
    for side in ["ar", *(list(sides) if r % 2 == 0 else list(sides)[::-1])]:
        sch.gate = Always(Arm.PLAIN); sch.has_drafter = side != "none"
        S.Scheduler._queue_context = staticmethod(sides.get(side, orig_q))
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode="ar" if side == "ar" else "adaflash") for i in cell.ids], concurrency=conc)
        rates[side] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
    for k in sides: over[k].append(rates[k] / rates["ar"])
    print(r, {k: round(v[-1], 3) for k, v in over.items()}, flush=True)
for k, v in over.items(): print(k, statistics.median(v))
