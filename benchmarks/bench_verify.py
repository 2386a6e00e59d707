"""Verify forward times of the target by batch size, new tokens in the call and cached positions per sequence.

Why: the length policy trades verified tokens against these times, and a kernel change moves them unevenly (a
product faster at 64 rows than at 8, attention that grows with the context). The script times each point as the
engine's cost table does (`costs.typical_ms`: the median of --reps runs after a warm-up, in rounds over all the
points of one context), with only the engine's model API, so it runs unchanged against an older checkout
(PYTHONPATH=<checkout>/python_backend) for a before/after table measured alike.

    python benchmarks/bench_verify.py --json bench-out/verify.json [--batches 1,8,32,64 --contexts 128,448]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
from bench_step import git_revision

from adaflash.decoding.costs import ragged_tokens, typical_ms, verify_fn
from adaflash.models.bundle import load_bundle
from adaflash.models.placement import place_of

TOKENS_PER_SEQ = (1, 2, 4, 8, 16)


def time_verifies(model_dir: Path, batches: list[int], contexts: list[int], reps: int) -> list[dict]:
    target = load_bundle(model_dir, drafter=None).target
    g = torch.Generator().manual_seed(0)
    vocab, rows = target.config.vocab_size, []
    for batch in batches:
        slots = list(range(batch))
        for context in contexts:
            cache = target.new_cache(batch, context + max(TOKENS_PER_SEQ) + 1)
            target.forward(cache, slots, torch.randint(0, vocab, (batch, context), generator=g).tolist(),
                           logit_rows=torch.tensor([0]))
            totals = [batch * k for k in TOKENS_PER_SEQ]
            fns = [verify_fn(target, cache, slots, context, ragged_tokens(n, batch, vocab, g)) for n in totals]
            for n, ms in zip(totals, typical_ms(fns, reps, place_of(target))):
                rows.append({"batch": batch, "context": context, "tokens": n, "ms": round(ms, 3)})
                print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=Path("models/default"))
    p.add_argument("--batches", default="1,8,32,64")
    p.add_argument("--contexts", default="128")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    rows = time_verifies(args.model_dir, [int(b) for b in args.batches.split(",")],
                         [int(c) for c in args.contexts.split(",")], args.reps)
    report = {"revision": git_revision(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "platform": platform.platform(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
