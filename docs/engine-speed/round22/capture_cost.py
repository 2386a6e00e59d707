import time
import statistics
import torch
from pathlib import Path
from adaflash.models.bundle import load_bundle

b = load_bundle(Path("models/default"))
t, d = b.target, b.drafter
layers = d.config.target_layer_ids
print("capture layers", layers, "hidden", t.config.hidden_size)
B = 64
cache = t.new_cache(B, 1024)
t.forward(cache, list(range(B)), [list(range(100, 400))] * B)


def once(cap):
    t0 = time.perf_counter()
    out = t.forward(cache, list(range(B)), [[5]] * B, capture_layers=cap)
    out.logits.argmax(-1).tolist()
    for s in range(B):
        cache.truncate(s, 300)
    return time.perf_counter() - t0


for _ in range(10):
    once(None)
    once(layers)
a, c = [], []
for _ in range(60):
    a.append(once(None))
    c.append(once(layers))
print(
    "no capture ms %.3f  capture ms %.3f  ratio %.4f"
    % (statistics.median(a) * 1e3, statistics.median(c) * 1e3, statistics.median(c) / statistics.median(a))
)
# flush cost: append_context of 64 seqs x n positions
ctx = d.new_cache(B, 1024)
feats = torch.randn(B * 300, len(layers) * t.config.hidden_size)
d.append_context(ctx, list(range(B)), feats, [300] * B)
for n in (1, 4, 16):
    f = torch.randn(B * n, len(layers) * t.config.hidden_size)
    xs = []
    for _ in range(20):
        t0 = time.perf_counter()
        d.append_context(ctx, list(range(B)), f, [n] * B)
        xs.append(time.perf_counter() - t0)
        for s in range(B):
            ctx.truncate(s, 300)
    print("append_context", n, "positions x 64 seqs: ms %.3f" % (statistics.median(xs) * 1e3))

# recomputing skipped positions instead: a forward of 16 positions for each of the 64 sequences, capturing
xs = []
for _ in range(15):
    t0 = time.perf_counter()
    t.forward(cache, list(range(B)), [list(range(5, 21))] * B, capture_layers=layers)
    xs.append(time.perf_counter() - t0)
    for s in range(B):
        cache.truncate(s, 300)
print("recompute 16 positions x 64 seqs: ms %.2f" % (statistics.median(xs) * 1e3))
