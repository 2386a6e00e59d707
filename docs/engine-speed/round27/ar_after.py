"""Round 27: `ar` after `ar`, after `dflash` and after `ngram`, over the round's first `ar`, at code c=8, three rounds
(output in after-dflash.txt, second table).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/ar_after.py code 8 3
"""
import statistics
import sys

from cell import load_cell

domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cell = load_cell(domain)
engine = cell.engine()
def run(m):
    return cell.tokens_per_s(engine, m, c)
res = {"ar after ar": [], "ar after dflash": [], "ar after ngram": []}
for r in range(rounds):
    a0 = run("ar"); a1 = run("ar"); run("dflash"); a2 = run("ar"); run("ngram"); a3 = run("ar")
    for k, v in zip(res, (a1 / a0, a2 / a0, a3 / a0)):
        res[k].append(v)
    print({k: round(v[-1], 3) for k, v in res.items()}, flush=True)
print({k: round(statistics.median(v), 3) for k, v in res.items()})
