"""Round 29: how often `LengthController.choose_drafters` at one sequence could not reuse its last decision, and which
part of its key changed (the batch, the caps, the rounded cost scales, the counts' versions), on one adaflash run of 16
prompts of a domain (quoted in docs/results.md, round 29).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/reuse_misses.py chat
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
from adaflash.decoding import policy as Q
cell = load_cell(sys.argv[1])
ids = cell.ids[:16]
engine = cell.engine()
ctl = engine.scheduler.planner.controller
keys = []
orig = Q.LengthController.choose_drafters
def w(self, *a, **k):
    before = self._decision
    r = orig(self, *a, **k)
    if self._decision is not before:
        keys.append((None if before is None else before[0], self._decision[0]))
    return r
Q.LengthController.choose_drafters = w
calls = [0]
o2 = Q.LengthController._plan
def w2(self, *a, **k):
    t = time.perf_counter(); r = o2(self, *a, **k); calls[0] += time.perf_counter() - t; return r
Q.LengthController._plan = w2
engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in ids], concurrency=1)
print("misses", len(keys), "plan us", calls[0] / max(1, len(keys)) * 1e6)
from collections import Counter
diff = Counter()
for a, b in keys:
    if a is None: continue
    names = ["batch","other_tokens","other_expected","n_drafting","width","caps","scales","gv","sv"]
    diff[tuple(n for n, x, y in zip(names, a, b) if x != y)] += 1
print(diff)
print([k[1][6] for k in keys[:40]])
