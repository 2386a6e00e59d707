"""Round 40: the views of a verify's features made in one `split` (`steps._with_features`, from `views-split.diff`,
applied for the run and not kept) against a slice per sequence (as before), adaflash held to plain decoding, against
`ar`. Round 38's method (`../round38/lockstep.py`, `../round38/plain_overhead.py`): sides stepped in lockstep, one
plain decoding step a call, each step's least time over the rounds, summed. Sides:
  ar, ar2   `ar` twice: what two identical sides differ by;
  plain     adaflash held plain, as built: features captured and kept as views made by one split;
  slices    the same with a slice per sequence, as before this round.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round40/views.py math 64 8
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "round38"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import load  # noqa: E402
from least_times import report  # noqa: E402
from lockstep import Lockstep, Side  # noqa: E402
from plain_overhead import held, one_step, step_times  # noqa: E402

from adaflash.decoding import steps  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402

_with_features = steps._with_features


def sliced(results, hidden, spans):
    """`steps._with_features` as a slice per sequence, as `_judged` and `_first_tokens` made them before."""
    if hidden is not None:
        for res, span in zip(results, spans):
            if span is not None:
                res.features = hidden[span[0] : span[1]]
    return results


def slicing(engine: Engine) -> None:
    held(engine)
    step = engine.step

    def step_slicing():
        steps._with_features = sliced
        try:
            return step()
        finally:
            steps._with_features = _with_features

    engine.step = step_slicing


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sides = {"ar": Side("ar", one_step), "ar2": Side("ar", one_step), "plain": Side("adaflash", held),
             "slices": Side("adaflash", slicing)}
    lock = Lockstep(load(domain), sides, concurrency)
    runs = [step_times(lock) for _ in range(rounds)]
    report(domain, concurrency, runs, list(sides))


if __name__ == "__main__":
    main()
