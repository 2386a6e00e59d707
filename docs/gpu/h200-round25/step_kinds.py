"""Round 25's diagnosis of adaflash against prompt lookup where the gate's copy arm leads: every call of `ngram` and of
gated `adaflash` by what it did (admitted new sequences or not, recorded a graph or not) and, for adaflash, the arm
it ran, over HumanEval prompts after a warm-up pass.

Why: on the H200 at 8 sequences over 64 prompts, adaflash ran 0.82-0.86 of ngram although the copy arm, which it ran
in most calls, commits at ngram's rate per call (bench_gate's `arms`): the rest of the time is in calls the gate does
not observe.

    PYTHONPATH=python_backend:clients python docs/gpu/h200-round25/step_kinds.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from adaflash.cli_args import add_placement_args
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.models import graphs
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement
from bench_step import code_prompts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--eval-data", type=Path, default=Path("../shared/data"))
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    add_placement_args(p)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    bundle = load_bundle(Path("models/default"), place=placement(args.device, args.dtype))
    c = args.concurrency
    ids = code_prompts(bundle, args.eval_data, max(args.prompts, c))
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=c, max_len=max_len)
    scheduler, gate = engine.scheduler, engine.scheduler.gate
    report = {}
    for mode in ("ngram", "adaflash", "ngram", "adaflash"):
        engine.generate([Request(i, args.max_tokens, mode=mode) for i in ids], concurrency=c)  # warm-up
        kinds: dict[str, list[float]] = {}
        arms: list = []
        choose = gate.choose

        def chosen(sequences, choose=choose, arms=arms):
            arms.append(choose(sequences))
            return arms[-1]

        gate.choose = chosen
        step = scheduler.step

        async def timed(step=step, kinds=kinds, arms=arms):
            arms.clear()
            before = sum(len(s.output) for s in scheduler.running.values())
            recorded, waiting, t0 = graphs.recordings(), len(scheduler.waiting), time.perf_counter()
            out = await step()
            ms = (time.perf_counter() - t0) * 1000
            admitted = len(scheduler.waiting) < waiting
            kind = ("admits" if admitted else "steps") + (", records" if graphs.recordings() > recorded else "")
            if arms:
                kind += f", {arms[0].value}"
            tokens = sum(len(s.output) for s in out) - before
            row = kinds.setdefault(kind, [0, 0, 0.0])
            row[0], row[1], row[2] = row[0] + 1, row[1] + tokens, row[2] + ms
            return out

        scheduler.step = timed
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, args.max_tokens, mode=mode) for i in ids], concurrency=c)
        wall = (time.perf_counter() - t0) * 1000
        del scheduler.step, gate.choose
        name = mode if mode not in report else mode + " again"
        report[name] = {"tokens": sum(len(s.output) for s in seqs), "wall_ms": round(wall, 1),
                        **{k: {"calls": n, "tokens": t, "ms": round(ms, 1)} for k, (n, t, ms) in sorted(kinds.items())}}
        print(name, json.dumps(report[name]), flush=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
