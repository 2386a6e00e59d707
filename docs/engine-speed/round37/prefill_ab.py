"""Round 37: what a prefill of a cell's first CONCURRENCY prompts costs adaflash over `ar` (one new token each, so the
call is the prefill), with each prompt's captured features kept as a view of the forward's (`view`, the engine now)
or copied (`clone`, before); sides in the order ar, view, clone, reversed every other round; medians of the rounds.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round37/prefill_ab.py math 64 16
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cells import load  # noqa: E402
from turns import in_turn  # noqa: E402

from adaflash.decoding import steps  # noqa: E402
from adaflash.decoding.sequence import Request  # noqa: E402

first_tokens = steps._first_tokens


def cloned(*args, **kwargs):
    """`_first_tokens` with each prompt's features copied, as before this round."""
    results = first_tokens(*args, **kwargs)
    for res in results:
        if res.features is not None:
            res.features = res.features.clone()
    return results


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    cell = load(domain)
    engine = cell.engine()
    ids = cell.ids[:concurrency]
    ms: dict[str, list[float]] = {"ar": [], "view": [], "clone": []}
    for r in range(rounds):
        for side in in_turn(list(ms), r):
            steps._first_tokens = cloned if side == "clone" else first_tokens
            t0 = time.perf_counter()
            engine.generate([Request(i, 1, mode="ar" if side == "ar" else "adaflash") for i in ids],
                            concurrency=concurrency)
            ms[side].append((time.perf_counter() - t0) * 1000)
        steps._first_tokens = first_tokens
    print(f"{domain}: prefill of {len(ids)} prompts ({sum(map(len, ids))} tokens), {rounds} rounds, median ms:",
          {side: round(statistics.median(v), 1) for side, v in ms.items()},
          "over ar:", {side: round(statistics.median(a / b for a, b in zip(v, ms["ar"])), 4) for side, v in ms.items()
                       if side != "ar"})


if __name__ == "__main__":
    main()
