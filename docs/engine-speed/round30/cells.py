"""Round 30's records share this: a domain's prompts as round 27's `cell.load_cell` gives them, or with a `broad:`
prefix the broad mix's held-out prompts of that domain (bench_gate's 400-token cut, 96 new tokens); and a gate held
to one arm."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "round27"))
from cell import MAX_TOKENS, Cell, load_cell  # noqa: E402

from adaflash.decoding.gate import Arm, PlanGate, Tally  # noqa: E402
from adaflash.decoding.sequence import context_length  # noqa: E402
from adaflash.evaluation.prompts import encode_prompts, load_prompts  # noqa: E402
from adaflash.models.bundle import load_bundle  # noqa: E402
from adaflash.models.drafter import block_size_of  # noqa: E402

BROAD_MIX = Path("python_backend/adaflash/data/broad_mix.jsonl")


def load(domain: str) -> Cell:
    if not domain.startswith("broad:"):
        return load_cell(domain)
    bundle = load_bundle(Path("models/default"))
    prompts = [p for p in load_prompts(BROAD_MIX, None, "holdout") if p.domain == domain.removeprefix("broad:")]
    ids = encode_prompts(bundle.tokenizer, prompts, 400, None)
    return Cell(bundle, ids, context_length([len(i) for i in ids], MAX_TOKENS, block_size_of(bundle.drafter)))


class Always(PlanGate):
    """Every call on one arm; the calls a gate would observe are tallied."""

    def __init__(self, arm: Arm) -> None:
        super().__init__()
        self.arm, self.seen = arm, Tally()

    def choose(self, sequences: int) -> Arm:
        return self.arm

    def observe(self, arm: Arm, tokens: int, ms: float, plain_rate: float = 1.0) -> None:
        if ms > 0:
            self.seen.add(tokens, ms)
