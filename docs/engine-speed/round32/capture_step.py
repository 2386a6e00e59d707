"""Round 32: what capturing the drafter's features costs one plain decoding step of n sequences on the engine's path
(`steps.step_batch`, a run of one step): none captured (`ar`), captured and kept per sequence as the scheduler keeps
them (`kept`), captured and dropped (`dropped`); many steps each, interleaved, medians. Round 31's `capture_step.py`
at any number of sequences.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python \
        docs/engine-speed/round32/capture_step.py broad:qa 1500 8
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round31"))
from capture_step import compare  # noqa: E402

if __name__ == "__main__":
    compare(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
