"""Round 30: adaflash variants at one sequence against `ngram`, on one engine of 64 slots, alternating by round, `ngram`
first in every round; every output equal. Variants: `base` (the gate without regret halvings: EXPLORE_BACKOFF 0),
`backoff` (as committed), `copyarm` (a gate with the copy arm: prompt lookup's whole copies, at one sequence the only
load measured here), `copyonly` (adaflash with no drafter: copies only), `nogate`. Also each run's steps, the
milliseconds a step spent outside the target forward and in it, and the drafter forwards. `arms-ab.txt` ran before the
cost table's fix (`_typical_ms`'s order), with `copyarm` as a gate whose copy arm ran at one sequence
only, which at one sequence is the same gate.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/arms_ab.py chat 6 \
        base,backoff,copyarm
    (a domain of the shared sets, or broad:<domain> of the broad mix's held-out prompts)
"""
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from cells import MAX_TOKENS, load  # noqa: E402

from adaflash.decoding import gate  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

domain, rounds = sys.argv[1], int(sys.argv[2])
variants = sys.argv[3].split(",") if len(sys.argv) > 3 else ["adaflash", "copyonly", "nogate"]
cell = load(domain)
engine = cell.engine()
sch = engine.scheduler
ids = cell.ids[:16]
TWO = (gate.Arm.PLAN, gate.Arm.PLAIN)
gates = {v: gate.PlanGate(arms=gate.ARMS if v == "copyarm" else TWO) for v in variants}
fwd = {"ms": 0.0}
orig_forward = engine.backend.forward
async def timed_forward(*a, **k):
    r = await orig_forward(*a, **k); fwd["ms"] += r.ms; return r
engine.backend.forward = timed_forward
over = {v: [] for v in variants}
stepsd = {v: [] for v in ["ngram", *variants]}
fwdd = {v: [] for v in ["ngram", *variants]}
fin = {v: [] for v in ["ngram", *variants]}
drafts = {v: [] for v in ["ngram", *variants]}
orig_draft = engine.backend.draft
async def counted_draft(*a, **k):
    fwd["drafts"] += 1; return await orig_draft(*a, **k)
engine.backend.draft = counted_draft
ref = None
for r in range(rounds):
    rates = {}
    order = variants if r % 2 == 0 else variants[::-1]
    for v in ["ngram", *order]:
        sch.gate = None if v == "nogate" else gates.get(v)
        sch.has_drafter = v != "copyonly"
        gate.EXPLORE_BACKOFF = 0 if v in ("base", "copyonly") else 2
        fwd["ms"] = 0.0; fwd["drafts"] = 0
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode="ngram" if v == "ngram" else "adaflash") for i in ids], concurrency=1)
        wall = time.perf_counter() - t0
        rates[v] = sum(len(s.output) for s in seqs) / wall
        ref = ref or [s.output for s in seqs]
        assert [s.output for s in seqs] == ref
        steps = sum(len(s.steps) for s in seqs)
        stepsd[v].append(steps)
        fwdd[v].append((wall * 1000 - fwd["ms"]) / steps * 1000); fin[v].append(fwd["ms"] / steps * 1000); drafts[v].append(fwd["drafts"])
    for v in variants:
        over[v].append(rates[v] / rates["ngram"])
    print(r, {v: round(over[v][-1], 3) for v in variants}, {v: {a.value: t.calls for a, t in g.tally.items()} for v, g in gates.items()}, flush=True)
for v in variants:
    print(f"{domain} {v}/ngram median {statistics.median(over[v]):.3f} {[round(x,3) for x in over[v]]}")
for v in ["ngram", *variants]:
    print(f"{v}: steps {stepsd[v]} outside-forward us/step {[round(x) for x in fwdd[v]]} forward us/step {[round(x) for x in fin[v]]} drafts {drafts[v]}")
