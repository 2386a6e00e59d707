"""Round 30: the cost table measured for an engine of 1 slot and one of 64 (the verify row at one sequence, 1 to 16
tokens, the drafter's at one sequence, the verify rows at 8, 32, 64 sequences and the drafter's at 64), and how long
each measurement took. Run at the commit before and after the fix of `_typical_ms` (quoted in docs/results.md).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/table_rows.py
"""
import sys, time
sys.path.insert(0, "docs/engine-speed/round27")
from cell import load_cell
from adaflash.decoding.costs import measure_costs
cell = load_cell("code")
for slots in (1, 64):
    t0 = time.perf_counter()
    c = measure_costs(cell.bundle.target, cell.bundle.drafter, slots, max_len=cell.max_len)
    print(slots, f"{time.perf_counter()-t0:.1f}s", "verify b1", [round(ms, 2) for _, ms in c.verify[1]], "draft b1", [round(ms, 2) for _, ms in c.draft[1]],
          "verify b8", [round(ms, 2) for _, ms in c.verify.get(8, [])], "b32", [round(ms, 2) for _, ms in c.verify.get(32, [])], "b64", [round(ms, 2) for _, ms in c.verify.get(64, [])], "draft b64", [round(ms, 2) for _, ms in c.draft.get(64, [])], flush=True)
