"""Round 40: what a lazy capture would have to fill. Over adaflash runs with the engine's gate (it learns over the
runs, as bench_gate's engine keeps it), the tokens committed in plain decoding calls (which capture features for the
drafter today), and of those, the ones a sequence drafts after (which a capture skipped on plain calls would have to
compute again before the draft). From round 40's change on, also the milliseconds of the drafts' calls and of their
refills (`Timed.refill_ms`).

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round40/gaps.py DOMAIN C RUNS
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402


def main(domain: str, concurrency: int, runs: int) -> None:
    cell = load(domain)
    engine = cell.engine()
    sched = engine.scheduler
    gap: Counter = Counter()
    tally = Counter()
    decode_run, draft = sched._decode_run, sched._draft

    async def plain(active, runs_):
        before = {s.id: len(s.output) for s in active}
        out = await decode_run(active, runs_)
        for s in active:
            gap[s.id] += len(s.output) - before[s.id]
            tally["plain_tokens"] += len(s.output) - before[s.id]
        tally["plain_calls"] += 1
        return out

    async def drafted(plan):
        for r in plan.drafts:
            tally["fill_tokens"] += gap.pop(r.key, 0)
            tally["drafts"] += 1
        tally["draft_calls"] += 1
        return await draft(plan)

    backend_draft = engine.backend.draft

    async def timed_draft(seqs, block_length):
        timed = await backend_draft(seqs, block_length)
        tally["draft_ms"] += timed.ms
        tally["refill_ms"] += getattr(timed, "refill_ms", 0.0)  # (none before round 40's change)
        return timed

    sched._decode_run, sched._draft, engine.backend.draft = plain, drafted, timed_draft
    for i in range(runs):
        tally.clear()
        gap.clear()
        t0 = time.perf_counter()
        tps = cell.tokens_per_s(engine, "adaflash", concurrency)
        seconds = time.perf_counter() - t0
        print(json.dumps({"run": i, "tokens_per_s": round(tps, 1), "run_ms": round(1000 * seconds, 1),
                          **{k: round(v, 2) for k, v in tally.items()}}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
