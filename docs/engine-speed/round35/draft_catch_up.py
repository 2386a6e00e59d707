"""Round 35: what a draft call's time is made of: the drafter's context catching up (the features committed since the
sequences last drafted, `LocalBackend.flush_context`) and the drafter's forward, against the cost table's draft time
for the same sequences and block; and the live draft scale the cost model learnt meanwhile (it learns from whole calls).
One run of gated adaflash.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/draft_catch_up.py code 1
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import Runs  # noqa: E402


def main() -> None:
    domain, concurrency = sys.argv[1], int(sys.argv[2])
    cell = load(domain)
    engine = cell.engine()
    backend, cost = engine.scheduler.backend, engine.cost
    flush, draft = backend.flush_context, backend.drafter.draft
    call: dict[str, float] = {}
    rows: list[tuple[int, int, int, float, float, float]] = []

    def timed_flush(seqs):
        call["pending"] = sum(sum(f.shape[0] for f in s.pending_context) for s in seqs)
        t0 = time.perf_counter()
        flush(seqs)
        call["flush"] = (time.perf_counter() - t0) * 1000

    def timed_draft(target, cache, slots, anchors, block_length):
        t0 = time.perf_counter()
        out = draft(target, cache, slots, anchors, block_length)
        rows.append((len(slots), block_length, int(call["pending"]), call["flush"],
                     (time.perf_counter() - t0) * 1000, float(cost._table_draft_ms(len(slots), block_length))))
        return out

    backend.flush_context, backend.drafter.draft = timed_flush, timed_draft
    Runs(cell.ids, concurrency).rate(engine, "adaflash")
    print(f"{domain} c={concurrency}: sequences, block, positions caught up, catch-up ms, forward ms, table ms")
    for row in rows:
        print(" ", row[:3], *(f"{v:.2f}" for v in row[3:]))
    print(f"{len(rows)} draft calls; forward / table median {statistics.median(r[4] / r[5] for r in rows):.2f}; "
          f"catch-up share of the call median {statistics.median(r[3] / (r[3] + r[4]) for r in rows):.2f}; "
          f"whole call / table median {statistics.median((r[3] + r[4]) / r[5] for r in rows):.2f}; "
          f"live draft scale after the run {cost.draft_scale:.2f}")


if __name__ == "__main__":
    main()
