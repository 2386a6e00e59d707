"""Proposers: where the tokens a step verifies come from, one kind a module.

The copy proposer (`copy.py`) needs no model, so the planner looks its proposal up while it plans. A drafter
proposer runs a model: after planning, the step loop hands each the plan's `DraftRequest`s of its kind
(`Mode.drafter`) and verifies what it returns. A new drafter kind is its own module, registered here under the name
its modes give in `Mode.drafter`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from adaflash.decoding.backend import Backend, StepClock
from adaflash.decoding.plan import DraftRequest, Plan
from adaflash.decoding.policy import LengthController
from adaflash.decoding.sequence import Sequence


@dataclass
class StepContext:
    """What a proposer may use of the step under way: the models, the running sequences by key, the step's clock."""

    backend: Backend
    running: dict[Hashable, Sequence]
    clock: StepClock


class Proposer(Protocol):
    async def propose(self, requests: list[DraftRequest], plan: Plan, step: StepContext) -> dict[Hashable, list[int]]:
        """The tokens each request's sequence verifies (cut to its mode's length). A proposer that fails answers
        nothing for its sequences and stops them drafting: their output does not change."""


PROPOSERS: dict[str, Callable[[LengthController], Proposer]] = {}


def register(kind: str) -> Callable[[type], type]:
    """Register a drafter proposer class under `kind`, built with the step's length controller."""
    def add(cls: type) -> type:
        PROPOSERS[kind] = cls
        return cls
    return add


def proposers_for(controller: LengthController) -> dict[str, Proposer]:
    """One proposer of every registered kind, sharing `controller`."""
    return {kind: make(controller) for kind, make in PROPOSERS.items()}


from adaflash.decoding.proposers import dflash  # noqa: E402,F401  (registers itself)
