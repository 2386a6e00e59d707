"""Continuous batching as one step loop: admit, plan, propose, verify, commit, retire.

Transport-free: the models sit behind a `backend.Backend`. The engine's backend holds them in this process; the
Triton orchestrator's calls the `target` and `drafter` models once per step for every running sequence. Both run
this loop, so the planner sees every running sequence in both and the served output equals the engine's. What to do
in a call is the `SpeculationPolicy`'s to say (`speculation.py`); this loop only carries it out.

Invariant per running sequence: the target's cache and the drafter's context hold `len(tokens) - 1` positions once
the features queued in `pending_context` are appended; the last token (the anchor) is fed by the next step with the
draft it verifies. Features reach the drafter lazily, with the sequence's next draft, so steps that do not draft
cost no drafter work.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable

from adaflash.decoding.backend import Backend, BackendError, StepClock
from adaflash.decoding.limits import Limits
from adaflash.decoding.plan import Plan
from adaflash.decoding.proposers import StepContext
from adaflash.decoding.sequence import Sequence, StepRecord
from adaflash.decoding.speculation import SpeculationPolicy
from adaflash.decoding.steps import StepResult, StopEarly


class Scheduler:
    """Waiting and running sequences, and the step that advances all of them by one target call."""

    def __init__(self, backend: Backend, policy: SpeculationPolicy, limits: Limits, max_active: int,
                 prefill_tokens: int = 4096) -> None:
        """A sequence is admitted only when the pages it can fill (prompt and max_tokens) are free
        (`limits.paging`; None: a slot per sequence)."""
        self.backend, self.policy, self.limits = backend, policy, limits
        self.max_active, self.prefill_tokens = max_active, prefill_tokens
        self.reserved = 0  # pages the running sequences may fill
        self.waiting: deque[Sequence] = deque()
        self.running: dict[Hashable, Sequence] = {}
        self.clock = StepClock()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a sequence (its request checked by `limits.check`); it is admitted when a step has room."""
        self.policy.admit(seq)
        self.waiting.append(seq)

    async def step(self) -> list[Sequence]:
        """One call for every running sequence: admit what fits of the waiting ones (prefilled in the same target
        call; they verify from the next step on), ask the policy what the call does, carry it out (a run of plain
        decoding steps, or each sequence's proposal verified), let the policy learn from it, retire the finished.

        Returns the sequences that changed (admitted, advanced, finished or failed)."""
        self.clock.start()
        active = [s for s in self.running.values() if not s.finished]
        admitted = self._admit()
        call = self.policy.plan_call(active, admitted, len(self.waiting))
        runs = None
        if call.runs is not None:
            runs = await self._decode_run(active, call.runs)
        elif active or admitted:
            feeds, plan = [], call.plan or Plan()
            if active:
                feeds = await self._propose(active, plan)
            await self._verify(admitted, active, feeds, plan)
        # A prefill's time is not the step's own, nor a graph's first recording (tens of times a replay's).
        if active and not admitted and self.clock.alone():
            self.policy.observe_call(call, active, self.clock.call_ms(), self.clock.forwards_ms, runs)
        await self._retire([s for s in self.running.values() if s.finished])
        self.clock.stop()
        return [*admitted, *active]

    async def _propose(self, active: list[Sequence], plan: Plan) -> list[list[int]]:
        """Each sequence's feed, [anchor] + its proposal: the plan's own (a copy, or nothing), or what its drafter
        proposer drafted."""
        proposals = dict(plan.proposals)
        step = StepContext(self.backend, self.running, self.clock)
        for kind, requests in plan.drafts_by_proposer().items():
            proposals.update(await self.policy.proposers[kind].propose(requests, plan, step))
        return [[s.tokens[-1]] + proposals[s.id] for s in active]

    async def _verify(self, admitted: list[Sequence], active: list[Sequence], feeds: list[list[int]],
                      plan: Plan) -> None:
        """One target call: prefill the admitted, verify the feeds, commit what each accepted."""
        try:
            timed = await self.backend.forward(admitted, active, feeds)
        except BackendError as exc:
            _fail([*admitted, *active], exc)
            return
        prefilled, verified = timed.value
        self.clock.add(timed.ms)
        for seq, res in zip(admitted, prefilled):
            self._queue_context(seq, res)
            seq.commit(res.committed, res.log_probs)
        if active and not admitted and self.clock.alone():  # (a prefill is not the verify's)
            self.policy.observe_verify(feeds, timed.ms)
        for seq, feed, res in zip(active, feeds, verified):
            self._queue_context(seq, res)
            self.policy.observe_verified(seq, len(feed) - 1, res.accepted, plan.copied.get(seq.id, 0))
            seq.steps.append(StepRecord(len(feed) - 1, res.accepted, seq.commit(res.committed, res.log_probs),
                                        res.expected_accepted, copied=seq.id in plan.copied))

    async def _decode_run(self, active: list[Sequence], runs: list[int]) -> list[int]:
        """One target call of plain decoding; each step's token is committed as a step of its own (the target
        computed the steps of a run past a sequence's stop, and they are dropped with it).

        A sequence queued during the run, with room to admit it, ends the run after the current step where the
        target runs in this process (`_arrived`): otherwise it would wait for the whole run to start. Returns the
        steps each sequence ran."""
        try:
            timed = await self.backend.forward([], active, [[s.tokens[-1]] for s in active], runs,
                                               self._arrived(len(self.waiting)))
        except BackendError as exc:
            _fail(active, exc)
            return runs
        self.clock.add(timed.ms)
        runs = [len(res.committed) for res in timed.value[1]]
        if self.clock.alone():
            self.policy.observe_run(len(active), runs, timed.ms)
        for seq, res in zip(active, timed.value[1]):
            self._queue_context(seq, res)
            for i, token in enumerate(res.committed):
                if seq.finished:
                    break
                seq.steps.append(StepRecord(0, 0, seq.commit([token], None if res.log_probs is None else
                                                             res.log_probs[i : i + 1])))
        return runs

    def _arrived(self, queued: int) -> StopEarly:
        """Whether a sequence joined the `queued` waiting ones and a slot is free for it: asked from the thread
        that runs the target, between steps (meanwhile the loop's thread only adds to `waiting`)."""
        return lambda: len(self.waiting) > queued and len(self.running) < self.max_active

    def _admit(self) -> list[Sequence]:
        batch: list[Sequence] = []
        budget = self.prefill_tokens
        pages = self.limits.paging.pages if self.limits.paging is not None else None
        while self.waiting and len(self.running) < self.max_active:
            seq = self.waiting[0]
            if batch and len(seq.tokens) > budget:
                break
            need = self.limits.pages_for(seq.request)
            if pages is not None and self.reserved + need > pages:
                break
            self.waiting.popleft()
            self.running[seq.id] = seq
            seq.admitted_at = time.perf_counter()
            self.reserved += need
            budget -= len(seq.tokens)
            batch.append(seq)
        return batch

    async def cancel(self, seqs: list[Sequence]) -> None:
        """End sequences now, waiting or running; what the models keep of them is freed at once."""
        for seq in seqs:
            if seq in self.waiting:
                self.waiting.remove(seq)
            seq.finish_reason = seq.finish_reason or "cancelled"
            seq.finished_at = seq.finished_at or time.perf_counter()
        await self._retire([s for s in seqs if self.running.get(s.id) is s])

    async def fail_all(self, message: str) -> list[Sequence]:
        """End every waiting and running sequence with `message` and release them: what a server does when a
        step itself failed (a defect), so that no request is left waiting. Returns them."""
        seqs = [*self.waiting, *self.running.values()]
        self.waiting.clear()
        _fail(seqs, BackendError(message))
        await self._retire([s for s in seqs if s.id in self.running])
        return seqs

    @staticmethod
    def _queue_context(seq: Sequence, res: StepResult) -> None:
        """Keep the target features of newly committed positions for the drafter (drafting sequences only)."""
        if res.features is not None and seq.can_draft:
            seq.pending_context.append(res.features)

    async def _retire(self, seqs: list[Sequence]) -> None:
        if not seqs:
            return
        for seq in seqs:
            del self.running[seq.id]
            self.reserved -= self.limits.pages_for(seq.request)
            seq.finished_at = seq.finished_at or time.perf_counter()
            seq.pending_context.clear()
        await self.backend.release(seqs)
        if not self.has_work:
            await self.backend.idle()


def _fail(seqs: list[Sequence], exc: BackendError) -> None:
    for seq in seqs:
        seq.finish_reason, seq.error = "error", str(exc)

