"""Round 31: where the plan arm's planning goes under load: adaflash planning every step (no gate), each part of
`Planner.plan` timed by a wrapper (the n-gram lookups, the copy-or-draft comparison, the copy lengths and their
bookkeeping, the drafter choice), milliseconds per run of the cell's prompts; three runs.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/plan_sections.py chat 32

Its output in this round (113 plan calls a run): run wall 2338/2329/2277 ms; lookup 15.7/14.9/15.3, prefers_copy
28.1/25.9/25.6, copy_lengths 24.6/23.4/19.9, _copy 30.3/29.0/25.1 (copy_lengths included), choose_drafters 31.7/23.1/23.6,
plan 114.8/101.3/97.9.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import MAX_TOKENS, load  # noqa: E402
from turns import timed  # noqa: E402

from adaflash.decoding import planner  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

acc: dict[str, float] = {}


def main() -> None:
    cell = load(sys.argv[1])
    concurrency = int(sys.argv[2])
    engine = cell.engine()
    sch = engine.scheduler
    sch.gate = None
    for name in ("prefers_copy", "copy_lengths", "choose_drafters"):
        timed(sch.planner.controller, name, name, acc)
    timed(planner.ngram, "lookup", "lookup", acc)
    timed(sch.planner, "plan", "plan", acc)
    timed(sch.planner, "_copy", "_copy", acc)
    for _ in range(3):
        acc.clear()
        t0 = time.perf_counter()
        engine.generate([Request(i, MAX_TOKENS, mode="adaflash") for i in cell.ids], concurrency=concurrency)
        print(round((time.perf_counter() - t0) * 1e3), {k: round(v * 1e3, 1) for k, v in acc.items()}, flush=True)


if __name__ == "__main__":
    main()
