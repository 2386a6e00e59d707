"""Round 29: where `Planner._plan_one`'s time goes at one sequence, from a timed copy of it (the lookup, `prefers_copy`,
`choose_drafters`, the copy's length), microseconds per plan over an adaflash run of 16 prompts of a domain, three runs
on one engine (quoted in docs/results.md, round 29; the copy is of the code of eed2a08).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/plan_split.py chat
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
from adaflash.decoding import planner as P, ngram
from adaflash.decoding.planner import Plan, DraftRequest
cell = load_cell(sys.argv[1])
engine = cell.engine()
acc = {}
pc = time.perf_counter
def _plan_one(self, s, outside):
    t0 = pc()
    c, key = self.controller, s.key
    plan = Plan(block_length=self.block_size)
    t1 = pc()
    proposal, matched = ngram.lookup(s.tokens, s.cap) if self.copies and s.mode.copies else ([], 0)
    t2 = pc()
    acc["setup"] = acc.get("setup", 0) + t1 - t0; acc["lookup"] = acc.get("lookup", 0) + t2 - t1
    pref = proposal and c.prefers_copy([s.policy], [matched], [len(proposal)], [s.cap])[0]
    t3 = pc(); acc["prefers"] = acc.get("prefers", 0) + t3 - t2
    if pref or not s.can_draft:
        self._copy_one(plan, s, proposal, matched, outside)
        acc["copy1"] = acc.get("copy1", 0) + pc() - t3
        return plan
    chosen, length = c.choose_drafters([s.policy], [s.cap], 1 + outside.sequences, outside.tokens,
                                       1 + outside.drafting, outside.expected, outside.widest)
    t4 = pc(); acc["choose"] = acc.get("choose", 0) + t4 - t3
    plan.block_length = length
    if chosen[0]:
        plan.proposals[key] = []
        rates = c.estimated_rates([s.policy])
        plan.drafts = [DraftRequest(key, s.mode.name, min(s.cap, length - 1), length, rates[0])]
    else:
        self._copy_one(plan, s, proposal, matched, outside)
    acc["copy2"] = acc.get("copy2", 0) + pc() - t4
    return plan
P.Planner._plan_one = _plan_one
for r in range(3):
    acc.clear()
    n = [0]
    f = engine.scheduler.planner.plan
    def w(*a, **k):
        t = pc(); r = f(*a, **k); acc["plan"] = acc.get("plan", 0) + pc() - t; n[0] += 1; return r
    engine.scheduler.planner.plan = w
    engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids[:16]], concurrency=1)
    del engine.scheduler.planner.plan
    print(" ".join(f"{k} {v / n[0] * 1e6:.1f}" for k, v in acc.items()), "us per plan")
