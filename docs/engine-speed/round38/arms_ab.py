"""Round 38: a cell's gate against adaflash held to one arm on every call, each over `ar` of the same round, in turn;
outputs equal. `gate`: the gate as it is, kept from run to run; `plain`: every call plain decoding (features kept for
the drafter, as a gated run's plain calls keep them); `plan`: every call planned.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/arms_ab.py chat 32 20
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from ab import compare  # noqa: E402
from cells import Always  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402

HELD = {"plain": Arm.PLAIN, "plan": Arm.PLAN}


def held(side: str, engine: Engine) -> Callable[[], None]:
    """On `plain` and `plan` the scheduler's gate is one that always chooses that arm."""
    scheduler = engine.scheduler
    gate = scheduler.gate
    if side in HELD:
        scheduler.gate = Always(HELD[side])

    def undo() -> None:
        scheduler.gate = gate

    return undo


if __name__ == "__main__":
    compare(("gate", "plain", "plan"), held)
