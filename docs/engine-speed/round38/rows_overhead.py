"""Round 38: what a verify's per-sequence view of its features costs a plain decoding step, against keeping each
sequence's rows as a (tensor, start, stop) reference instead (`rows`: `steps._judged` patched while that side steps;
the reference is never read, as a held-plain side never drafts, so this times the step only). Sides and method as
`plain_overhead.py` (lockstep, one plain step a call, each step's least time over the rounds):
ar, adaflash held plain, the same with references, held plain without a capture.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/rows_overhead.py math 64 8
"""
import sys
sys.path.insert(0, "docs/engine-speed/round38"); sys.path.insert(0, "docs/engine-speed/round30")
import plain_overhead as po
from lockstep import Side, Lockstep
from cells import load
from adaflash.decoding import steps
from adaflash.decoding.steps import StepResult, _processed, on_cpu, target_probs, verify_greedy, verify_sampled, _log_probs
from adaflash.models.layers import argmax
orig = steps._judged
flag = {"on": False}
def rows_judged(logits, hidden, cache, slots, starts, feeds, sampling, generators, wants, histories):
    if not flag["on"]:
        return orig(logits, hidden, cache, slots, starts, feeds, sampling, generators, wants, histories)
    greedy_ids = argmax(logits).tolist()
    results, row = [], 0
    for i, (slot, start, feed, sp, g) in enumerate(zip(slots, starts, feeds, sampling, generators)):
        n = len(feed)
        expected = 0.0
        processed = _processed(logits[row : row + n], sp, histories[i], feed[1:])
        rows = logits[row : row + n] if processed is None else processed
        if sp.greedy:
            ids = greedy_ids[row : row + n] if processed is None else argmax(processed).tolist()
            committed = verify_greedy(feed[1:], ids)
        else:
            committed, expected = verify_sampled(feed[1:], target_probs(on_cpu(rows), sp), g)
        accepted = len(committed) - 1
        cache.truncate(slot, start + accepted + 1)
        feats = [(hidden, row, row + accepted + 1)] if hidden is not None and wants[i] else None
        results.append(StepResult(committed, accepted, expected, feats, _log_probs(rows, sp, committed)))
        row += n
    return results
def rows_side(engine):
    po.held(engine)
    step = engine.step
    def flagged():
        flag["on"] = True
        try: return step()
        finally: flag["on"] = False
    engine.step = flagged
steps._judged = rows_judged
sides = {"ar": Side("ar", po.one_step), "plain": Side("adaflash", po.held), "rows": Side("adaflash", rows_side), "nocap": Side("adaflash", po.uncaptured)}
lock = Lockstep(load(sys.argv[1]), sides, int(sys.argv[2]))
runs = [po.step_times(lock) for _ in range(int(sys.argv[3]))]
n = len(runs[0]["ar"])
least = {k: [min(r[k][i] for r in runs) for i in range(n)] for k in sides}
long = [i for i in range(n) if least["ar"][i] > 0.03]; short = [i for i in range(n) if i not in set(long)]
for k in list(sides)[1:]:
    print(k, " ".join("%s %+.2f%%" % (p, 100 * (sum(least[k][i] for i in idx) / sum(least["ar"][i] for i in idx) - 1)) for p, idx in (("long", long), ("short", short), ("all", range(n)))))
