"""Continuous batching as one step loop: admit, plan, draft, verify, commit, retire.

Transport-free: the models sit behind a `Backend`. The engine's backend holds them in this
process; the Triton orchestrator's calls the `target` and `drafter` models once per step for
every running sequence. Both run this loop, so the planner sees every running sequence in
both and the served output equals the engine's. The backend's methods are coroutines because
the orchestrator's calls are remote; the engine's never suspend, so it drives a step with
`run_now`, without an event loop.

Invariant per running sequence: the target's cache and the drafter's context hold
`len(tokens) - 1` positions once the features queued in `pending_context` are appended; the
last token (the anchor) is fed by the next step with the draft it verifies. Features reach the
drafter lazily, with the sequence's next draft, so steps that do not draft cost no drafter work.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Coroutine, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from adaflash.decoding.costs import CostModel
from adaflash.decoding.gate import DRAIN_MARGINAL_SHARE, Arm, PlanGate
from adaflash.decoding.modes import REFERENCE_MODE, Length, Mode, get_mode
from adaflash.decoding.planner import Candidate, Plan, Planner
from adaflash.decoding.sequence import Request, Sequence, StepRecord, draft_cap
from adaflash.decoding.steps import StepResult, StopEarly
from adaflash.models import graphs
from adaflash.models.cache import Paging

if TYPE_CHECKING:
    from adaflash.models.drafter import Draft

T = TypeVar("T")

# Plain decoding steps one call may carry (`Scheduler._run_length`): as many as keep the call's fixed cost (its time
# outside the forwards since the previous step: on a server, the round trip to a target model and the responses
# and checks between steps) within RUN_OVERHEAD_SHARE of the call, at most MAX_RUN_STEPS and MAX_RUN_MS of
# forwards, so that a request arriving meanwhile, a cancellation and a stream's next response wait at most that long.
RUN_OVERHEAD_SHARE = 0.1
MAX_RUN_STEPS = 8
MAX_RUN_MS = 50.0
EMA = 0.2  # weight of the newest call in the running estimates of a call's fixed cost and a step's forward


@dataclass
class Timed(Generic[T]):
    value: T
    ms: float  # the forward's time where it ran (no transport): what the cost model learns from


class BackendError(RuntimeError):
    """A model behind the backend failed or did not answer. A failed target call ends its sequences with
    this message; a failed draft only stops its sequences drafting (their output does not change)."""


class Backend(Protocol):
    async def forward(self, prefill: list[Sequence], verify: list[Sequence], feeds: list[list[int]],
                      runs: list[int] | None = None, stop_early: StopEarly | None = None
                      ) -> Timed[tuple[list[StepResult], list[StepResult]]]:
        """One target call: prefill the new sequences (a cache slot each) and verify the others, feeds[i] =
        [anchor] + the draft tokens verify[i] verifies. The time is the verify forward's. `runs` (no new
        sequences, feeds [anchor]): plain decoding of runs[i] steps for verify[i] (`steps.decode_run`), fewer
        where the target can ask `stop_early` between them and it says so."""

    async def draft(self, seqs: list[Sequence], block_length: int) -> Timed[Draft]:
        """Draft a block after each anchor; appends (and clears) each sequence's `pending_context` first."""

    async def release(self, seqs: list[Sequence]) -> None:
        """Free what the models keep of finished sequences (at once, or with the models' next call)."""

    async def idle(self) -> None:
        """No sequence is left: whatever `release` still owes is freed now."""


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the engine's backend) to its end, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the coroutine suspended: it needs an event loop")


class Scheduler:
    """Waiting and running sequences, and the step that advances all of them by one target call."""

    def __init__(self, backend: Backend, planner: Planner, cost: CostModel | None, max_active: int, max_len: int,
                 has_drafter: bool, prefill_tokens: int = 4096, paging: Paging | None = None,
                 run_steps: int | None = None, gate: PlanGate | None = None) -> None:
        """`paging`: the paged caches' size (None: unpaged, a slot per sequence);
        a sequence is admitted only when the pages it can fill (prompt and max_tokens) are free.
        `run_steps`: plain decoding steps per call when every running sequence decodes plainly (None: chosen
        live, `_run_length`). `gate`: whether cost-aware sequences plan or decode plainly, call by call (None:
        they plan every step)."""
        self.backend, self.planner, self.cost = backend, planner, cost
        self.max_active, self.max_len, self.has_drafter = max_active, max_len, has_drafter
        self.prefill_tokens = prefill_tokens
        self.kv_pages = None if paging is None else paging.pages
        self.page = 1 if paging is None else paging.page
        self.reserved = 0
        self.waiting: deque[Sequence] = deque()
        self.running: dict[Hashable, Sequence] = {}
        self._forwards_ms = 0.0  # the current step's model forwards, as their backend timed them
        self.run_steps = run_steps
        self.gate = gate
        self._mark: float | None = None  # when the last step ended
        self._recorded = graphs.recordings()  # at the start of the current step (`_timed_alone`)
        self.call_overhead_ms: float | None = None  # of a plain decoding call: its time outside the forwards
        self.decode_step_ms: float | None = None  # of a plain decoding call: its forwards' time per step

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def pages_for(self, request: Request) -> int:
        """Pages a sequence may fill: its prompt and every token it may produce (drafts stay within them)."""
        return -(-min(self.max_len, len(request.prompt_ids) + request.max_tokens) // self.page)

    def check_capacity(self, request: Request) -> None:
        """ValueError naming max_tokens when the request could never be admitted: it needs more positions than
        the whole paged cache holds."""
        if self.kv_pages is not None and self.pages_for(request) > self.kv_pages:
            raise ValueError(f"max_tokens: the prompt and {request.max_tokens} new tokens need "
                             f"{self.pages_for(request) * self.page} cache positions, the cache holds "
                             f"{self.kv_pages * self.page}")

    def add(self, seq: Sequence) -> None:
        """Queue a sequence (its request already validated); it is admitted when a step has room."""
        seq.can_draft = self.has_drafter and get_mode(seq.request.mode).drafter
        seq.policy = self.planner.controller.new_sequence()
        self.waiting.append(seq)

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

    async def step(self) -> list[Sequence]:
        """One draft + verify round for every running sequence, with what fits of the waiting ones admitted
        and prefilled in the same target call (they verify from the next step on), or a run of plain decoding
        steps where every running sequence decodes plainly (`_runs`); retire the finished.

        Returns the sequences that changed (admitted, advanced, finished or failed)."""
        started, self._forwards_ms, self._recorded = time.perf_counter(), 0.0, graphs.recordings()
        active = [s for s in self.running.values() if not s.finished]
        admitted = self._admit()
        sequences = len(active) + len(admitted)  # the gate's load (`_gate_decides`)
        gated = self._gate_decides(active)
        drains = gated and self._drains(sequences)
        arm = None if not gated else Arm.PLAIN if drains else self.gate.choose(sequences)
        committed = 0 if arm is None else sum(len(s.output) for s in active)  # what the gate is told the call added
        runs = self._runs(active, arm) if active and not admitted else None
        if runs is not None:
            runs = await self._decode_run(active, runs)
        else:
            feeds, copied = await self._propose(active, arm) if active else ([], {})
            if admitted or active:
                await self._forward(admitted, active, feeds, copied)
        # A prefill's time is not the step's own, nor a graph's first recording (tens of times a replay's).
        if active and not admitted and self._timed_alone():
            # From the previous step's end: what the caller does between steps (a server's responses and checks) is
            # paid per call too, so plain decoding's runs and the gate weigh it.
            ms = (time.perf_counter() - (self._mark or started)) * 1000
            self._observe_overhead(ms - self._forwards_ms, runs)
            if arm is not None and not drains:
                tokens = sum(len(s.output) for s in active) - committed
                self.gate.observe(arm, tokens, ms, self._plain_rate(len(active)))
        await self._retire([s for s in self.running.values() if s.finished])
        self._mark = time.perf_counter()
        return [*admitted, *active]

    def _timed_alone(self) -> bool:
        """Whether this step's times are its own so far: no graph was recorded in it (a first recording takes tens
        of times a replay's), so the cost model, the gate and the overhead estimates may learn from them."""
        return graphs.recordings() == self._recorded

    def _plain_rate(self, sequences: int) -> float:
        """What plain decoding commits a ms at `sequences` by the cost table, the gate's yardstick (1 without one)."""
        return self.cost.plain_rate(sequences) if self.cost is not None and self.cost.verify else 1.0

    def _gate_decides(self, active: list[Sequence]) -> bool:
        """Whether the gate sets the arm of this call's cost-aware sequences: there is a gate and such a sequence runs.
        Its load is the call's sequences, those it admits included: counted without them, each admission to a full
        batch (one sequence ended, another joins) read as a load of its own, whose arm the call took and whose change
        of load dropped the block under way."""
        return self.gate is not None and any(_gated(get_mode(s.request.mode)) for s in active)

    def _drains(self, sequences: int) -> bool:
        """Whether the call's cost-aware sequences decode plainly because the batch only drains (no request waits)
        where a verified token costs most of what a plain step costs a sequence (`gate.DRAIN_MARGINAL_SHARE`)."""
        return (self.cost is not None and not self.waiting
                and self.cost.marginal_share(sequences) >= DRAIN_MARGINAL_SHARE)

    def _runs(self, active: list[Sequence], arm: Arm | None) -> list[int] | None:
        """Each sequence's plain decoding steps in this call, when every one decodes plainly (None otherwise):
        `_run_length`, cut to what its max_tokens and the context leave."""
        if any(_proposes(get_mode(s.request.mode), arm) for s in active):
            return None
        n = self._run_length()
        return [min(n, s.request.max_tokens - len(s.output), self.max_len - len(s.tokens) + 1) for s in active]

    def _run_length(self) -> int:
        """Steps per call such that the call's fixed cost stays within RUN_OVERHEAD_SHARE of it, from the last
        calls' estimates: a server's round trips are worth several steps at low load, the engine's few."""
        if self.run_steps is not None:
            return self.run_steps
        if self.call_overhead_ms is None or not self.decode_step_ms:
            return 1
        n = math.ceil(self.call_overhead_ms * (1 - RUN_OVERHEAD_SHARE) / (RUN_OVERHEAD_SHARE * self.decode_step_ms))
        return max(1, min(n, MAX_RUN_STEPS, int(MAX_RUN_MS // self.decode_step_ms)))

    def _observe_overhead(self, ms: float, runs: list[int] | None) -> None:
        """A step's time outside its forwards: the cost model's per-step overhead after a planned step, the
        estimate behind `_run_length` after a plain decoding call."""
        if runs is None:
            if self.cost is not None:
                self.cost.observe_step(ms)
            return
        self.call_overhead_ms = _ema(self.call_overhead_ms, ms)
        self.decode_step_ms = _ema(self.decode_step_ms, self._forwards_ms / max(runs))

    async def _decode_run(self, active: list[Sequence], runs: list[int]) -> list[int]:
        """One target call of plain decoding; each step's token is committed as a step of its own (the target
        computed the steps of a run past a sequence's stop, and they are dropped with it). The cost model learns
        from a run whose steps all carried every sequence, as from so many one-token verifies.

        A sequence queued during the run, with room to admit it, ends the run after the current step where the
        target runs in this process (`_arrived`): otherwise it would wait for the whole run to start. Returns the
        steps each sequence ran."""
        try:
            timed = await self.backend.forward([], active, [[s.tokens[-1]] for s in active], runs,
                                               self._arrived(len(self.waiting)))
        except BackendError as exc:
            _fail(active, exc)
            return runs
        self._forwards_ms += timed.ms
        runs = [len(res.committed) for res in timed.value[1]]
        if self.cost is not None and min(runs) == max(runs) and self._timed_alone():  # every step a one-token verify
            self.cost.observe_verify(len(active), len(active), timed.ms / runs[0])
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
        while self.waiting and len(self.running) < self.max_active:
            seq = self.waiting[0]
            if batch and len(seq.tokens) > budget:
                break
            pages = self.pages_for(seq.request)
            if self.kv_pages is not None and self.reserved + pages > self.kv_pages:
                break
            self.waiting.popleft()
            self.running[seq.id] = seq
            seq.admitted_at = time.perf_counter()
            self.reserved += pages
            budget -= len(seq.tokens)
            batch.append(seq)
        return batch

    def _cap(self, seq: Sequence) -> int:
        return draft_cap(seq.request, len(seq.output), len(seq.tokens), self.planner.block_size, self.max_len)

    async def _propose(self, active: list[Sequence], arm: Arm | None) -> tuple[list[list[int]], dict[Hashable, int]]:
        """Each sequence's feed ([anchor] + draft), and for drafts copied from the context the n-gram length
        their lookup matched. Off the gate's plan arm the cost-aware sequences step as the arm's fixed mode."""
        plan = self.planner.plan([Candidate(s.id, _stepping_as(get_mode(s.request.mode), arm), s.tokens, self._cap(s),
                                            s.policy, s.can_draft) for s in active])
        drafts = dict(plan.proposals)
        if plan.drafts:
            drafts.update(await self._draft(plan))
        return [[s.tokens[-1]] + drafts[s.id] for s in active], plan.copied

    async def _draft(self, plan: Plan) -> dict[Hashable, list[int]]:
        """One drafter forward for the plan's drafting sequences, each draft cut to its mode's length. When
        the drafter fails, those sequences verify nothing this step and never draft again."""
        seqs = [self.running[r.key] for r in plan.drafts]
        try:
            timed = await self.backend.draft(seqs, plan.block_length)
        except BackendError:
            for seq in seqs:
                seq.can_draft = False
                seq.pending_context.clear()
            return {}
        self._forwards_ms += timed.ms
        if self.cost is not None and self._timed_alone():
            self.cost.observe_draft(len(seqs), plan.block_length, timed.ms)
        ks = self.planner.cut(plan.drafts, timed.value, plan.load_besides_drafts())
        tokens = timed.value.tokens.tolist()
        return {r.key: tokens[i][:k] for i, (r, k) in enumerate(zip(plan.drafts, ks))}

    async def _forward(self, admitted: list[Sequence], active: list[Sequence], feeds: list[list[int]],
                       copied: dict[Hashable, int]) -> None:
        try:
            timed = await self.backend.forward(admitted, active, feeds)
        except BackendError as exc:
            _fail([*admitted, *active], exc)
            return
        prefilled, verified = timed.value
        self._forwards_ms += timed.ms
        for seq, res in zip(admitted, prefilled):
            self._queue_context(seq, res)
            seq.commit(res.committed, res.log_probs)
        if active and not admitted and self.cost is not None and self._timed_alone():  # (a prefill is not the verify's)
            self.cost.observe_verify(len(active), sum(map(len, feeds)), timed.ms, max(map(len, feeds)))
        for seq, feed, res in zip(active, feeds, verified):
            self._queue_context(seq, res)
            self.planner.controller.observe(seq.policy, len(feed) - 1, res.accepted, matched=copied.get(seq.id, 0))
            seq.steps.append(StepRecord(len(feed) - 1, res.accepted, seq.commit(res.committed, res.log_probs),
                                        res.expected_accepted,
                                        copied=seq.id in copied))

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
            self.reserved -= self.pages_for(seq.request)
            seq.finished_at = seq.finished_at or time.perf_counter()
            seq.pending_context.clear()
        await self.backend.release(seqs)
        if not self.has_work:
            await self.backend.idle()


def _gated(mode: Mode) -> bool:
    """Whether the gate decides for a mode: only the cost-aware one chooses freely how much to propose."""
    return mode.length is Length.COST_AWARE


# The fixed mode a cost-aware sequence steps as on each arm of the gate but the plan arm.
ARM_MODES: dict[Arm, Mode] = {Arm.COPY: get_mode("ngram"), Arm.PLAIN: get_mode(REFERENCE_MODE)}


def _stepping_as(mode: Mode, arm: Arm | None) -> Mode:
    """The mode a sequence of `mode` steps as in a call on `arm`."""
    return ARM_MODES[arm] if _gated(mode) and arm in ARM_MODES else mode


def _proposes(mode: Mode, arm: Arm | None) -> bool:
    """Whether a sequence of `mode` may propose tokens in a call on `arm`."""
    return _stepping_as(mode, arm).proposes


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + EMA * (new - old)


def _fail(seqs: list[Sequence], exc: BackendError) -> None:
    for seq in seqs:
        seq.finish_reason, seq.error = "error", str(exc)
