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

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.sampling import SamplingParams  # noqa: E402
from adaflash.decoding.steps import step_batch  # noqa: E402


def prefilled(domain: str, n: int) -> tuple[Engine, list[int], list[int]]:
    """An engine whose first n slots hold the cell's first n prompts but their last token, the slots, and those last
    tokens (each step's anchors)."""
    cell = load(domain)
    engine = cell.engine()
    slots = list(range(n))
    for slot, ids in zip(slots, cell.ids[:n]):
        engine.target.forward(engine.cache, [slot], [ids[:-1]])
    return engine, slots, [ids[-1] for ids in cell.ids[:n]]


def compare(domain: str, steps: int, n: int) -> None:
    """`steps` interleaved steps of each side at n sequences; medians, and each over `ar`'s."""
    engine, slots, anchors = prefilled(domain, n)
    target, cache, capture = engine.target, engine.cache, engine.backend.capture
    sampling, generators = [SamplingParams()] * n, [None] * n
    pending: list[list] = [[] for _ in slots]

    def step(side: str) -> float:
        t0 = time.perf_counter()
        results, _ = step_batch(target, cache, 0, slots, [[a] for a in anchors], sampling, generators,
                                None if side == "ar" else capture, runs=[1] * n)
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
        print(f"{domain} {n} sequences {side}: median {statistics.median(ts) * 1e6:.0f} us, "
              f"over ar {statistics.median(ts) / statistics.median(times['ar']):.4f}", flush=True)


def main() -> None:
    compare(sys.argv[1], int(sys.argv[2]), 64)


if __name__ == "__main__":
    main()
