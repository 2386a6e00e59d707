"""Round 27: `ar` after `ar`, after `dflash` and after `ngram`, over the round's first `ar`, at code c=8, three rounds
(output in after-dflash.txt, second table).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/ar_after.py code 8 3
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
def run(m):
    t = time.perf_counter()
    s = engine.generate([Request(i, 96, mode=m) for i in ids], concurrency=c)
    return sum(len(x.output) for x in s) / (time.perf_counter() - t)
res = {"ar after ar": [], "ar after dflash": [], "ar after ngram": []}
for r in range(rounds):
    a0 = run("ar"); a1 = run("ar"); run("dflash"); a2 = run("ar"); run("ngram"); a3 = run("ar")
    for k, v in zip(res, (a1 / a0, a2 / a0, a3 / a0)):
        res[k].append(v)
    print({k: round(v[-1], 3) for k, v in res.items()}, flush=True)
print({k: round(statistics.median(v), 3) for k, v in res.items()})
