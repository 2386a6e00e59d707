"""Round 29: where `LengthController.choose_drafters`'s time goes at one sequence, from a timed copy of it (the rounded
scales, the key, a reused or a new decision, the probes, the counters), microseconds per call over an adaflash run of
16 prompts of a domain, three runs on one engine (quoted in docs/results.md, round 29; the copy is of the code of
c4c5da6).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round29/choose_split.py chat
"""
import sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, load_cell
from adaflash.decoding.sequence import Request
from adaflash.decoding import policy as Q
cell = load_cell(sys.argv[1])
engine = cell.engine()
acc = {}
pc = time.perf_counter
def choose_drafters(self, seqs, caps, batch, other_tokens, n_drafting, other_expected=None, other_width=1):
    t0 = pc()
    sc = self.cost.scales
    t1 = pc()
    key = (batch, other_tokens, None if other_expected is None else round(other_expected, 1), n_drafting,
           other_width if self.cost.padded else 1, tuple(caps), sc, self.global_stats.version,
           tuple(s.stats.version for s in seqs))
    t2 = pc()
    miss = self._decision is None or self._decision[0] != key
    if miss:
        self._decision = (key, *self._plan(self.estimated_rates(seqs), caps, batch, other_tokens, n_drafting,
                                           other_expected, other_width))
    t3 = pc()
    _, pays, block_length = self._decision
    if pays:
        self._drafter_probes.restore()
    chosen = [True] * len(seqs) if pays else self._probes(seqs, block_length, batch, other_tokens + len(seqs))
    t4 = pc()
    for s, c in zip(seqs, chosen):
        s.skipped = 0 if c else s.skipped + 1
        if pays:
            s.probe_interval = self.probe_every
        elif c:
            s.probe_interval = min(2 * s.probe_interval, 128)
    t5 = pc()
    for k, v in (("scales", t1 - t0), ("key", t2 - t1), ("miss" if miss else "hit", t3 - t2), ("probes", t4 - t3), ("loop", t5 - t4)):
        acc[k] = acc.get(k, 0) + v
    acc["n"] = acc.get("n", 0) + 1
    acc["misses"] = acc.get("misses", 0) + miss
    return chosen, block_length
Q.LengthController.choose_drafters = choose_drafters
for r in range(3):
    acc.clear()
    engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids[:16]], concurrency=1)
    n = acc.pop("n"); m = acc.pop("misses")
    print(n, m, " ".join(f"{k} {v / n * 1e6:.1f}" for k, v in acc.items()), "us per call; miss each", acc.get("miss", 0) / max(m, 1) * 1e6)
