"""Round 26's A/B of the gate's preference for plain decoding, in one process: `ar`, `ngram` and adaflash under
gates whose `plain_preference` differs, alternating in rotated order, one engine whose gate object is swapped
between runs (the same weights, cost table and caches for every variant); every output compared with `ar`'s. The
gates' arms are the engine's (`gate.arms_for`: the copy arm too where steps are graphed). On a GPU give `--device
cuda --warmup 1` (graphs are recorded on a shape's first use); `calls_by_arm` is cumulative over the gates' life.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round26/preference_ab.py \\
        --json docs/engine-speed/round26/preference-ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from adaflash.cli_args import add_placement_args, csv_list
from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import PlanGate, arms_for
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement

LOW_LOAD_PROMPTS = 16  # as bench_gate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--eval-data", type=Path, default=Path("../shared/data"))
    p.add_argument("--domains", type=csv_list(str), default=["code", "chat", "prose"])
    p.add_argument("--concurrency", type=csv_list(int), default=[1, 8, 32])
    p.add_argument("--preferences", type=csv_list(float), default=[0.0, 0.1, 0.2])
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=0, help="untimed rounds of each cell first")
    add_placement_args(p)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    bundle = load_bundle(Path("models/default"), place=placement(args.device, args.dtype))
    prompts = eval_set_prompts(args.eval_data, 64, training_template=True)
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=max(args.concurrency), max_len=max_len)
    arms = arms_for(True, engine.cost is not None and engine.cost.padded)
    gates = {f"preference {x}": PlanGate(arms=arms, plain_preference=lambda n, x=x: 0.0 if n <= 1 else x)
             for x in args.preferences}  # x at every load of more than one sequence, as the gate took it then
    rows = []
    for domain in args.domains:
        cell_ids = [i for i, q in zip(ids, prompts) if q.domain == domain]
        for c in args.concurrency:
            cell = cell_ids[:LOW_LOAD_PROMPTS] if c == 1 else cell_ids
            for variant in ["ar", "ngram", *gates] * args.warmup:
                engine.scheduler.gate = gates.get(variant, engine.scheduler.gate)
                mode = variant if variant in ("ar", "ngram") else "adaflash"
                engine.generate([Request(i, args.max_tokens, mode=mode) for i in cell], concurrency=c)
            for repeat in range(args.repeats):
                names = list(gates)
                names = names[repeat % len(names):] + names[:repeat % len(names)]
                tps, reference, equal = {}, None, True
                for variant in ["ar", "ngram", *names]:
                    mode = variant if variant in ("ar", "ngram") else "adaflash"
                    if variant in gates:
                        engine.scheduler.gate = gates[variant]
                    t0 = time.perf_counter()
                    seqs = engine.generate([Request(i, args.max_tokens, mode=mode) for i in cell], concurrency=c)
                    tps[variant] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
                    reference = reference or [s.output for s in seqs]
                    equal &= [s.output for s in seqs] == reference
                rows.append({"domain": domain, "concurrency": c, "repeat": repeat, "equal_to_ar": equal,
                             **{k: round(v, 1) for k, v in tps.items()},
                             "calls_by_arm": {g: {a.value: t.calls for a, t in gates[g].tally.items()} for g in gates}})
                best = max(tps["ar"], tps["ngram"])
                print(domain, c, repeat, equal, {k: round(v) for k, v in tps.items()},
                      {g: round(tps[g] / best, 3) for g in gates}, flush=True)
    summary = []
    for domain in args.domains:
        for c in args.concurrency:
            cell = [r for r in rows if (r["domain"], r["concurrency"]) == (domain, c)]
            summary.append({"domain": domain, "concurrency": c,
                            "over_best_by_round_median": {g: round(statistics.median(
                                r[g] / max(r["ar"], r["ngram"]) for r in cell), 3) for g in gates}})
            print(json.dumps(summary[-1]), flush=True)
    args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
