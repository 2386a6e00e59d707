"""Round 26: exploration of the arm behind every 2 blocks (within 10%) against every 4, gated adaflash over `ar`,
four rounds in one process, median (output in explore-ab.txt). Not adopted: within the rounds' spread. It ran on
round 26's gate; from round 27 the gate no longer reads `EXPLORE_AFTER` (its waits follow `EXPLORE_REGRET`), so on
later code both variants run the same gate.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round26/explore_ab.py
"""
import statistics
import time
from pathlib import Path
from adaflash.decoding import gate as G
from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import Arm, PlanGate
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
bundle = load_bundle(Path("models/default"))
prompts = eval_set_prompts(Path("../shared/data"), 64)
ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
variants = {"explore 2": ((1.1, 2), (1.3, 6), (float("inf"), 16)), "explore 4": ((1.1, 4), (1.3, 8), (float("inf"), 16))}
gates = {k: PlanGate(arms=(Arm.PLAN, Arm.PLAIN)) for k in variants}
for domain, c in (("math", 32), ("math", 64), ("code", 32), ("chat", 8)):
    cell = [i for i, q in zip(ids, prompts) if q.domain == domain]
    res = {}
    for r in range(4):
        names = list(variants) if r % 2 == 0 else list(variants)[::-1]
        for v in ["ar", *names]:
            if v in variants:
                G.EXPLORE_AFTER = variants[v]; engine.scheduler.gate = gates[v]
            t = time.perf_counter()
            seqs = engine.generate([Request(i, 96, mode="ar" if v == "ar" else "adaflash") for i in cell], concurrency=c)
            res.setdefault(v, []).append(sum(len(s.output) for s in seqs) / (time.perf_counter() - t))
    print(domain, c, {v: round(statistics.median(a / b for a, b in zip(res[v], res["ar"])), 3) for v in variants}, flush=True)
