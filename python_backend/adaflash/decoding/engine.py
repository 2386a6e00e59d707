"""Continuous-batching speculative decoding engine: admit, step, retire.

Every step runs at most one drafter forward and one target forward for all active
sequences, whatever their modes; the planner decides what each verifies. Invariant per
running sequence: the target KV cache holds `len(tokens) - 1` positions, and so do the
drafter context and the features queued for it; the last token (the anchor) is fed by the
next step, together with the draft tokens that step verifies. Features reach the drafter
lazily, right before a sequence drafts, so steps where the policy decides not to draft cost
no drafter work. The engine owns its caches; the models only read and write the ones passed.
"""

from __future__ import annotations

import time
from collections import deque
from itertools import count

import torch

from adaflash.decoding.costs import CostModel, measure_costs
from adaflash.decoding.modes import get_mode
from adaflash.decoding.planner import Candidate, Plan, Planner
from adaflash.decoding.policy import LengthController
from adaflash.decoding.sequence import Request, Sequence, StepRecord, draft_cap, validate_request
from adaflash.decoding.steps import StepResult, prefill_batch, verify_batch
from adaflash.models.drafter import DFlashDrafter, block_size_of
from adaflash.models.target import Transformer


class Engine:
    """Runs many requests at once over one target (and optionally one drafter)."""

    def __init__(
        self,
        target: Transformer,
        drafter: DFlashDrafter | None = None,
        *,
        num_slots: int = 8,
        max_len: int = 2048,
        cost_model: CostModel | None = None,
        prefill_tokens: int = 4096,
        prior_weight: float = 4.0,
        probe_every: int = 8,
        copies: bool = True,
    ) -> None:
        """`copies=False` keeps adaflash to its drafter (no copies of the context), to measure what each gives."""
        self.target, self.drafter = target, drafter
        self.block_size = block_size_of(drafter)
        self.max_len = max_len
        self.prefill_tokens = prefill_tokens
        self.capture = drafter.config.target_layer_ids if drafter else None
        if drafter is not None:
            drafter.check_target(target)
        if cost_model is None and drafter is not None:
            cost_model = measure_costs(target, drafter, num_slots, max_len=max_len)
        self.cache = target.new_cache(num_slots, max_len)
        self.context = drafter.new_cache(num_slots, max_len) if drafter is not None else None
        self.cost = cost_model
        self.planner = Planner(LengthController(cost_model, self.block_size, prior_weight, probe_every), copies)
        self.num_slots = num_slots
        self.max_active = num_slots
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}
        self._ids = count()

    # ---- admission -------------------------------------------------------------------------
    def submit(self, request: Request) -> Sequence:
        """Queue a request; raises ValueError naming the offending field."""
        validate_request(request, self.target.config.vocab_size, self.max_len, self.block_size,
                         has_drafter=self.drafter is not None)
        stops = self.target.config.eos_token_ids if request.stop_ids is None else request.stop_ids
        seq = Sequence(
            id=next(self._ids), request=request, tokens=list(request.prompt_ids),
            generator=torch.Generator().manual_seed(request.sampling.seed), stop_ids=frozenset(stops),
            policy=self.planner.controller.new_sequence(), submitted_at=time.perf_counter(),
        )
        self.waiting.append(seq)
        return seq

    def cancel(self, seq: Sequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
        seq.finish_reason = seq.finish_reason or "cancelled"
        self._retire([seq])

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> list[Sequence]:
        batch: list[Sequence] = []
        budget = self.prefill_tokens
        while self.waiting and self.free_slots and len(self.running) < self.max_active:
            seq = self.waiting[0]
            if batch and len(seq.tokens) > budget:
                break
            self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            self.running[seq.slot] = seq
            budget -= len(seq.tokens)
            batch.append(seq)
        if batch:
            results = prefill_batch(self.target, self.cache, [s.slot for s in batch], [s.tokens for s in batch],
                                    [s.request.sampling for s in batch], [s.generator for s in batch], self.capture)
            for seq, res in zip(batch, results):
                self._queue_context(seq, res)
                seq.commit(res.committed)
        return batch

    # ---- one decode step --------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Admit what fits, then one draft + verify round for every running sequence.

        Returns the sequences that produced tokens in this call (newly admitted ones included).
        """
        touched = {s.id: s for s in self._admit()}
        active = [s for s in self.running.values() if not s.finished]
        if active:
            drafts, copied = self._plan(active)
            self._verify(active, drafts, copied)
            touched.update((s.id, s) for s in active)
        self._retire([s for s in self.running.values() if s.finished])
        return list(touched.values())

    def _cap(self, seq: Sequence) -> int:
        return draft_cap(seq.request, len(seq.output), len(seq.tokens), self.block_size, self.max_len)

    def _plan(self, active: list[Sequence]) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Draft tokens to verify per sequence id, and for drafts copied from the context the n-gram
        length their lookup matched."""
        plan = self.planner.plan([Candidate(s.id, get_mode(s.request.mode), s.tokens, self._cap(s), s.policy)
                                  for s in active])
        drafts = dict(plan.proposals)
        if plan.drafts:
            drafts.update(self._draft(plan, {s.id: s for s in active}))
        return drafts, plan.copied

    def _draft(self, plan: Plan, by_id: dict[int, Sequence]) -> dict[int, list[int]]:
        """One drafter forward for the plan's drafting sequences, each draft cut to its mode's length."""
        seqs = [by_id[r.key] for r in plan.drafts]
        self.flush_context(seqs)
        t0 = time.perf_counter()
        draft = self.drafter.draft(self.target, self.context, [s.slot for s in seqs], [s.tokens[-1] for s in seqs],
                                   plan.block_length)
        if self.cost is not None:
            self.cost.observe_draft(len(seqs), plan.block_length, (time.perf_counter() - t0) * 1000)
        ks = self.planner.cut(plan.drafts, draft, plan.load_besides_drafts())
        tokens = draft.tokens.tolist()
        return {r.key: tokens[i][:k] for i, (r, k) in enumerate(zip(plan.drafts, ks))}

    def _verify(self, active: list[Sequence], drafts: dict[int, list[int]], copied: dict[int, int]) -> None:
        feeds = [[s.tokens[-1]] + drafts[s.id] for s in active]
        t0 = time.perf_counter()
        results = verify_batch(self.target, self.cache, [s.slot for s in active], feeds,
                               [s.request.sampling for s in active], [s.generator for s in active], self.capture)
        if self.cost is not None:
            self.cost.observe_verify(len(active), sum(map(len, feeds)), (time.perf_counter() - t0) * 1000)
        for seq, feed, res in zip(active, feeds, results):
            self._queue_context(seq, res)
            self.planner.controller.observe(seq.policy, len(feed) - 1, res.accepted, matched=copied.get(seq.id, 0))
            seq.steps.append(StepRecord(len(feed) - 1, res.accepted, seq.commit(res.committed), res.expected_accepted,
                                        copied=seq.id in copied))

    def _queue_context(self, seq: Sequence, res: StepResult) -> None:
        """Keep the target features of newly committed positions for the drafter (drafting modes only)."""
        if res.features is not None and get_mode(seq.request.mode).drafter:
            seq.pending_context.append(res.features)

    def flush_context(self, seqs: list[Sequence]) -> None:
        """Project queued features into the drafter's context cache, all sequences in one call."""
        todo = [s for s in seqs if s.pending_context]
        if not todo:
            return
        parts = [torch.cat(s.pending_context) for s in todo]
        self.drafter.append_context(self.context, [s.slot for s in todo], torch.cat(parts), [p.shape[0] for p in parts])
        for s in todo:
            s.pending_context.clear()

    def _retire(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq.slot >= 0 and self.running.get(seq.slot) is seq:
                del self.running[seq.slot]
                self.cache.truncate(seq.slot, 0)
                if self.context is not None:
                    self.context.truncate(seq.slot, 0)
                self.free_slots.append(seq.slot)
            seq.slot = -1
            seq.finished_at = seq.finished_at or time.perf_counter()
            seq.pending_context.clear()

    # ---- convenience ------------------------------------------------------------------------
    def generate(self, requests: list[Request], concurrency: int | None = None) -> list[Sequence]:
        """Run requests to completion with at most `concurrency` in flight; results in request order."""
        self.max_active = min(concurrency or self.num_slots, self.num_slots)
        try:
            seqs = [self.submit(r) for r in requests]
            while self.has_work:
                self.step()
        finally:
            self.max_active = self.num_slots
        return seqs
