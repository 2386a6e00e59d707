"""Round 38: `arms_ab.py` in lockstep (`lockstep.py`): ar, the gate, adaflash held plain, adaflash held to planning.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/arms_lockstep.py chat 32 10
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "round30"))
from cells import Always  # noqa: E402
from lockstep import Side, compare  # noqa: E402

from adaflash.decoding.gate import Arm  # noqa: E402


def held(arm: Arm):
    def setup(engine):
        engine.scheduler.gate = Always(arm)
    return setup


if __name__ == "__main__":
    compare({"ar": Side("ar"), "gate": Side("adaflash"), "plain": Side("adaflash", held(Arm.PLAIN)),
             "plan": Side("adaflash", held(Arm.PLAN))})
