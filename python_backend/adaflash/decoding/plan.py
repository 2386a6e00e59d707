"""What one speculative step decides, as plain data (the planner's inputs and outputs, the proposers' requests).

The planner reads a `Candidate` per sequence and answers a `Plan`; the drafter proposers take the plan's
`DraftRequest`s; `Load` is what the sequences sharing a verify forward cost the ones being decided.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from adaflash.decoding.policy import PolicyState
from adaflash_contract.modes import Mode


@dataclass(frozen=True)
class Load:
    """Sequences in the same verify forward besides the ones being decided: how many, the tokens they feed,
    the tokens they are expected to commit, how many of them draft, and their longest feed (what a padded verify
    costs, `CostModel.padded`)."""

    sequences: int = 0
    tokens: int = 0
    expected: float = 0.0
    drafting: int = 0
    widest: int = 1

    def __add__(self, other: Load) -> Load:
        return Load(self.sequences + other.sequences, self.tokens + other.tokens, self.expected + other.expected,
                    self.drafting + other.drafting, max(self.widest, other.widest))

    @classmethod
    def peers(cls, n: int) -> Load:
        """n sequences known only by their number (a served request's company): one token each, one expected,
        each may draft."""
        return cls(n, n, float(n), n)


@dataclass
class Candidate:
    """What the planner reads of one sequence."""

    key: Hashable
    mode: Mode
    tokens: list[int]  # the context, ending with the anchor
    cap: int  # see `sequence.draft_cap`
    policy: PolicyState
    can_draft: bool = True  # False when no drafter serves the sequence (none loaded, or it failed)


@dataclass
class DraftRequest:
    """A sequence the drafter drafts this step, and what cutting its block needs."""

    key: Hashable
    mode: Mode
    cap: int  # the cap, lowered to block_length - 1
    block_length: int  # positions the plan drafts, anchor included
    rates: np.ndarray  # [block_size - 1] running per-position acceptance estimates


@dataclass
class Plan:
    """What a step verifies: each sequence's proposal decided while planning (a copy, or nothing), and the drafts
    the drafter proposers are asked for, with the block length their forward runs."""

    proposals: dict[Hashable, list[int]] = field(default_factory=dict)  # what each undrafted sequence verifies
    copied: dict[Hashable, int] = field(default_factory=dict)  # proposals copied from the context: n-gram matched
    expected: dict[Hashable, float] = field(default_factory=dict)  # tokens each copy is expected to commit
    drafts: list[DraftRequest] = field(default_factory=list)
    block_length: int = 0

    def drafts_by_proposer(self) -> dict[str, list[DraftRequest]]:
        """The drafts each drafter proposer makes (`Mode.drafter`), in plan order."""
        out: dict[str, list[DraftRequest]] = {}
        for d in self.drafts:
            out.setdefault(d.mode.drafter, []).append(d)
        return out

    def load_besides_drafts(self) -> Load:
        """The load of the sequences that do not draft, once their proposals are known."""
        drafting = {d.key for d in self.drafts}
        keys = [k for k in self.proposals if k not in drafting]
        return Load(len(keys), sum(len(self.proposals[k]) + 1 for k in keys),
                    sum(self.expected.get(k, 1.0) for k in keys),
                    widest=max((len(self.proposals[k]) + 1 for k in keys), default=1))
