"""Round 38: what the drafter's capture costs plain decoding under load. Adaflash held to plain decoding on every call
(`held`: features captured and kept for the drafter, as a gated run's plain calls keep them) against the same without
a capture (`nocap`: no sequence can draft, so no forward captures and no features are kept), each over `ar` of the
same round, in turn; outputs equal. The gap is the most that cheaper feature bookkeeping can win on plain calls.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round38/capture_ab.py chat 32 8
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round33"))
from ab import compare  # noqa: E402

from adaflash.decoding.engine import Engine  # noqa: E402
from adaflash.decoding.gate import Arm  # noqa: E402


def held(side: str, engine: Engine) -> Callable[[], None]:
    """Every gated call goes to plain decoding, unobserved; on `nocap` the backend captures nothing."""
    gate, backend = engine.scheduler.gate, engine.scheduler.backend
    capture = backend.capture

    def plain(sequences: int) -> Arm:
        gate._load = None
        return Arm.PLAIN

    gate.choose = plain
    if side == "nocap":
        backend.capture = None

    def undo() -> None:
        gate.__dict__.pop("choose", None)
        backend.capture = capture

    return undo


if __name__ == "__main__":
    compare(("held", "nocap"), held)
