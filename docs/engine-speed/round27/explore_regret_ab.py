"""Round 27's A/B of the gate's exploration, in one process: round 26's fixed steps (the arm behind tried after 2
blocks within 10%, 6 within 30%, else 16) against the regret budget (`gate.EXPLORE_REGRET`), beside `ar` and
`ngram`; one engine whose gate object is swapped between runs, the two gates in rotated order, every output compared
with `ar`'s. Each gate keeps what it learnt from cell to cell, as a server's would. On a GPU give `--device cuda
--warmup 1` (graphs are recorded on a shape's first use).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/explore_regret_ab.py \\
        --json docs/engine-speed/round27/explore-regret-ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from adaflash.cli_args import add_placement_args, csv_list
from adaflash.decoding import gate as G
from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import PlanGate, arms_for
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement

LOW_LOAD_PROMPTS = 16  # as bench_gate
STEPS = ((1.1, 2), (1.3, 6), (float("inf"), 16))  # round 26's rule


class SteppedLoad(G._Load):
    """A load of round 26's gate: the arm behind tried after a fixed number of blocks by how far it is behind."""

    def _explore_after(self, leader, arm):
        ahead = self.score(leader) / self.score(arm) if self.rates[arm] else float("inf")
        return next(blocks for bound, blocks in STEPS if ahead < bound) * (len(self.arms) - 1)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--eval-data", type=Path, default=Path("../shared/data"))
    p.add_argument("--cells", type=csv_list(str),
                   default=["code:1", "code:8", "math:8", "math:32", "code:32", "prose:32", "multilingual:8"])
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--warmup", type=int, default=0, help="untimed rounds of each cell first (GPUs: graphs)")
    add_placement_args(p)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    bundle = load_bundle(Path("models/default"), place=placement(args.device, args.dtype))
    prompts = eval_set_prompts(args.eval_data, 64, training_template=True)
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
    arms = arms_for(True, engine.cost is not None and engine.cost.padded)
    gates = {"steps": PlanGate(arms=arms), "regret": PlanGate(arms=arms)}
    loads = {"steps": SteppedLoad, "regret": G._Load}
    rows = []
    for cell_name in args.cells:
        domain, c = cell_name.split(":")[0], int(cell_name.split(":")[1])
        cell = [i for i, q in zip(ids, prompts) if q.domain == domain]
        cell = cell[:LOW_LOAD_PROMPTS] if c == 1 else cell
        for variant in ["ar", "ngram", *gates] * args.warmup:
            if variant in gates:
                engine.scheduler.gate, G._Load = gates[variant], loads[variant]
            mode = variant if variant in ("ar", "ngram") else "adaflash"
            engine.generate([Request(i, args.max_tokens, mode=mode) for i in cell], concurrency=c)
            G._Load = loads["regret"]
        for repeat in range(args.repeats):
            names = list(gates) if repeat % 2 == 0 else list(gates)[::-1]
            tps, calls, reference, equal = {}, {}, None, True
            for variant in ["ar", "ngram", *names]:
                mode = variant if variant in ("ar", "ngram") else "adaflash"
                if variant in gates:
                    engine.scheduler.gate, G._Load = gates[variant], loads[variant]
                    before = {a: t.calls for a, t in gates[variant].tally.items()}
                t0 = time.perf_counter()
                seqs = engine.generate([Request(i, args.max_tokens, mode=mode) for i in cell], concurrency=c)
                tps[variant] = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
                G._Load = loads["regret"]
                if variant in gates:
                    calls[variant] = {a.value: t.calls - before[a] for a, t in gates[variant].tally.items()}
                reference = reference or [s.output for s in seqs]
                equal &= [s.output for s in seqs] == reference
            rows.append({"domain": domain, "concurrency": c, "repeat": repeat, "equal_to_ar": equal,
                         **{k: round(v, 1) for k, v in tps.items()}, "calls_by_arm": calls})
            best = max(tps["ar"], tps["ngram"])
            print(domain, c, repeat, equal, {k: round(v) for k, v in tps.items()},
                  {g: round(tps[g] / best, 3) for g in gates}, calls, flush=True)
    summary = []
    for cell_name in args.cells:
        domain, c = cell_name.split(":")[0], int(cell_name.split(":")[1])
        cell = [r for r in rows if (r["domain"], r["concurrency"]) == (domain, c)]
        summary.append({"domain": domain, "concurrency": c,
                        "over_best_by_round_median": {g: round(statistics.median(
                            r[g] / max(r["ar"], r["ngram"]) for r in cell), 3) for g in gates},
                        "regret_over_steps_by_round": [round(r["regret"] / r["steps"], 3) for r in cell],
                        "plan_share": {g: round(sum(r["calls_by_arm"][g]["plan"] for r in cell) / max(1, sum(
                            sum(r["calls_by_arm"][g].values()) for r in cell)), 3) for g in gates}})
        print(json.dumps(summary[-1]), flush=True)
    args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
