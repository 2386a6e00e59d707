"""Round 27: does a `dflash` run just before slow the next adaflash run? `ar` then adaflash on one engine, with
`dflash` between them on the same engine, on another engine, or nothing between, at code c=8, three rounds
(output in after-dflash.txt). A diagnosis of bench_gate's fixed order (adaflash always runs right after dflash).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/after_dflash.py code 8 3
"""
import statistics
import sys
import time
from pathlib import Path
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
bundle = load_bundle(Path("models/default"))
prompts = [p for p in eval_set_prompts(Path("../shared/data"), 64, training_template=True) if p.domain == domain]
ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
other = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
def run(e, m):
    t = time.perf_counter()
    s = e.generate([Request(i, 96, mode=m) for i in ids], concurrency=c)
    return sum(len(x.output) for x in s) / (time.perf_counter() - t)
res = {"dflash same engine": [], "dflash other engine": [], "nothing between": []}
for r in range(rounds):
    a1 = run(engine, "ar"); run(engine, "dflash"); x = run(engine, "adaflash")
    a2 = run(engine, "ar"); run(other, "dflash"); y = run(engine, "adaflash")
    a3 = run(engine, "ar"); z = run(engine, "adaflash")
    for k, v in zip(res, (x / a1, y / a2, z / a3)):
        res[k].append(v)
    print({k: round(v[-1], 3) for k, v in res.items()}, flush=True)
print({k: round(statistics.median(v), 3) for k, v in res.items()})
