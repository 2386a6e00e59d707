"""Round 38: `half_octave_ab.py` in lockstep (`lockstep.py`): ar, the gate as it is, a second gate as it is (a null
side: what two identical sides differ by), and the gate whose loads from 16 sequences are half octaves.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/halves_lockstep.py math 64 30
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from half_octave_ab import half_octaves  # noqa: E402
from lockstep import Side, compare  # noqa: E402


def halves(engine) -> None:
    engine.scheduler.gate.choose = half_octaves(engine.scheduler.gate)


if __name__ == "__main__":
    compare({"ar": Side("ar"), "gate": Side("adaflash"), "gate2": Side("adaflash"), "halves": Side("adaflash", halves)})
