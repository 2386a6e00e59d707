"""Round 27: adaflash over `ar` at code c=8 with `ar`, `ngram` and adaflash in three rotations (A, B, C), one engine,
three rounds; no `dflash` run (output in rotations.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/rotations.py code 8 3
"""
import statistics
import sys

from cell import load_cell

domain, c = sys.argv[1], int(sys.argv[2])
cell = load_cell(domain)
engine = cell.engine()
orders = {"A": ["ar", "ngram", "adaflash"], "B": ["ngram", "adaflash", "ar"], "C": ["adaflash", "ar", "ngram"]}
res = {k: [] for k in orders}
for r in range(int(sys.argv[3])):
    for name, order in orders.items():
        tps = {m: cell.tokens_per_s(engine, m, c) for m in order}
        res[name].append(tps["adaflash"] / tps["ar"])
        print(name, {k: round(v) for k, v in tps.items()}, round(res[name][-1], 3), flush=True)
print({k: round(statistics.median(v), 3) for k, v in res.items()})
