"""Round 26's diagnosis of adaflash beside `ar` under load on the CPU: every call of each run by what it did (admitted
waiting sequences or not, and adaflash's arm), its tokens, its time and the forwards' and drafts' time inside.
An arm given as the fourth argument holds the gate on it.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round26/call_kinds.py \\
        code 8 ar,adaflash,ar,adaflash [plan|plain]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from adaflash.decoding.engine import Engine
from adaflash.decoding.gate import Arm
from adaflash.decoding.sequence import Request, context_length
from adaflash.evaluation.prompts import encode_prompts, eval_set_prompts
from adaflash.models.bundle import load_bundle
from adaflash.models.drafter import block_size_of


def main() -> None:
    domain, c, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
    held = Arm(sys.argv[4]) if len(sys.argv) > 4 else None
    bundle = load_bundle(Path("models/default"))
    prompts = [p for p in eval_set_prompts(Path("../shared/data"), 64) if p.domain == domain]
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    max_len = context_length([len(i) for i in ids], 96, block_size_of(bundle.drafter))
    engine = Engine(bundle.target, bundle.drafter, num_slots=64, max_len=max_len)
    scheduler, gate, backend = engine.scheduler, engine.scheduler.gate, engine.scheduler.backend
    choose, forward, draft, step = gate.choose, backend.forward, backend.draft, scheduler.step
    for mode in modes:
        kinds: dict[str, dict[str, float]] = {}
        arms: list[Arm] = []
        inner = {"forward": 0.0, "draft": 0.0}

        def chosen(n: int) -> Arm:
            arms.append(held or choose(n))
            return arms[-1]

        async def timed_forward(*a):
            t0 = time.perf_counter()
            out = await forward(*a)
            inner["forward"] += time.perf_counter() - t0
            return out

        async def timed_draft(*a):
            t0 = time.perf_counter()
            out = await draft(*a)
            inner["draft"] += time.perf_counter() - t0
            return out

        async def timed_step():
            arms.clear()
            inner.update(forward=0.0, draft=0.0)
            before = sum(len(s.output) for s in scheduler.running.values())
            waiting, t0 = len(scheduler.waiting), time.perf_counter()
            out = await step()
            ms = (time.perf_counter() - t0) * 1000
            kind = ("admits" if len(scheduler.waiting) < waiting else "steps") + (f", {arms[0].value}" if arms else "")
            row = kinds.setdefault(kind, {"calls": 0, "tokens": 0, "ms": 0.0, "forward_ms": 0.0, "draft_ms": 0.0,
                                          "admitted": 0, "sequences": 0})
            row["calls"] += 1
            row["tokens"] += sum(len(s.output) for s in out) - before
            row["ms"] += ms
            row["forward_ms"] += inner["forward"] * 1000
            row["draft_ms"] += inner["draft"] * 1000
            row["admitted"] += waiting - len(scheduler.waiting)
            row["sequences"] += len(out)
            return out

        gate.choose, backend.forward, backend.draft, scheduler.step = chosen, timed_forward, timed_draft, timed_step
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, 96, mode=mode) for i in ids], concurrency=c)
        wall = time.perf_counter() - t0
        gate.choose, backend.forward, backend.draft, scheduler.step = choose, forward, draft, step
        tokens = sum(len(s.output) for s in seqs)
        print(f"{mode}: {tokens} tokens in {wall * 1000:.0f} ms, {tokens / wall:.0f} tok/s")
        for kind, r in sorted(kinds.items()):
            rest = r["ms"] - r["forward_ms"] - r["draft_ms"]
            print(f"  {kind:14s} calls {r['calls']:4.0f} tokens {r['tokens']:5.0f} ms {r['ms']:6.0f} "
                  f"(forward {r['forward_ms']:.0f}, draft {r['draft_ms']:.0f}, rest {rest:.0f}) "
                  f"tok/ms {r['tokens'] / r['ms']:.2f} admitted {r['admitted']:.0f} "
                  f"mean sequences {r['sequences'] / r['calls']:.1f}")


if __name__ == "__main__":
    main()
