"""Round 27: bench_gate's order with and without an untimed `ngram` run between `dflash` and adaflash, alternating
round by round in one process (one engine, as bench_gate's `ar`, `ngram`, `dflash` and adaflash share one), code c=8:
whether a `dflash` run just before costs adaflash's timed run (output in spacer-ab.txt).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/spacer_ab.py code 8 6
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of


def main() -> None:
    domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    bundle = load_bundle(Path("models/default"))
    prompts = [p for p in eval_set_prompts(Path("../shared/data"), 64, training_template=True) if p.domain == domain]
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)

    def run(mode: str) -> float:
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, 96, mode=mode) for i in ids], concurrency=c)
        return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)

    ratios: dict[str, list[float]] = {"right after dflash": [], "ngram between": []}
    for repeat in range(2 * rounds):
        spaced = repeat % 2 == 1
        ar = run("ar")
        run("ngram")
        run("dflash")
        if spaced:
            run("ngram")
        key = "ngram between" if spaced else "right after dflash"
        ratios[key].append(run("adaflash") / ar)
        print(key, round(ratios[key][-1], 3), flush=True)
    print({k: round(statistics.median(v), 3) for k, v in ratios.items()})


if __name__ == "__main__":
    main()
