"""Round 31: where a step of adaflash's plan arm goes under load, against `ar` on the same engine: every call on the
plan arm (no gate) or plain (`ar`), per target call, milliseconds in the plan, drafter forwards, target forwards and the
rest; and the calls' verify widths (tokens per call over sequences). Each part timed by a wrapper.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/plan_parts.py chat 32 3
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, load  # noqa: E402
from turns import timed  # noqa: E402

from adaflash.decoding.sequence import Request  # noqa: E402

acc: dict[str, float] = {}


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    sch = engine.scheduler
    sch.gate = None
    timed(sch.planner, "plan", "plan", acc)
    timed(engine.backend, "draft", "draft", acc, coroutine=True)
    timed(engine.backend, "forward", "forward", acc, coroutine=True)
    for _ in range(rounds):
        for mode in ("ar", "adaflash"):
            acc.clear()
            calls = [0]
            step = sch.step

            async def counted():
                calls[0] += 1
                return await step()
            sch.step = counted
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in cell.ids], concurrency=concurrency)
            wall = time.perf_counter() - t0
            del sch.step
            n = calls[0]
            tokens = sum(len(s.output) for s in seqs)
            proposed = Counter((r.draft_len, r.copied) for s in seqs for r in s.steps)
            rest = wall - sum(acc.values())
            print(f"{mode:8} {tokens / wall:7.0f} tok/s calls {n} ms/call {wall / n * 1e3:.2f}",
                  " ".join(f"{k} {v / n * 1e3:.2f}" for k, v in acc.items()), f"rest {rest / n * 1e3:.2f}",
                  "proposed", dict(sorted(proposed.items())), flush=True)


if __name__ == "__main__":
    main()
