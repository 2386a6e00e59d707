"""Round 24's diagnosis of the gate on a GPU: every call the gate observes, by arm and load, against the same
decoding without the gate and against `ar` and `ngram`, on HumanEval prompts after a warm-up pass (graphs recorded);
steps by the sequences they ran.

Why: on the H200 the gate's running rate of the plan arm at one sequence (0.9-1.2 tokens/ms) sat far below what
adaflash without the gate decodes at (about 1.7), while on the CPU the two agree.

    PYTHONPATH=python_backend:clients python docs/gpu/h200-round24/gate_calls.py --device cuda --json out.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
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


def summary(calls: list[tuple[int, float]]) -> dict:
    ms = [m for _, m in calls]
    return {"calls": len(calls), "tokens_per_call": round(sum(t for t, _ in calls) / max(len(calls), 1), 3),
            "ms_mean": round(statistics.fmean(ms), 3) if ms else None,
            "ms_median": round(statistics.median(ms), 3) if ms else None,
            "ms_p90": round(sorted(ms)[int(0.9 * len(ms))], 3) if ms else None,
            "tokens_per_ms": round(sum(t for t, _ in calls) / sum(ms), 3) if ms else None}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--eval-data", type=Path, default=Path("../shared/data"))
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=1)
    add_placement_args(p)
    p.add_argument("--json", type=Path, required=True)
    args = p.parse_args()
    bundle = load_bundle(Path("models/default"), place=placement(args.device, args.dtype))
    c = args.concurrency
    ids = code_prompts(bundle, args.eval_data, max(args.prompts, c))
    max_len = context_length([len(i) for i in ids], 64, block_size_of(bundle.drafter))
    gated = Engine(bundle.target, bundle.drafter, num_slots=c, max_len=max_len)
    plain = Engine(bundle.target, bundle.drafter, num_slots=c, max_len=max_len, cost_model=copy.deepcopy(gated.cost),
                   plan_gate=False)
    # Without a drafter: the same policy over copies alone, no features captured or kept (what planning costs apart)
    alone = Engine(bundle.target, bundle.drafter, num_slots=c, max_len=max_len, cost_model=copy.deepcopy(gated.cost),
                   plan_gate=False)
    alone.scheduler.has_drafter = False  # sequences admitted from now on cannot draft (`Scheduler.add`)
    report = {}
    for name, engine, mode in (("ar", gated, "ar"), ("ngram", gated, "ngram"), ("adaflash", gated, "adaflash"),
                               ("adaflash-no-gate", plain, "adaflash"), ("adaflash-no-drafter", alone, "adaflash")):
        engine.generate([Request(i, 64, mode=mode) for i in ids], concurrency=c)  # warm-up: shapes recorded
        calls: dict[str, list] = {}
        gate = engine.scheduler.gate
        if gate is not None:
            def watching(arm, tokens, ms, observe=gate.observe, calls=calls, gate=gate):
                calls.setdefault(f"{arm.value} at {1 << (gate._bucket - 1)}+", []).append((tokens, ms))
                observe(arm, tokens, ms)

            gate.observe = watching
        step = engine.scheduler.step

        async def timed_step(step=step, calls=calls, engine=engine):
            running = len(engine.scheduler.running)
            before = sum(len(s.output) for s in engine.scheduler.running.values())
            recorded, t0 = graphs.recordings(), time.perf_counter()
            out = await step()
            ms = (time.perf_counter() - t0) * 1000
            after = sum(len(s.output) for s in out)
            if graphs.recordings() == recorded and running:
                calls.setdefault(f"steps at {1 << (running.bit_length() - 1)}+", []).append((after - before, ms))
            return out

        engine.scheduler.step = timed_step
        planning: list[float] = []
        plan = engine.planner.plan

        def timed_plan(*a, plan=plan, planning=planning, **k):
            t0 = time.perf_counter()
            out = plan(*a, **k)
            planning.append((time.perf_counter() - t0) * 1000)
            return out

        engine.planner.plan = timed_plan
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, 64, mode=mode) for i in ids], concurrency=c)
        wall = time.perf_counter() - t0
        del engine.scheduler.step, engine.planner.plan
        if gate is not None:
            del gate.observe
        report[name] = {"tokens_per_s": round(sum(len(s.output) for s in seqs) / wall, 1),
                        "plan_ms_mean": round(statistics.fmean(planning), 3) if planning else None,
                        **{k: summary(v) for k, v in sorted(calls.items())}}
        print(name, json.dumps(report[name]), flush=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
