"""Round 31: what keeping the drafter's features costs one 64-sequence plain decoding step on the engine's path
(`steps.step_batch`, a run of one step): none captured (`ar`), captured and kept per sequence as the scheduler keeps
them (`kept`, the committed code), captured and dropped (`dropped`); many steps each, interleaved, medians. A variant
kept as rows of the step's tensor instead of a view per sequence ran within 0.2% of `kept` (the round's notes) and was
not committed.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/capture_step.py chat 400
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402

from adaflash.decoding.sampling import SamplingParams  # noqa: E402
from adaflash.decoding.steps import step_batch  # noqa: E402


def main() -> None:
    domain, steps = sys.argv[1], int(sys.argv[2])
    cell = load(domain)
    engine = cell.engine()
    target, cache, capture = engine.target, engine.cache, engine.backend.capture
    slots = list(range(64))
    for slot, ids in zip(slots, cell.ids[:64]):
        target.forward(cache, [slot], [ids[:-1]])
    anchors = [ids[-1] for ids in cell.ids[:64]]
    sampling, generators = [SamplingParams()] * 64, [None] * 64
    pending: list[list] = [[] for _ in slots]

    def step(side: str) -> float:
        t0 = time.perf_counter()
        results, _ = step_batch(target, cache, 0, slots, [[a] for a in anchors], sampling, generators,
                                None if side == "ar" else capture, runs=[1] * 64)
        if side == "kept":
            for kept, res in zip(pending, results):
                kept.append(res.features)
        ms = time.perf_counter() - t0
        for slot in slots:
            cache.truncate(slot, cache.lengths[slot] - 1)
        return ms

    times: dict[str, list[float]] = {"ar": [], "kept": [], "dropped": []}
    for r in range(steps):
        for side in list(times) if r % 2 else list(times)[::-1]:
            times[side].append(step(side))
    for side, ts in times.items():
        print(f"{domain} 64 sequences {side}: median {statistics.median(ts) * 1e6:.0f} us, "
              f"over ar {statistics.median(ts) / statistics.median(times['ar']):.4f}", flush=True)


if __name__ == "__main__":
    main()
