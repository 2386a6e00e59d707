"""Which weight layout a product of one or two rows reads fastest on this CPU: `F.linear(x, W)` against
`x @ W.T` kept contiguous, for the default target's weight shapes, each weight cycled from memory (more
copies than the last-level cache holds, as in a forward) rather than hot in cache.

Why: a decode step multiplies one row by every weight, so its speed is the speed of reading the weights;
`layers.Joined.linear` keeps a transposed copy of the weights this measures faster that way.

    python clients/bench_layout.py --json bench-out/layout.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

SHAPES = {"qkv": (640, 384), "gate_up": (2304, 384), "down": (384, 1152), "lm_head": (8192, 384)}
CACHE_BYTES = 96 << 20  # more than the last-level cache of the machines this ran on


def per_call_us(fn, weights: list[torch.Tensor], passes: int = 4) -> float:
    for w in weights:
        fn(w)
    t0 = time.perf_counter()
    for _ in range(passes):
        for w in weights:
            fn(w)
    return (time.perf_counter() - t0) / (passes * len(weights)) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--rows", default="1,2,4,16")
    args = p.parse_args()
    rows = []
    for name, (n, k) in SHAPES.items():
        weights = [torch.randn(n, k) for _ in range(max(2, CACHE_BYTES // (n * k * 4)))]
        transposed = [w.t().contiguous() for w in weights]
        for m in map(int, args.rows.split(",")):
            x = torch.randn(m, k)
            linear = per_call_us(lambda w: F.linear(x, w), weights)
            copy = per_call_us(lambda w: x @ w, transposed)
            rows.append({"weight": name, "shape": [n, k], "rows": m, "linear_us": round(linear, 1),
                         "transposed_us": round(copy, 1), "speedup": round(linear / copy, 2)})
            print(rows[-1], flush=True)
    report = {"threads": torch.get_num_threads(), "torch": torch.__version__, "platform": platform.platform(),
              "cpu": platform.processor() or platform.machine(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
