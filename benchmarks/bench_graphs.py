"""Steps and drafts replayed as CUDA graphs against the same run eagerly, in one process on one GPU: engine.generate's
tokens per second for each mode at each concurrency, the two alternating pass by pass, and whether every output
equals the eager run's and plain decoding's (or leaves it only at a near-tie of the target's logits).

Why: the graphs (`adaflash.models.graphs`) exist to take a step off the host; only a measured A/B in one run says
what they give end to end, and only with the outputs compared is it a speed-up and not a different decoder.

    python benchmarks/bench_graphs.py --json bench-out/gpu/graphs.json [--concurrency 1,8,32] [--modes ar,ngram]

On a machine without CUDA it runs with the padded steps eager on the CPU (a check of the script, not a figure).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from adaflash.cli_args import add_placement_args
from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.bench import departures
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of
from adaflash.models.placement import placement
from bench_step import EVAL_DATA, code_prompts

ARMS = ("eager", "graphs")


def timed_generate(engine: Engine, graphed: bool, prompts: list[list[int]], mode: str, max_tokens: int,
                   concurrency: int) -> tuple[float, list[list[int]]]:
    """Tokens per second and outputs of one pass, the target's steps and the drafter's drafts graphed or not."""
    set_graphs(engine.target, engine.backend.drafter, graphed)
    engine.backend.place.synchronize()
    t0 = time.perf_counter()
    seqs = engine.generate([Request(ids, max_tokens, mode=mode, stop_ids=()) for ids in prompts], concurrency)
    engine.backend.place.synchronize()
    return sum(len(s.output) for s in seqs) / (time.perf_counter() - t0), [s.output for s in seqs]


def set_graphs(target: torch.nn.Module, drafter: torch.nn.Module | None, graphed: bool) -> None:
    target.step_graphs = graphed
    if drafter is not None:
        drafter.step_graphs = graphed


def capture_failures(engine: Engine) -> list[str]:
    """What CUDA refused to record for this engine's caches (those shapes ran eagerly)."""
    backend = engine.backend
    recorders = [engine.target.recorders.get(backend.cache)]
    if backend.drafter is not None:
        recorders.append(backend.drafter.recorders.get(backend.context))
    return [f for r in recorders if r is not None for f in r.failures]


def worst_gap(target: torch.nn.Module, prompts: list[list[int]], reference: list[list[int]],
              outputs: list[list[int]]) -> float:
    """The largest logit gap (a fraction of the largest logit) where an output first leaves the reference; 0 when
    every output equals it."""
    target.step_graphs = False
    return max(departures(target, prompts, reference, outputs), default=0.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=Path("models/default"))
    p.add_argument("--eval-data", type=Path, default=EVAL_DATA,
                   help="a data folder holding eval/humaneval.jsonl (default: the packaged sample)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--modes", default="ar,ngram,dflash,adaflash")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--passes", type=int, default=2, help="timed passes per arm, alternating; the best is reported")
    add_placement_args(p)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args(argv)
    place = placement(args.device, args.dtype)
    bundle = load_bundle(args.model_dir, place=place)
    target = bundle.target
    levels = [int(c) for c in args.concurrency.split(",")]
    ids = code_prompts(bundle, args.eval_data, max(max(levels), 8))
    max_len = context_length([len(i) for i in ids], args.max_tokens, block_size_of(bundle.drafter))
    report = {"torch": torch.__version__, "device": str(place.device), "dtype": place.dtype_name,
              "max_tokens": args.max_tokens, "passes": args.passes, "rows": []}
    for c in levels:
        prompts = ids[: max(c, 8)]
        engines = {}
        for arm in ARMS:  # each arm's engine measures its own costs, with its steps graphed or not
            set_graphs(target, bundle.drafter, arm == "graphs")
            engines[arm] = Engine(target, bundle.drafter, num_slots=c, max_len=max_len)
        plain = None
        for mode in args.modes.split(","):
            rates = {arm: [] for arm in ARMS}
            outputs = {}
            for arm in ARMS:  # warm-up: records the graphs of the shapes this workload meets
                timed_generate(engines[arm], arm == "graphs", prompts[:c], mode, min(16, args.max_tokens), c)
            for _ in range(args.passes):
                for arm in ARMS:
                    rate, outputs[arm] = timed_generate(engines[arm], arm == "graphs", prompts, mode, args.max_tokens,
                                                        c)
                    rates[arm].append(rate)
            plain = plain or outputs["eager"]  # the first mode is the reference (ar by default)
            row = {"concurrency": c, "mode": mode, "prompts": len(prompts)}
            for arm in ARMS:
                row[f"{arm}_tok_s"] = round(max(rates[arm]), 1)
                row[f"{arm}_equal_to_plain"] = sum(o == r for o, r in zip(outputs[arm], plain))
            row["speedup"] = round(row["graphs_tok_s"] / row["eager_tok_s"], 3)
            row["graphs_equal_to_eager"] = sum(a == b for a, b in zip(outputs["graphs"], outputs["eager"]))
            row["capture_failures"] = capture_failures(engines["graphs"])
            row["worst_tie_gap"] = round(max(worst_gap(target, prompts, plain, outputs[arm]) for arm in ARMS), 5)
            report["rows"].append(row)
            print(row, flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
