"""Round 26's whole runs of adaflash held on one arm of the gate, beside `ar`, `ngram` and the gate itself, on the
CPU in one process (one engine; the gate's `choose` replaced while an arm is held), four rounds: what each arm's
runs give end to end, admissions and a batch's last steps included, which the gate's per-call rates leave out.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round26/arms_fixed.py code 8
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import Arm
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of

VARIANTS = {"ar": ("ar", None), "ngram": ("ngram", None), "adaflash on plain": ("adaflash", Arm.PLAIN),
            "adaflash on plan": ("adaflash", Arm.PLAN), "adaflash gated": ("adaflash", None)}


def main() -> None:
    domain, c = sys.argv[1], int(sys.argv[2])
    bundle = load_bundle(Path("models/default"))
    prompts = [p for p in eval_set_prompts(Path("../shared/data"), 64) if p.domain == domain]
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
    gate = engine.scheduler.gate
    choose = gate.choose
    tps: dict[str, list[float]] = {}
    for _ in range(4):
        for name, (mode, arm) in VARIANTS.items():
            gate.choose = choose if arm is None else (lambda n, arm=arm: arm)
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, 96, mode=mode) for i in ids], concurrency=c)
            tps.setdefault(name, []).append(sum(len(s.output) for s in seqs) / (time.perf_counter() - t0))
            gate.choose = choose
    for name, runs in tps.items():
        print(name, [round(x) for x in runs], "over ar, median of rounds",
              round(statistics.median(a / b for a, b in zip(runs, tps["ar"])), 3))


if __name__ == "__main__":
    main()
