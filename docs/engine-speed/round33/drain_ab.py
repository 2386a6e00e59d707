"""Round 33: the gate credited by how much nearer a draining batch's end a call brought (`drain`), against the gate
told every token committed (`tokens`, round 32), each gate kept from run to run as a server keeps it, each over `ar`
of the same round, in the order ar, tokens, drain, reversed every other round; outputs equal.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round33/drain_ab.py math 64 6

It runs at commit 2f31d96, where `Scheduler._credited` exists; the change was not kept (drain-ab.txt).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from ab import compare, unpatched  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402


def patch(side: str, engine: Engine):
    """The `tokens` side is told every token committed."""
    if side == "tokens":
        engine.scheduler._credited = lambda active, tokens, horizon: tokens
    return unpatched(engine, "_credited")


if __name__ == "__main__":
    compare(("tokens", "drain"), patch)
