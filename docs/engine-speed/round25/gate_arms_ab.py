"""Round 25's A/B of the gate's copy arm on the CPU, in one process: `ar`, `ngram`, adaflash under the gate of
round 24 (plan and plain arms) and under this round's (plan, copy and plain), alternating, one engine whose gate
object is swapped between runs (the same weights, cost table and caches for every variant).

Why: the copy arm was made for the GPU, where prompt lookup is the best fixed mode at 1-32 sequences; on this CPU
plain decoding is the best under load, and trying the copy arm there costs calls. From 8 sequences the two gates
differ only in the copy arm and in how often the arms behind are tried (blocks are 4 calls in both).

    PYTHONPATH=python_backend:clients .venv/bin/python docs/engine-speed/round25/gate_arms_ab.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from adaflash.cli_args import csv_list
from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import Arm, PlanGate
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--eval-data", type=Path, default=Path("../shared/data"))
    p.add_argument("--domains", type=csv_list(str), default=["code", "math", "prose"])
    p.add_argument("--concurrency", type=csv_list(int), default=[8, 32, 64])
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    bundle = load_bundle(Path("models/default"))
    prompts = eval_set_prompts(args.eval_data, 64, training_template=True)
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=max(args.concurrency), max_len=max_len)
    gates = {"two arms": PlanGate(arms=(Arm.PLAN, Arm.PLAIN)), "three arms": PlanGate()}
    rows = []
    for domain in args.domains:
        cell_ids = [i for i, p in zip(ids, prompts) if p.domain == domain]
        for c in args.concurrency:
            for repeat in range(args.repeats):
                order = ["ar", "ngram", "two arms", "three arms"]
                if repeat % 2:
                    order[2:] = order[:1:-1]
                tps = {}
                for variant in order:
                    mode = variant if variant in ("ar", "ngram") else "adaflash"
                    if variant in gates:
                        engine.scheduler.gate = gates[variant]
                    t0 = time.perf_counter()
                    seqs = engine.generate([Request(i, args.max_tokens, mode=mode) for i in cell_ids], concurrency=c)
                    tps[variant] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
                rows.append({"domain": domain, "concurrency": c, "repeat": repeat,
                             **{k: round(v, 1) for k, v in tps.items()}})
                best = max(tps["ar"], tps["ngram"])
                print(domain, c, repeat, {k: round(v) for k, v in tps.items()},
                      f"two {tps['two arms'] / best:.3f} three {tps['three arms'] / best:.3f}", flush=True)
    summary = []
    for domain in args.domains:
        for c in args.concurrency:
            cell = [r for r in rows if (r["domain"], r["concurrency"]) == (domain, c)]
            ratio = {v: statistics.median(r[v] / max(r["ar"], r["ngram"]) for r in cell) for v in gates}
            summary.append({"domain": domain, "concurrency": c, "over_best_by_round_median": ratio,
                            "three_over_two": statistics.median(r["three arms"] / r["two arms"] for r in cell)})
            print(domain, c, json.dumps(summary[-1]))
    args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
