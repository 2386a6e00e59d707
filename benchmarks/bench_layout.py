"""Which weight layout a product of a few rows reads fastest on this CPU: `F.linear(x, W)`, `x @ W.T` kept
contiguous, W split by output rows into one transposed part per thread multiplied as one batched product
(`layers.split_linear`), W packed by oneDNN (`layers.packed_linear`), and W as it is through the C kernel
(`native.product` over `native.panels(W)`, where it builds), for the default target's weight shapes, each weight cycled from memory (more
copies than the last-level cache holds, as in a forward) rather than hot in cache.

Why: a decode or verify step multiplies a few rows by every weight, so its speed is the speed of reading the
weights, and MKL reads them slowly for so few rows; `layers.Joined.linear` uses the product that wins here.

    python benchmarks/bench_layout.py --json bench-out/layout.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from adaflash.cli_args import csv_list
from adaflash.models import native
from adaflash.models.layers import packed_linear, packed_weight, split_linear, split_rows

SHAPES = {"qkv": (640, 384), "o": (384, 384), "gate_up": (2304, 384), "down": (384, 1152), "lm_head": (8192, 384)}
CACHE_BYTES = 96 << 20  # more than the last-level cache of the machines this ran on


def per_call_us(fn, weights: list[torch.Tensor], passes: int = 4) -> float:
    for w in weights:
        fn(w)
    t0 = time.perf_counter()
    for _ in range(passes):
        for w in weights:
            fn(w)
    return (time.perf_counter() - t0) / (passes * len(weights)) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--rows", default="1,2,4,16,64,256")
    p.add_argument("--weights", type=csv_list(str, tuple(SHAPES)), default=list(SHAPES),
                   help=f"which weight shapes, of {', '.join(SHAPES)}")
    p.add_argument("--cache-mb", type=int, default=CACHE_BYTES >> 20,
                   help="each weight is cycled over copies filling this many MiB (at least two copies)")
    args = p.parse_args(argv)
    rows = []
    for name in args.weights:
        n, k = SHAPES[name]
        weights = [torch.randn(n, k) for _ in range(max(2, (args.cache_mb << 20) // (n * k * 4)))]
        transposed = [w.t().contiguous() for w in weights]
        split = [split_rows(w, torch.get_num_threads()) for w in weights]
        packed = [packed_weight(w) for w in weights]
        panelled = [native.panels(w) for w in weights] if native.available() else []
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k)
            linear = per_call_us(lambda w: F.linear(x, w), weights)
            copy = per_call_us(lambda w: x @ w, transposed)
            parts = per_call_us(lambda w: split_linear(x, w), split)
            onednn = per_call_us(lambda w: packed_linear(x, w, None), packed)
            c = per_call_us(lambda w: native.product(x, w, n), panelled) if native.available() else None
            rows.append({"weight": name, "shape": [n, k], "rows": m, "linear_us": round(linear, 1),
                         "transposed_us": round(copy, 1), "split_us": round(parts, 1), "packed_us": round(onednn, 1),
                         "native_us": None if c is None else round(c, 1)})
            print(rows[-1], flush=True)
    report = {"threads": torch.get_num_threads(), "torch": torch.__version__, "platform": platform.platform(),
              "cache_mb": args.cache_mb,
              "cpu": platform.processor() or platform.machine(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
