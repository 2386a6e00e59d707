"""Round 34: the greedy token of each row of logits from torch's max (`layers.argmax`, `after`) against torch's argmax
(`before`, patched back into the step and the drafter), in one engine taking turns, reversed every other round, one
mode on one cell; outputs equal. First the two alone on logits of this target's vocabulary.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round34/argmax_ab.py math 64 ar 8
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from cell import load_cell  # noqa: E402
from turns import Runs, in_turn  # noqa: E402

from adaflash.decoding import steps  # noqa: E402
from adaflash.models import drafter, layers  # noqa: E402

ROWS = (1, 64, 240, 1024)  # one sequence's step, 64 sequences' plain step, 16 blocks of 15 drafts, 64 such blocks
CALLS = 300


def alone(vocab: int) -> None:
    for rows in ROWS:
        logits = torch.randn(rows, vocab)
        us = {}
        for name, f in (("argmax", lambda x: x.argmax(-1)), ("max", layers.argmax)):
            for _ in range(20):
                f(logits)
            t0 = time.perf_counter()
            for _ in range(CALLS):
                f(logits)
            us[name] = (time.perf_counter() - t0) / CALLS * 1e6
        print(f"{rows:5d} rows x {vocab}: argmax {us['argmax']:7.1f} us, max {us['max']:7.1f} us", flush=True)


def main() -> None:
    domain, concurrency, mode, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    cell = load_cell(domain)
    alone(cell.bundle.target.config.vocab_size)
    engine = cell.engine()
    runs = Runs(cell.ids, concurrency if concurrency > 1 else 1)
    if concurrency == 1:
        runs.ids = cell.ids[:16]
    sides = {"before": lambda x: x.argmax(-1), "after": layers.argmax}
    over = []
    for r in range(rounds):
        rates = {}
        for side in in_turn(list(sides), r):
            steps.argmax = drafter.argmax = sides[side]
            rates[side] = runs.rate(engine, mode)
        over.append(rates["after"] / rates["before"])
        print(r, round(over[-1], 3), {k: round(v) for k, v in rates.items()}, flush=True)
    steps.argmax = drafter.argmax = layers.argmax
    print(f"{domain} c={concurrency} {mode}: after / before median {statistics.median(over):.3f}")


if __name__ == "__main__":
    main()
