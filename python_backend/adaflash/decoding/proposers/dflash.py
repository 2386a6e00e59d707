"""The DFlash drafter proposer: one drafter forward for every drafting sequence of a step, each block then cut to
what its mode verifies (`Length`): all of it (`dflash`), the published rule on the length head's accepted fraction
(`adaflash-published`, the published-head variant), or the cost-aware choice with the draft's own cost already paid
(`adaflash`). The modes share one forward, so the variants are length rules of one proposer, not proposers apart.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from adaflash.decoding.backend import BackendError
from adaflash.decoding.plan import DraftRequest, Load, Plan
from adaflash.decoding.policy import LengthController
from adaflash.decoding.proposers import StepContext, register
from adaflash_contract.modes import Length

if TYPE_CHECKING:
    from adaflash.models.drafter import Draft


@register("dflash")
class DFlashProposer:
    def __init__(self, controller: LengthController) -> None:
        self.controller = controller

    async def propose(self, requests: list[DraftRequest], plan: Plan, step: StepContext) -> dict[Hashable, list[int]]:
        """When the drafter fails, these sequences verify nothing this step and never draft again."""
        seqs = [step.running[r.key] for r in requests]
        try:
            timed = await step.backend.draft(seqs, plan.block_length)
        except BackendError:
            for seq in seqs:
                seq.can_draft = False
                seq.pending_context.clear()
            return {}
        step.clock.add(timed.ms)
        cost = self.controller.cost
        if cost is not None and step.clock.alone():
            cost.observe_draft(len(seqs), plan.block_length, timed.ms)
        ks = self.cut(requests, timed.value, plan.load_besides_drafts())
        tokens = timed.value.tokens.tolist()
        return {r.key: tokens[i][:k] for i, (r, k) in enumerate(zip(requests, ks))}

    def cut(self, requests: list[DraftRequest], draft: Draft, besides: Load) -> list[int]:
        """k per drafted sequence: its cap (modes verifying all), the published rule, or the cost-aware choice
        with the draft's own cost already paid. `besides`: the load of the sequences that did not draft."""
        c = self.controller
        ratios = draft.accept_ratio
        modes = [r.mode for r in requests]
        ks = [r.cap for r in requests]
        for i, (r, m) in enumerate(zip(requests, modes)):
            if m.length is Length.PUBLISHED:
                ks[i] = c.published(r.rates, None if ratios is None else float(ratios[i]), r.cap)
        adaptive = [i for i, m in enumerate(modes) if m.length is Length.COST_AWARE]
        if adaptive:
            fixed = [i for i in range(len(requests)) if i not in set(adaptive)]
            load = besides + Load(len(fixed), sum(ks[i] + 1 for i in fixed), float(len(fixed)),
                                  widest=max((ks[i] + 1 for i in fixed), default=1))
            rates = c.draft_rates(draft, adaptive, np.stack([requests[i].rates for i in adaptive]))
            chosen = c.draft_lens(rates, [requests[i].cap for i in adaptive], len(adaptive) + load.sequences,
                                  load.tokens, len(requests), load.expected, load.widest)
            for i, k in zip(adaptive, chosen):
                ks[i] = k
        return ks
