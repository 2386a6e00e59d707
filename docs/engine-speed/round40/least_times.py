"""Round 40's lockstep records share round 38's report of sides stepped in lockstep (`../round38/plain_overhead.py`,
`report`): each step's least time over the rounds, summed and set against `ar`'s, the long steps (the first
admissions' prefills) apart from the others."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round38"))
from plain_overhead import report  # noqa: E402, F401
