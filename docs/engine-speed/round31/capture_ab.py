"""Round 31: where adaflash's plain arm loses to `ar` under load. Every call on the plain arm; variants: `kept` (the
committed code), `unsliced` (the forward captures the drafter's layers but no sequence takes its rows), `uncaptured`
(sequences may draft but no forward captures), each over `ar` of the same round, alternating order, outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round31/capture_ab.py chat 64 4
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import Always, load  # noqa: E402
from turns import Runs  # noqa: E402

from adaflash.decoding import steps  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402

ORIGINAL_JUDGED, ORIGINAL_LAYERS = steps._judged, steps._layers


def unsliced_judged(logits, hidden, cache, slots, starts, feeds, sampling, generators, wants, histories):
    return ORIGINAL_JUDGED(logits, None, cache, slots, starts, feeds, sampling, generators, wants, histories)


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    capture = engine.backend.capture
    over: dict[str, list[float]] = {"kept": [], "unsliced": [], "uncaptured": []}
    runs = Runs(cell.ids, concurrency)
    for r in range(rounds):
        rates = {}
        for side in ["ar", *(list(over) if r % 2 == 0 else list(over)[::-1])]:
            engine.scheduler.gate = Always(Arm.PLAIN)
            engine.backend.capture = None if side == "uncaptured" else capture
            steps._judged = unsliced_judged if side == "unsliced" else ORIGINAL_JUDGED
            rates[side] = runs.rate(engine, "ar" if side == "ar" else "adaflash")
        for side in over:
            over[side].append(rates[side] / rates["ar"])
        print(r, {k: round(v[-1], 3) for k, v in over.items()}, flush=True)
    for side, ratios in over.items():
        print(f"{domain} c={concurrency} {side} / ar median {statistics.median(ratios):.3f}", flush=True)


if __name__ == "__main__":
    main()
