"""Round 27: does a `dflash` run just before slow the next adaflash run? `ar` then adaflash on one engine, with
`dflash` between them on the same engine, on another engine, or nothing between, at code c=8, three rounds
(output in after-dflash.txt). A diagnosis of bench_gate's fixed order (adaflash always runs right after dflash).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/after_dflash.py code 8 3
"""
import statistics
import sys

from cell import load_cell

domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cell = load_cell(domain)
engine, other = cell.engine(), cell.engine()
def run(e, m):
    return cell.tokens_per_s(e, m, c)
res = {"dflash same engine": [], "dflash other engine": [], "nothing between": []}
for r in range(rounds):
    a1 = run(engine, "ar"); run(engine, "dflash"); x = run(engine, "adaflash")
    a2 = run(engine, "ar"); run(other, "dflash"); y = run(engine, "adaflash")
    a3 = run(engine, "ar"); z = run(engine, "adaflash")
    for k, v in zip(res, (x / a1, y / a2, z / a3)):
        res[k].append(v)
    print({k: round(v[-1], 3) for k, v in res.items()}, flush=True)
print({k: round(statistics.median(v), 3) for k, v in res.items()})
