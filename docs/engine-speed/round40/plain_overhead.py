"""Round 40: adaflash held to plain decoding against `ar`, step by step, with plain decoding runs capturing no
features (`engine._skip_capture`). Runs against commit 47e88bf (the lazy capture, reverted after:
`lazy-capture.diff`). Round 38's method (`../round38/plain_overhead.py`, `../round38/lockstep.py`): sides
stepped in lockstep, one plain decoding step a call, each step's least time over the rounds, summed. Sides:
  ar, ar2    `ar` twice: what two identical sides differ by;
  plain      adaflash held plain, as built: its runs capture nothing;
  captured   the same with every run capturing for the drafter and keeping the features, as before this round.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round40/plain_overhead.py math 64 8
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

from adaflash.decoding import engine as engine_module  # noqa: E402
from adaflash.decoding.engine import Engine  # noqa: E402

_skip_capture = engine_module._skip_capture


def capturing(engine: Engine) -> None:
    """Held plain, its runs capturing as every step did before this round."""
    held(engine)
    step = engine.step

    def every_run_captures():
        engine_module._skip_capture = lambda seqs: None
        try:
            return step()
        finally:
            engine_module._skip_capture = _skip_capture

    engine.step = every_run_captures


def main() -> None:
    domain, concurrency, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sides = {"ar": Side("ar", one_step), "ar2": Side("ar", one_step), "plain": Side("adaflash", held),
             "captured": Side("adaflash", capturing)}
    lock = Lockstep(load(domain), sides, concurrency)
    runs = [step_times(lock) for _ in range(rounds)]
    report(domain, concurrency, runs, list(sides))


if __name__ == "__main__":
    main()
