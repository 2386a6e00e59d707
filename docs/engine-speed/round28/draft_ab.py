"""Round 28: a drafter forward reading the gathered contexts (the path before) against one run in the drafter's cache
on the native kernels (`DFlashDrafter._draft_in_cache`), alternating call by call in one process on the default
drafter: median milliseconds of each (40 calls after 5), and how far their hidden states and tokens part (output in
draft-ab.txt).

    PYTHONPATH=python_backend .venv/bin/python docs/engine-speed/round28/draft_ab.py
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from adaflash.models.bundle import load_bundle

CONTEXT = 300


def main() -> None:
    bundle = load_bundle(Path("models/default"))
    target, drafter = bundle.target, bundle.drafter
    in_cache = type(drafter)._drafts_in_cache
    g = torch.Generator().manual_seed(0)
    for seqs in (1, 8, 32):
        cache = drafter.new_cache(seqs, CONTEXT + drafter.config.block_size + 1)
        width = drafter.fc.weight.shape[1]
        drafter.append_context(cache, list(range(seqs)), torch.randn(seqs * CONTEXT, width, generator=g),
                               [CONTEXT] * seqs)
        anchors = torch.randint(0, target.config.vocab_size, (seqs,), generator=g).tolist()
        row = []
        for length in (2, 4, 8, 16):
            times, drafts = {"gathered": [], "in cache": []}, {}
            for r in range(45):
                for path in ("gathered", "in cache"):
                    drafter._drafts_in_cache = (lambda *a: False) if path == "gathered" else (
                        lambda *a, d=drafter: in_cache(d, *a))
                    t0 = time.perf_counter()
                    drafts[path] = drafter.draft(target, cache, list(range(seqs)), anchors, length)
                    times[path].append(time.perf_counter() - t0)
            gap = (drafts["gathered"].hidden - drafts["in cache"].hidden).abs().max().item()
            same = torch.equal(drafts["gathered"].tokens, drafts["in cache"].tokens)
            before, after = (statistics.median(times[p][5:]) * 1000 for p in ("gathered", "in cache"))
            row.append(f"block {length}: {before:.2f} -> {after:.2f} ms ({after / before:.2f}; hidden within "
                       f"{gap:.1e}, tokens {'equal' if same else 'DIFFER'})")
        print(f"{seqs} sequences, {CONTEXT} cached: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
