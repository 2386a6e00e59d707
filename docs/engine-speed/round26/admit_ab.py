"""Round 26's A/B of admitting steps on the CPU: one forward for an admitted prompt and the others' verifies, every
prefill in the native kernels ("new"), against round 25's two forwards, prompts through torch's attention ("old"),
emulated in the same process by sending forwards with more than a block of new tokens per sequence to torch's
attention and never joining a prefill to a verify. `ar` and gated `adaflash` under each, one engine per variant,
alternating in rotated order every round; every output checked equal to the round's `ar`.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round26/admit_ab.py \\
        --json docs/engine-speed/round26/admit-ab.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time
from pathlib import Path

from adaflash.cli_args import csv_list
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models import native
from adaflash.models import target as target_module
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.target import ForwardBatch, Transformer


@contextlib.contextmanager
def round25_admissions():
    """Prompts through torch's attention, and a prefill never in the verify's forward."""
    build, invariant, attends = ForwardBatch.build.__func__, Transformer.batch_invariant, native.attends_over

    def old_build(cls, cache, slots, starts, counts, device, *a, **k):
        target_module.native.attends_over = attends if max(counts) <= target_module.STEP_MAX_NEW else (lambda s: False)
        try:
            return build(cls, cache, slots, starts, counts, device, *a, **k)
        finally:
            target_module.native.attends_over = attends

    ForwardBatch.build = classmethod(old_build)
    Transformer.batch_invariant = lambda self, cache: False
    try:
        yield
    finally:
        ForwardBatch.build, Transformer.batch_invariant = classmethod(build), invariant


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--domains", type=csv_list(str), default=["code", "prose"])
    p.add_argument("--concurrency", type=csv_list(int), default=[8, 32])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    bundle = load_bundle(Path("models/default"))
    prompts = eval_set_prompts(Path("../shared/data"), 64)
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
    new = Engine(bundle.target, bundle.drafter, num_slots=max(args.concurrency), max_len=max_len)
    old = Engine(bundle.target, bundle.drafter, num_slots=max(args.concurrency), max_len=max_len,
                 cost_model=copy.deepcopy(new.cost))
    variants = {"ar old": (old, "ar", True), "adaflash old": (old, "adaflash", True),
                "ar new": (new, "ar", False), "adaflash new": (new, "adaflash", False)}
    rows = []
    for domain in args.domains:
        cell_ids = [i for i, q in zip(ids, prompts) if q.domain == domain]
        for c in args.concurrency:
            names = list(variants)
            for r in range(args.rounds):
                reference = None
                order = names[r % len(names):] + names[:r % len(names)]
                for name in sorted(order, key=lambda n: n.startswith("adaflash")):  # ar first: the reference
                    engine, mode, emulate = variants[name]
                    with round25_admissions() if emulate else contextlib.nullcontext():
                        t0 = time.perf_counter()
                        seqs = engine.generate([Request(i, 96, mode=mode) for i in cell_ids], concurrency=c)
                        wall = time.perf_counter() - t0
                    outputs = [s.output for s in seqs]
                    reference = reference or outputs
                    rows.append({"domain": domain, "concurrency": c, "round": r, "variant": name,
                                 "order": order.index(name), "tokens_per_s": round(sum(map(len, outputs)) / wall, 1),
                                 "equal_to_ar": outputs == reference})
                    print(rows[-1], flush=True)
    summary = []
    for domain in args.domains:
        for c in args.concurrency:
            cell = [r for r in rows if (r["domain"], r["concurrency"]) == (domain, c)]
            by_round = {}
            for r in cell:
                by_round.setdefault(r["round"], {})[r["variant"]] = r["tokens_per_s"]
            ratio = {k: statistics.median(v[f"adaflash {k}"] / v[f"ar {k}"] for v in by_round.values())
                     for k in ("old", "new")}
            gain = {m: statistics.median(v[f"{m} new"] / v[f"{m} old"] for v in by_round.values())
                    for m in ("ar", "adaflash")}
            summary.append({"domain": domain, "concurrency": c, "adaflash_over_ar": ratio, "new_over_old": gain,
                            "all_equal": all(r["equal_to_ar"] for r in cell)})
            print(summary[-1], flush=True)
    args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
