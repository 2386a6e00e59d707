"""Round 29: the steps of `ngram` and adaflash at one sequence on 16 prompts of a domain, by kind (a copy verified, a
drafter block, nothing proposed) with the tokens each kind committed, and adaflash's calls on each arm of the gate, run
after run on one engine (quoted in docs/results.md, round 29).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/kinds.py code 3
"""
import sys, copy
from collections import Counter
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
cell = load_cell(sys.argv[1])
ids = cell.ids[:16]
engine = cell.engine()
gate = engine.scheduler.gate
for r in range(int(sys.argv[2])):
    for mode in ("ngram", "adaflash"):
        before = copy.deepcopy(gate.tally)
        seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in ids], concurrency=1)
        kinds = Counter(); toks = Counter()
        for s in seqs:
            for st in s.steps[1:]:
                k = "copy" if (st.copied or (mode == "ngram" and st.draft_len)) else "draft" if st.draft_len else "none"
                kinds[k] += 1; toks[k] += st.committed
        calls = {a.value: gate.tally[a].calls - before[a].calls for a in gate.tally}
        print(mode, dict(kinds), dict(toks), calls if mode == "adaflash" else "")
