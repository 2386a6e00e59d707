"""Continuous-batching speculative decoding in one process: the scheduler's step loop over local models.

Every step runs at most one drafter forward and one target forward for all active sequences,
whatever their modes (`scheduler.py`). `LocalBackend` owns the caches and gives each running
sequence a slot in them; the models only read and write the caches passed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable
from itertools import count

import torch

from adaflash.decoding.backend import Timed, run_now
from adaflash.decoding.costs import CostModel, measure_costs
from adaflash.decoding.limits import Limits
from adaflash.decoding.scheduler import Scheduler
from adaflash.decoding.sequence import Request, Sequence
from adaflash.decoding.speculation import build_speculation
from adaflash.decoding.steps import StepResult, StopEarly, ms_since, step_batch
from adaflash.models.cache import KVCache, Paging
from adaflash.models.drafter import DFlashDrafter, Draft, block_size_of
from adaflash.models.host import keep_freed_memory
from adaflash.models.placement import place_of
from adaflash.models.target import Transformer
from adaflash_contract.modes import modes_served


class LocalBackend:
    """The target and the drafter in this process, their caches, and a cache slot per running sequence."""

    def __init__(self, target: Transformer, drafter: DFlashDrafter | None, num_slots: int, max_len: int,
                 paging: Paging | None = None) -> None:
        self.target, self.drafter = target, drafter
        self.place = place_of(target)
        self.capture = drafter.config.target_layer_ids if drafter else None
        self.cache = target.new_cache(num_slots, max_len, paging)
        self.context = drafter.new_cache(num_slots, max_len, paging) if drafter is not None else None
        self.free_slots = list(range(num_slots - 1, -1, -1))

    async def forward(self, prefill: list[Sequence], verify: list[Sequence], feeds: list[list[int]],
                      runs: list[int] | None = None, stop_early: StopEarly | None = None
                      ) -> Timed[tuple[list[StepResult], list[StepResult]]]:
        for seq in prefill:
            seq.slot = self.free_slots.pop()
        seqs = [*prefill, *verify]
        results, ms = step_batch(self.target, self.cache, len(prefill), [s.slot for s in seqs],
                                 [s.tokens for s in prefill] + feeds, [s.sampling for s in seqs],
                                 [s.generator for s in seqs], self.capture, [s.can_draft for s in seqs],
                                 [s.history for s in seqs], runs, stop_early)
        return Timed((results[:len(prefill)], results[len(prefill):]), ms)

    async def draft(self, seqs: list[Sequence], block_length: int) -> Timed[Draft]:
        """Timed with the context the sequences committed since their last draft, which only a draft needs, as
        the served drafter model times its calls."""
        t0 = time.perf_counter()
        self.flush_context(seqs)
        draft = self.drafter.draft(self.target, self.context, [s.slot for s in seqs], [s.tokens[-1] for s in seqs],
                                   block_length)
        self.place.synchronize()
        return Timed(draft, ms_since(t0))

    def flush_context(self, seqs: list[Sequence]) -> None:
        """Project queued features into the drafter's context cache, all sequences in one call."""
        todo = [s for s in seqs if s.pending_context]
        if not todo:
            return
        parts = [torch.cat(s.pending_context) for s in todo]
        self.drafter.append_context(self.context, [s.slot for s in todo], torch.cat(parts), [p.shape[0] for p in parts])
        for s in todo:
            s.pending_context.clear()

    async def release(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq.slot < 0:
                continue
            self.cache.truncate(seq.slot, 0)
            if self.context is not None:
                self.context.truncate(seq.slot, 0)
            self.free_slots.append(seq.slot)
            seq.slot = -1

    async def idle(self) -> None:
        """Nothing to do: `release` freed every slot at once."""


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
        paging: Paging | None = None,
        run_steps: int | None = None,
        plan_gate: bool = True,
    ) -> None:
        """`copies=False` keeps adaflash to its drafter (no copies of the context), to measure what each gives.
        `paging`: caches of shared pages (a memory budget) instead of a max_len slot per sequence; sequences then
        wait until the pages they may fill are free. `run_steps`: plain decoding steps per target call (None:
        the scheduler's live choice). `plan_gate=False` makes adaflash plan every step (`gate.PlanGate`)."""
        self.target, self.drafter = target, drafter
        self.max_len, self.num_slots = max_len, num_slots
        keep_freed_memory()
        if drafter is not None:
            drafter.check_target(target)
        if cost_model is None and drafter is not None:
            cost_model = measure_costs(target, drafter, num_slots, max_len=max_len)
        self.backend = LocalBackend(target, drafter, num_slots, max_len, paging)
        self.limits = Limits(target.config.vocab_size, max_len, block_size_of(drafter), modes_served(drafter is not None),
                             paging)
        self.speculation = build_speculation(cost_model, block_size_of(drafter), max_len, drafter is not None,
                                             served=False, copies=copies, plan_gate=plan_gate,
                                             prior_weight=prior_weight, probe_every=probe_every, run_steps=run_steps)
        self.scheduler = Scheduler(self.backend, self.speculation, self.limits, num_slots, prefill_tokens)
        self._ids = count()

    @property
    def cost(self) -> CostModel | None:
        return self.speculation.cost

    @property
    def block_size(self) -> int:
        return self.speculation.block_size

    @property
    def cache(self) -> KVCache:
        return self.backend.cache

    @property
    def context(self) -> KVCache | None:
        return self.backend.context

    @property
    def free_slots(self) -> list[int]:
        return self.backend.free_slots

    @property
    def running(self) -> dict[Hashable, Sequence]:
        return self.scheduler.running

    @property
    def waiting(self) -> deque[Sequence]:
        return self.scheduler.waiting

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def submit(self, request: Request) -> Sequence:
        """Queue a request; raises RequestError naming the offending field (`limits.Limits.check`)."""
        self.limits.check(request)
        stops = self.target.config.eos_token_ids if request.stop_ids is None else request.stop_ids
        seq = Sequence(id=next(self._ids), request=request, tokens=list(request.prompt_ids),
                       generator=torch.Generator().manual_seed(request.sampling.seed), stop_ids=frozenset(stops),
                       submitted_at=time.perf_counter())
        self.scheduler.add(seq)
        return seq

    def cancel(self, seq: Sequence) -> None:
        run_now(self.scheduler.cancel([seq]))

    def step(self) -> list[Sequence]:
        """One draft + verify round for every running sequence, prefilling the newly admitted ones in the same
        target call.

        Returns the sequences that produced tokens in this call (newly admitted ones included).
        """
        return run_now(self.scheduler.step())

    def flush_context(self, seqs: list[Sequence]) -> None:
        self.backend.flush_context(seqs)

    def generate(self, requests: list[Request], concurrency: int | None = None) -> list[Sequence]:
        """Run requests to completion with at most `concurrency` in flight; results in request order."""
        self.scheduler.max_active = min(concurrency or self.num_slots, self.num_slots)
        try:
            seqs = [self.submit(r) for r in requests]
            while self.has_work:
                self.step()
        finally:
            self.scheduler.max_active = self.num_slots
        return seqs
