"""Round 35: whether the copy lengths the cost-aware policy picks are where the plan arm falls short of what
`replay.py` says copies allow. Both sides have the long lookup of `long_match_ab.py` and are held to the plan arm;
`long` picks copy lengths as the policy does, `rule` verifies a copy whole where its lookup matched at least
RULE_BUCKET's tokens (8) and nothing otherwise, the replay's `matched>=8` (its other planning unchanged). Each side with
copy estimates of its own, each over `ar` of the same round, in the order ar, long, rule, reversed every other round;
outputs equal.

Runs at commit 6922405: round 36 built the long lookup into the planner (`planner.COPY_MATCH`), which this patches in.

    PYTHONPATH=python_backend:build:clients:tests .venv/bin/python docs/engine-speed/round35/rule_ab.py chat 32 6
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import long_match_ab  # noqa: E402
from ab import compare  # noqa: E402  (on the path through `long_match_ab`)

from adaflash.decoding.engine import Engine  # noqa: E402

RULE_BUCKET = 5  # `long_match_ab.bucket`: matches of 8 tokens and more


def rule_side(side: str, engine: Engine) -> Callable[[], None]:
    """`long_match_ab.long_side` for both; on the rule side, copy lengths by the match alone."""
    undo_long = long_match_ab.long_side(side, engine)
    controller = engine.scheduler.planner.controller

    def copy_lengths(seqs, matched, proposal_lens, batch, other_tokens, other_expected=None, other_width=1):
        ks = [n if m >= RULE_BUCKET else 0 for m, n in zip(matched, proposal_lens)]
        return ks, [1.0 + k for k in ks]  # (expected tokens: a copy taken whole is taken as accepted)

    if side == "rule":
        controller.copy_lengths = copy_lengths

    def undo() -> None:
        controller.__dict__.pop("copy_lengths", None)
        undo_long()

    return undo


if __name__ == "__main__":
    long_match_ab.LONG_SIDES.add("rule")
    long_match_ab.HELD = True
    compare(("long", "rule"), rule_side)
