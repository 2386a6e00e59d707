"""Round 27's split of a closed batch's time into its steady part and its drain (the last steps, once no request
waits and fewer than `concurrency` sequences run), for adaflash with the gate held on the plain arm, held on the plan
arm, and gated, on the CPU in one process (one engine; the gate's `choose` replaced while an arm is held). Plain
decoding keeps a batch of requests of one length in step, so they end together and it has no drain; any planned
step puts them out of step.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round27/drain.py code 8 3 [prompts]

`prompts`: how many of the domain's prompts (default 64, as bench_gate's cells).
"""

from __future__ import annotations

import sys
import time

from adaflash.decoding.gate import Arm
from adaflash.decoding.sequence import Request
from cell import MAX_TOKENS, load_cell


def main() -> None:
    domain, c, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load_cell(domain, int(sys.argv[4]) if len(sys.argv) > 4 else 64)
    engine = cell.engine()
    scheduler = engine.scheduler
    choose, step = scheduler.gate.choose, scheduler.step
    steps: list[tuple[bool, float]] = []  # (in the drain, seconds) per step

    async def logged_step():
        draining = not scheduler.waiting and len(scheduler.running) < c
        t0 = time.perf_counter()
        out = await step()
        steps.append((draining, time.perf_counter() - t0))
        return out

    scheduler.step = logged_step
    for _ in range(rounds):
        for variant, (mode, arm) in {"ar": ("ar", None), "held on plain": ("adaflash", Arm.PLAIN),
                                     "held on plan": ("adaflash", Arm.PLAN), "gated": ("adaflash", None)}.items():
            scheduler.gate.choose = choose if arm is None else (lambda n, arm=arm: arm)
            steps.clear()
            t0 = time.perf_counter()
            seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in cell.ids], concurrency=c)
            wall = time.perf_counter() - t0
            drain = [s for d, s in steps if d]
            print(f"{variant:14s} {sum(len(s.output) for s in seqs) / wall:6.0f} tok/s, wall {wall * 1000:5.0f} ms: "
                  f"steady {sum(s for d, s in steps if not d) * 1000:5.0f} ms in {len(steps) - len(drain)} steps, "
                  f"drain {sum(drain) * 1000:4.0f} ms in {len(drain)} steps", flush=True)
    scheduler.gate.choose = choose


if __name__ == "__main__":
    main()
