"""Round 30: a one-sequence verify forward timed alone, repeated, and right after a forward of 64 sequences of 16
tokens each, then after 1, 2, 4 and 8 untimed runs of itself, and after a 10 ms pause (quoted in docs/results.md, round
30): why the cost table's rounds run from the quickest point to the slowest.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round30/after_big.py
"""
import sys, time, torch
sys.path.insert(0, "docs/engine-speed/round27")
from cell import load_cell
from adaflash.decoding.costs import _verify_fn, _ragged
cell = load_cell("code")
t = cell.bundle.target
g = torch.Generator().manual_seed(0)
for slots in (64,):
    cache = t.new_cache(slots, cell.max_len)
    t.forward(cache, list(range(slots)), torch.randint(0, t.config.vocab_size, (slots, 128), generator=g).tolist(), logit_rows=torch.tensor([0]))
    for k in (1, 2, 4, 16):
        fn = _verify_fn(t, cache, [0], 128, _ragged(k, 1, t.config.vocab_size, g))
        fn(); ts = []
        for _ in range(7):
            t0 = time.perf_counter(); fn(); ts.append((time.perf_counter() - t0) * 1000)
        print(slots, k, sorted(round(x, 2) for x in ts))
    big = _verify_fn(t, cache, list(range(slots)), 128, _ragged(16 * slots, slots, t.config.vocab_size, g))
    small = _verify_fn(t, cache, [0], 128, _ragged(2, 1, t.config.vocab_size, g))
    ts = []
    for _ in range(5):
        big(); t0 = time.perf_counter(); small(); ts.append((time.perf_counter() - t0) * 1000)
    print(slots, "k=2 right after the full batch x16:", sorted(round(x, 2) for x in ts))
    for warm in (1, 2, 4, 8):
        ts = []
        for _ in range(5):
            big()
            for _ in range(warm): small()
            t0 = time.perf_counter(); small(); ts.append((time.perf_counter() - t0) * 1000)
        print(slots, f"k=2 after the full batch and {warm} warm runs:", sorted(round(x, 2) for x in ts))
    ts = []
    for _ in range(5):
        big(); time.sleep(0.01)
        t0 = time.perf_counter(); small(); ts.append((time.perf_counter() - t0) * 1000)
    print(slots, "k=2 after the full batch and 10 ms sleep", sorted(round(x, 2) for x in ts))
