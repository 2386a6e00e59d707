"""Prototype: stop capturing features for sequences at loads where the planner (almost) never drafts."""

import sys
import time
from pathlib import Path
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, read_jsonl
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of

THRESH, MIN_OBS, W = 0.02, 8, 0.1


def patch(sched):
    sched.use = {}  # bucket -> [ewma share, observations]
    plan0 = sched.planner.plan

    def plan(seqs, *a, **k):
        p = plan0(seqs, *a, **k)
        able = [s for s in seqs if s.mode.drafter and s.can_draft and s.cap > 0]
        if able and not sched._prefilling:
            u = sched.use.setdefault(len(seqs).bit_length(), [None, 0])
            share = len(p.drafts) / len(able)
            u[0] = share if u[0] is None else u[0] + W * (share - u[0])
            u[1] += 1
        return p

    sched.planner.plan = plan

    def retire_drafting(active):
        u = sched.use.get(len(active).bit_length())
        if u and u[1] >= MIN_OBS and u[0] < THRESH:
            for s in active:
                if s.can_draft:
                    s.can_draft = False
                    s.pending_context.clear()
                    sched.retired += 1

    sched.retired = 0
    f0, d0 = sched._forward, sched._decode_run

    async def _forward(admitted, active, feeds, copied):
        return await f0(admitted, active, feeds, copied)

    async def _decode_run(active, runs):
        retire_drafting(active)
        return await d0(active, runs)

    p0 = sched._propose

    async def _propose(active, arm):
        sched._prefilling = False
        retire_drafting(active)
        return await p0(active, arm)

    sched._prefilling = False
    sched._forward, sched._decode_run, sched._propose = _forward, _decode_run, _propose


b = load_bundle(Path("models/default"))
dom, c, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
texts = read_jsonl(Path(f"../shared/data/eval/heldout_{dom}.jsonl"))[:64]
ids = encode_prompts(b.tokenizer, texts, 400)
ml = context_length([len(i) for i in ids], 96, block_size_of(b.drafter))


def mk():
    return Engine(b.target, b.drafter, num_slots=c, max_len=ml)


variants = {"ar": (mk(), "ar"), "adaflash": (mk(), "adaflash"), "adaflash-retire": (mk(), "adaflash")}
patch(variants["adaflash-retire"][0].scheduler)
cell = ids if c > 1 else ids[:8]


def run(eng, mode):
    t0 = time.perf_counter()
    seqs = eng.generate([Request(i, 96, mode=mode) for i in cell], concurrency=c)
    return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0), [s.output for s in seqs]


ref = None
res = {k: [] for k in variants}
for r in range(reps + 1):
    for name, (eng, mode) in variants.items():
        tps, outs = run(eng, mode)
        ref = outs if name == "ar" else ref
        assert outs == ref, name
        if r:
            res[name].append(tps)
s = variants["adaflash-retire"][0].scheduler
print(
    dom,
    c,
    {k: [round(x) for x in v] for k, v in res.items()},
    "retire/ada %.3f retire/ar %.3f ada/ar %.3f"
    % (
        sum(res["adaflash-retire"]) / sum(res["adaflash"]),
        sum(res["adaflash-retire"]) / sum(res["ar"]),
        sum(res["adaflash"]) / sum(res["ar"]),
    ),
    "use",
    {k: (round(v[0], 3), v[1]) for k, v in s.use.items()},
    "retired",
    s.retired,
    flush=True,
)
