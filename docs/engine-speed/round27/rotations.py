"""Round 27: adaflash over `ar` at code c=8 with `ar`, `ngram` and adaflash in three rotations (A, B, C), one engine,
three rounds; no `dflash` run (output in rotations.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/rotations.py code 8 3
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
domain, c = sys.argv[1], int(sys.argv[2])
bundle = load_bundle(Path("models/default"))
prompts = [p for p in eval_set_prompts(Path("../shared/data"), 64, training_template=True) if p.domain == domain]
ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
orders = {"A": ["ar", "ngram", "adaflash"], "B": ["ngram", "adaflash", "ar"], "C": ["adaflash", "ar", "ngram"]}
res = {k: [] for k in orders}
for r in range(int(sys.argv[3])):
    for name, order in orders.items():
        tps = {}
        for m in order:
            t = time.perf_counter()
            s = engine.generate([Request(i, 96, mode=m) for i in ids], concurrency=c)
            tps[m] = sum(len(x.output) for x in s) / (time.perf_counter() - t)
        res[name].append(tps["adaflash"] / tps["ar"])
        print(name, {k: round(v) for k, v in tps.items()}, round(res[name][-1], 3), flush=True)
print({k: round(statistics.median(v), 3) for k, v in res.items()})
