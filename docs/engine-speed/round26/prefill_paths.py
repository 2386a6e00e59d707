"""Round 26's prefill through the native kernels against torch's attention on the CPU, in one process: the target's
forward of prompts of a few lengths and batch sizes (random tokens, features of two layers captured, as adaflash
prefills), the median of five, and the largest difference of their logits.

    PYTHONPATH=python_backend .venv/bin/python docs/engine-speed/round26/prefill_paths.py \\
        --json docs/engine-speed/round26/prefill-paths.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from adaflash.models import native
from adaflash.models.bundle import load_bundle

SHAPES = ((1, 32), (1, 120), (1, 300), (1, 600), (1, 1000), (8, 120), (8, 400), (2, 500))  # (prompts, tokens)


def timed(target, cache, prompts: list[list[int]]) -> tuple[float, torch.Tensor]:
    times = []
    for _ in range(5):
        for slot in range(len(prompts)):
            cache.truncate(slot, 0)
        t0 = time.perf_counter()
        out = target.forward(cache, list(range(len(prompts))), prompts, capture_layers=[1, 3])
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times), out.logits


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    target = load_bundle(Path("models/default")).target
    cache = target.new_cache(8, 1024)
    attends = native.attends_over
    rows = []
    for n, length in SHAPES:
        prompts = torch.randint(0, 1000, (n, length), generator=torch.Generator().manual_seed(length)).tolist()
        native_ms, native_logits = timed(target, cache, prompts)
        native.attends_over = lambda store: False
        try:
            torch_ms, torch_logits = timed(target, cache, prompts)
        finally:
            native.attends_over = attends
        rows.append({"prompts": n, "tokens": length, "native_ms": round(native_ms, 1), "torch_ms": round(torch_ms, 1),
                     "native_over_torch_time": round(native_ms / torch_ms, 3),
                     "max_logit_difference": (native_logits - torch_logits).abs().max().item()})
        print(rows[-1], flush=True)
    args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
