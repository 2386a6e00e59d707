"""Round 30: adaflash and `ngram` at one sequence in an engine of 1 slot and one of 64 (each with its own measured cost
table), the same 16 prompts, three rounds: tokens per second, steps, tokens verified, drafter forwards; and each
table's verify milliseconds at one sequence for 1 to 16 tokens (live scale applied) and its drafter's for blocks of 16
and 4 (quoted in docs/results.md, round 30).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/slots_ab.py code
"""
import sys, time
sys.path.insert(0, "docs/engine-speed/round27")
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request
domain = sys.argv[1]
cell = load_cell(domain)
ids = cell.ids[:16]
engines = {n: Engine(cell.bundle.target, cell.bundle.drafter, num_slots=n, max_len=cell.max_len) for n in (1, 64)}
for n, e in engines.items():
    c = e.cost
    print(n, "verify_ms(1,n)", [round(float(c.verify_ms(1, k)), 3) for k in (1, 2, 4, 8, 12, 16)], "draft", round(c.draft_ms(1, 16), 3), round(c.draft_ms(1, 4), 3))
for r in range(3):
    for n, e in engines.items():
        for mode in ("ngram", "adaflash"):
            t0 = time.perf_counter()
            seqs = e.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=1)
            wall = time.perf_counter() - t0
            st = [x for s in seqs for x in s.steps]
            print(r, n, mode, f"{sum(len(s.output) for s in seqs)/wall:.0f} tok/s steps {len(st)} verified {sum(x.draft_len for x in st)} drafts {sum(1 for x in st if x.draft_len and not x.copied)}", flush=True)
