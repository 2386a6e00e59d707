"""The plan of a speculative step, for the engine and the served loop alike.

A step has two decisions. Before drafting (`Planner.plan`): for every sequence, what it verifies without a
drafter (nothing, or a copy of its context's continuation: the copy proposer's lookup) or whether it drafts, and
the block length the drafter runs. After drafting, the drafter proposer cuts each block
(`proposers.dflash.DFlashProposer.cut`). Both read a sequence's `Mode` fields, never its name, and both count the
load of the sequences sharing the verify forward that they do not decide (`plan.Load`).
"""

from __future__ import annotations

from collections.abc import Hashable

from adaflash.decoding.plan import Candidate, DraftRequest, Load, Plan
from adaflash.decoding.policy import LengthController
from adaflash.decoding.proposers.copy import COPY_MATCH, lookup
from adaflash_contract.modes import Length


class Planner:
    """Plans steps with one LengthController (the running acceptance estimates and the cost model).

    `copies=False` keeps cost-aware modes to their drafter, to measure what copies give.
    """

    def __init__(self, controller: LengthController, copies: bool = True) -> None:
        self.controller = controller
        self.copies = copies

    @property
    def block_size(self) -> int:
        return self.controller.block_size

    def plan(self, seqs: list[Candidate], outside: Load = Load()) -> Plan:
        if len(seqs) == 1 and seqs[0].mode.drafter and seqs[0].mode.length is Length.COST_AWARE and seqs[0].cap > 0:
            return self._plan_one(seqs[0], outside)
        plan = Plan(block_length=self.block_size)
        for s in seqs:
            if not s.mode.drafter:
                self._propose_copy(plan, s)
        proposing = [s for s in seqs if s.mode.drafter and s.cap > 0]
        caps = {s.key: s.cap for s in proposing}
        adaptive = [s for s in proposing if s.mode.length is Length.COST_AWARE]
        length = self._plan_adaptive(plan, seqs, adaptive, caps, outside) if adaptive else self.block_size
        drafting = [s for s in proposing if s.can_draft and s.key not in plan.proposals]
        if adaptive and all(s.mode.length is Length.COST_AWARE for s in drafting):
            plan.block_length = length  # the other modes draft full blocks
            caps.update((s.key, min(caps[s.key], length - 1)) for s in drafting)
        for s in seqs:
            plan.proposals.setdefault(s.key, [])
        rates = self.controller.estimated_rates([s.policy for s in drafting]) if drafting else []
        plan.drafts = [DraftRequest(s.key, s.mode, caps[s.key], plan.block_length, r)
                       for s, r in zip(drafting, rates)]
        return plan

    def _plan_one(self, s: Candidate, outside: Load) -> Plan:
        """`plan` of one cost-aware sequence, the same decisions in fewer steps: at concurrency 1 every step plans so,
        right after its forward, when each of the general path's lists and sets costs more than it does warm
        (docs/history.md, engine speed round 29)."""
        c, key = self.controller, s.key
        plan = Plan(block_length=self.block_size)
        proposal, matched = lookup(s.tokens, s.cap, COPY_MATCH) if self.copies and s.mode.copies else ([], 0)
        if proposal and c.prefers_copy([s.policy], [matched], [len(proposal)], [s.cap])[0] or not s.can_draft:
            self._copy_one(plan, s, proposal, matched, outside)
            return plan
        chosen, length = c.choose_drafters([s.policy], [s.cap], 1 + outside.sequences, outside.tokens,
                                           1 + outside.drafting, outside.expected, outside.widest)
        plan.block_length = length
        if chosen[0]:
            plan.proposals[key] = []
            rates = c.estimated_rates([s.policy])
            plan.drafts = [DraftRequest(key, s.mode, min(s.cap, length - 1), length, rates[0])]
        else:
            self._copy_one(plan, s, proposal, matched, outside)
        return plan

    def _copy_one(self, plan: Plan, s: Candidate, proposal: list[int], matched: int, outside: Load) -> None:
        """`_copy` of one sequence planned alone (`_plan_one`)."""
        if not proposal:
            plan.proposals[s.key] = []
            return
        ks, expected = self.controller.copy_lengths([s.policy], [matched], [len(proposal)], 1 + outside.sequences,
                                                    outside.tokens, outside.expected, outside.widest)
        plan.proposals[s.key] = proposal[: ks[0]]
        plan.expected[s.key] = expected[0]
        if ks[0]:
            plan.copied[s.key] = matched

    @staticmethod
    def _propose_copy(plan: Plan, s: Candidate) -> None:
        """A mode without a drafter verifies its copy whole (prompt lookup), or nothing. Its copies are marked as
        copies, so that what they teach goes to the copy estimates, not to the drafter's."""
        proposal, matched = lookup(s.tokens, s.cap) if s.mode.copies else ([], 0)
        plan.proposals[s.key] = proposal
        if proposal:
            plan.copied[s.key] = matched

    def _plan_adaptive(self, plan: Plan, seqs: list[Candidate], adaptive: list[Candidate], caps: dict[Hashable, int],
                       outside: Load) -> int:
        """Decide the cost-aware sequences that do not draft this step (their proposals go into `plan`): those
        whose copy of the context is expected to do as well as the drafter verify it; the others draft if that
        pays and otherwise verify their copy as far as that pays. Returns the block length to draft."""
        c = self.controller
        proposals = {s.key: lookup(s.tokens, caps[s.key], COPY_MATCH)
                     if self.copies and s.mode.copies else ([], 0) for s in adaptive}
        prefer = c.prefers_copy([s.policy for s in adaptive], [proposals[s.key][1] for s in adaptive],
                                [len(proposals[s.key][0]) for s in adaptive], [caps[s.key] for s in adaptive])
        self._copy(plan, seqs, [s for s, p in zip(adaptive, prefer) if p], proposals, caps, outside)
        rest = [s for s in adaptive if s.key not in plan.proposals]
        self._copy(plan, seqs, [s for s in rest if not s.can_draft], proposals, caps, outside)
        rest = [s for s in rest if s.can_draft]
        if not rest:
            return self.block_size
        ids = {s.key for s in rest}
        load = self._load(seqs, ids, caps, plan) + outside
        n_drafting = len(rest) + outside.drafting + sum(
            s.key in caps and s.can_draft and s.key not in plan.proposals and s.key not in ids for s in seqs)
        chosen, length = c.choose_drafters([s.policy for s in rest], [caps[s.key] for s in rest],
                                           len(rest) + load.sequences, load.tokens, n_drafting, load.expected,
                                           load.widest)
        self._copy(plan, seqs, [s for s, chose in zip(rest, chosen) if not chose], proposals, caps, outside)
        return length

    def _copy(self, plan: Plan, seqs: list[Candidate], chosen: list[Candidate],
              proposals: dict[Hashable, tuple[list[int], int]], caps: dict[Hashable, int], outside: Load) -> None:
        """`chosen` verify their copy proposal as far as that pays (nothing to draft); those without one verify
        nothing, and are the others' load."""
        for s in chosen:
            if not proposals[s.key][0]:
                plan.proposals[s.key] = []
        chosen = [s for s in chosen if proposals[s.key][0]]
        if not chosen:
            return
        load = self._load(seqs, {s.key for s in chosen}, caps, plan) + outside
        ks, expected = self.controller.copy_lengths(
            [s.policy for s in chosen], [proposals[s.key][1] for s in chosen],
            [len(proposals[s.key][0]) for s in chosen], len(chosen) + load.sequences, load.tokens, load.expected,
            load.widest)
        for s, k, e in zip(chosen, ks, expected):
            plan.proposals[s.key] = proposals[s.key][0][:k]
            plan.expected[s.key] = e
            if k:
                plan.copied[s.key] = proposals[s.key][1]

    @staticmethod
    def _load(seqs: list[Candidate], ids: set[Hashable], caps: dict[Hashable, int], plan: Plan) -> Load:
        """The load of the sequences outside `ids` while planning: known proposals, full caps for the drafting
        modes that are not cost-aware, one token for cost-aware sequences still undecided; each expected to
        commit its copy's estimate, or one (a floor)."""
        def tokens(s: Candidate) -> int:
            if s.key in plan.proposals:
                return len(plan.proposals[s.key]) + 1
            return 1 + (caps.get(s.key, 0) if s.mode.length is not Length.COST_AWARE else 0)
        others = [s for s in seqs if s.key not in ids]
        fed = [tokens(s) for s in others]
        return Load(len(others), sum(fed), sum(plan.expected.get(s.key, 1.0) for s in others), widest=max(fed, default=1))
