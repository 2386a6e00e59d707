"""Round 31: the drafter's feature capture timed alone on the target: a 64-sequence one-token forward without and with
the drafter's layers captured (300 of each, interleaved), and a prefill of 13 chat prompts (807 tokens) without and with
them, the capture's rows sliced out per prompt as `steps._first_tokens` does (20 of each); medians in ms. What a
recompute of the features would cost instead is a prefill's: ~0.11 ms a token here.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/capture_alone.py

Its output in this round (run alone): step none 12.78 ms, captured 12.86; prefill of 807 tokens none 91.1 ms,
captured 93.1.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402


def main() -> None:
    cell = load("chat")
    engine = cell.engine()
    target, cache, capture = engine.target, engine.cache, engine.backend.capture
    slots = list(range(64))
    for slot, ids in zip(slots, cell.ids[:64]):
        target.forward(cache, [slot], [ids])

    def step(layers: list[int] | None) -> None:
        target.forward(cache, slots, [[5]] * 64, capture_layers=layers)
        for slot in slots:
            cache.truncate(slot, cache.lengths[slot] - 1)

    for _ in range(20):
        step(None)
        step(capture)
    times: dict[str, list[float]] = {"none": [], "captured": []}
    for r in range(300):
        for side in list(times) if r % 2 else list(times)[::-1]:
            t0 = time.perf_counter()
            step(None if side == "none" else capture)
            times[side].append(time.perf_counter() - t0)
    print("step", {side: round(statistics.median(ts) * 1e3, 2) for side, ts in times.items()})
    for slot in slots:
        cache.truncate(slot, 0)
    prompts = cell.ids[:13]

    def prefill(layers: list[int] | None) -> None:
        out = target.forward(cache, slots[:13], prompts, capture_layers=layers)
        if out.hidden is not None:
            end = 0
            for prompt in prompts:
                end += len(prompt)
                out.hidden[end - len(prompt) : end].clone()
        for slot in slots[:13]:
            cache.truncate(slot, 0)

    times = {"none": [], "captured": []}
    for r in range(20):
        for side in list(times) if r % 2 else list(times)[::-1]:
            t0 = time.perf_counter()
            prefill(None if side == "none" else capture)
            times[side].append(time.perf_counter() - t0)
    print(f"prefill of {sum(map(len, prompts))} tokens",
          {side: round(statistics.median(ts) * 1e3, 1) for side, ts in times.items()})


if __name__ == "__main__":
    main()
