"""Round 32: what handing each sequence its rows of a step's captured features costs right after the forward (as
`steps._judged` does, when torch's code has left the CPU's caches): a view per sequence (the committed code), one
`split` into views (of one row each, or of the rows' sizes), or a (tensor, start, stop) triple per sequence; medians
in microseconds over interleaved steps of n sequences.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round32/feature_views.py broad:qa 8

Its output in this round (ad hoc, before the capture wrote one tensor; the views do not depend on how it is written):
8 sequences: views 32.2, split 42.3, split by sizes 41.6, triples 11.4; 64 sequences (chat): views 91.0, split 105.1,
split by sizes 94.7, triples 41.7.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from capture_step import prefilled  # noqa: E402


def main() -> None:
    domain, n = sys.argv[1], int(sys.argv[2])
    engine, slots, anchors = prefilled(domain, n)
    target, cache, capture = engine.target, engine.cache, engine.backend.capture
    feeds = [[a] for a in anchors]
    ways = {"views": lambda h: [h[i : i + 1] for i in range(n)], "split": lambda h: h.split(1),
            "split by sizes": lambda h: h.split([1] * n), "triples": lambda h: [(h, i, i + 1) for i in range(n)]}
    times: dict[str, list[float]] = {way: [] for way in ways}
    for _ in range(1500):
        for way, hand_out in ways.items():
            out = target.forward(cache, slots, feeds, capture_layers=capture)
            t0 = time.perf_counter()
            hand_out(out.hidden)
            times[way].append(time.perf_counter() - t0)
            for slot in slots:
                cache.truncate(slot, cache.lengths[slot] - 1)
    medians = ", ".join(f"{way} {statistics.median(ts) * 1e6:.1f}" for way, ts in times.items())
    print(f"{domain} {n} sequences: {medians}")


if __name__ == "__main__":
    main()
