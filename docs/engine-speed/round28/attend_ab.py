"""Round 28: `attend` of the commit before (a task per query head and token) against this checkout's (a task per kv
head of a sequence, queries in blocks), call by call in one process on the same data: median milliseconds of each
(50 calls after 10), and every output bit for bit the same, at AVX-512's width and at AVX2's (output in attend-ab.txt).

    PYTHONPATH=python_backend .venv/bin/python docs/engine-speed/round28/attend_ab.py 02f9225
"""

from __future__ import annotations

import statistics
import sys
import time

import torch
from kernels_at import kernels_at

from adaflash.models import native

HEADS, KV_HEADS, DIM = 6, 2, 64  # the default target's


def call(lib, q, k, v, kc, vc, batch, out, *wide_causal) -> float:
    t0 = time.perf_counter()
    lib.attend(q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), kc.data_ptr(),
               vc.data_ptr(), batch.table.data_ptr(), batch.table.shape[1], batch.first.data_ptr(),
               batch.starts.data_ptr(), batch.counts.data_ptr(), batch.counts.shape[0], HEADS, KV_HEADS,
               kc.shape[2], DIM, DIM**-0.5, out.data_ptr(), torch.get_num_threads(), *wide_causal)
    return time.perf_counter() - t0


def main() -> None:
    old, new = kernels_at(sys.argv[1]), native._library()
    print(f"threads {torch.get_num_threads()}, AVX-512 {native.WIDE}")
    for seqs, context, page in ((1, 448, 16), (8, 128, 16), (8, 448, 16), (32, 448, 16), (8, 448, 640)):
        per_seq = -(-(context + 64) // page)
        kc, vc = (torch.randn(seqs * per_seq, KV_HEADS, page, DIM) for _ in range(2))
        tables = [list(range(b * per_seq, (b + 1) * per_seq)) for b in range(seqs)]
        row = []
        for tokens in (1, 2, 4, 8, 16):
            q = torch.randn(seqs * tokens, HEADS, DIM)
            k, v = torch.randn(seqs * tokens, KV_HEADS, DIM), torch.randn(seqs * tokens, KV_HEADS, DIM)
            batch = native.attention_batch(tables, [context] * seqs, [tokens] * seqs)
            outs = [torch.empty(seqs * tokens, HEADS, DIM) for _ in range(3)]
            call(new, q, k, v, kc, vc, batch, outs[2], 0, 1)
            times = {"old": [], "new": []}
            for _ in range(60):
                times["old"].append(call(old, q, k, v, kc, vc, batch, outs[0]))
                times["new"].append(call(new, q, k, v, kc, vc, batch, outs[1], int(native.WIDE), 1))
            assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), (seqs, context, tokens)
            before, after = (statistics.median(times[n][10:]) * 1000 for n in ("old", "new"))
            row.append(f"{tokens} tokens {before:.3f} -> {after:.3f} ms ({after / before:.2f})")
        print(f"{seqs} sequences, {context} cached, page {page}: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
