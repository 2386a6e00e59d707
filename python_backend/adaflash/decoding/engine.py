"""Continuous-batching speculative decoding engine: admit, step, retire.

Every step runs at most one drafter forward and one target forward for all active
sequences, whatever their modes. Invariant per running sequence: the target KV cache holds
`len(tokens) - 1` positions, and so do the drafter context and the features queued for it;
the last token (the anchor) is fed by the next step, together with the draft tokens that
step verifies. Features reach the drafter lazily, right before a sequence drafts, so steps
where the policy decides not to draft cost no drafter work.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from itertools import count

import torch

from adaflash.decoding import ngram
from adaflash.models.drafter import DFlashDrafter
from adaflash.decoding.policy import CostModel, LengthController, SequencePolicy, measure_costs
from adaflash.decoding.sampling import SamplingParams
from adaflash.models.target import Transformer
from adaflash.decoding.steps import StepResult, prefill_batch, verify_batch

MODES = ("ar", "ngram", "dflash", "adaflash", "adaflash-published")
DRAFTER_MODES = ("dflash", "adaflash", "adaflash-published")


@dataclass
class Request:
    prompt_ids: list[int]
    max_tokens: int
    mode: str = "ar"
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_draft: int | None = None
    stop_ids: tuple[int, ...] | None = None  # None: the target's end-of-sequence ids
    tag: str = ""  # free label carried to the result (a prompt id, a domain)


@dataclass
class StepRecord:
    draft_len: int  # draft tokens sent to verification
    accepted: int  # of those, accepted
    committed: int  # tokens this step produced: accepted + bonus, cut after a stop token (counted) or at max_tokens
    expected_accepted: float = 0.0  # sampling only: sum of p(x) over the draft tokens tried
    copied: bool = False  # the draft was copied from the context (adaflash), not drafted


@dataclass
class Sequence:
    id: int
    request: Request
    tokens: list[int]
    generator: torch.Generator | None  # None when the target keeps it (served sequences)
    stop_ids: frozenset[int]
    slot: int = -1
    output: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: str | None = None
    policy: SequencePolicy | None = None
    pending_context: list[torch.Tensor] = field(default_factory=list)  # target features not yet in the drafter
    submitted_at: float = 0.0  # time.perf_counter() stamps
    finished_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def target_forwards(self) -> int:
        return 1 + len(self.steps) if self.output or self.finished else 0

    def commit(self, tokens: list[int]) -> int:
        """Append committed tokens up to a stop token or max_tokens; returns how many were produced."""
        produced = 0
        for t in tokens:
            produced += 1
            if t in self.stop_ids:
                self.finish_reason = "stop"
                break
            self.output.append(t)
            self.tokens.append(t)
            if len(self.output) >= self.request.max_tokens:
                self.finish_reason = "length"
                break
        return produced


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
        self.block_size = drafter.config.block_size if drafter else 16
        self.max_len = max_len
        self.prefill_tokens = prefill_tokens
        self.copies = copies
        self.capture = drafter.config.target_layer_ids if drafter else None
        if drafter is not None:
            drafter.check_target(target)
            drafter.allocate_cache(num_slots, max_len)
        target.allocate_cache(num_slots, max_len)
        if cost_model is None and drafter is not None:
            cost_model = measure_costs(target, drafter, num_slots)
        self.cost = cost_model
        self.policy = LengthController(cost_model, self.block_size, prior_weight, probe_every)
        self.num_slots = num_slots
        self.max_active = num_slots
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}
        self._ids = count()
        self._expected: dict[int, float] = {}  # this step's adaflash copies: tokens each is expected to commit

    # ---- admission -------------------------------------------------------------------------
    def submit(self, request: Request) -> Sequence:
        """Queue a request; raises ValueError naming the offending field."""
        validate_request(request, self.target.config.vocab_size, self.max_len, self.block_size,
                         has_drafter=self.drafter is not None)
        stops = self.target.config.eos_token_ids if request.stop_ids is None else request.stop_ids
        seq = Sequence(
            id=next(self._ids), request=request, tokens=list(request.prompt_ids),
            generator=torch.Generator().manual_seed(request.sampling.seed), stop_ids=frozenset(stops),
            policy=self.policy.new_sequence(), submitted_at=time.perf_counter(),
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
            results = prefill_batch(self.target, [s.slot for s in batch], [s.tokens for s in batch],
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
        drafts: dict[int, list[int]] = {}
        copied: dict[int, int] = {}
        self._expected.clear()
        for seq in active:
            if seq.request.mode == "ar":
                drafts[seq.id] = []
            elif seq.request.mode == "ngram":
                drafts[seq.id] = ngram.propose(seq.tokens, self._cap(seq))
        drafting = [s for s in active if s.request.mode in DRAFTER_MODES and self._cap(s) > 0]
        caps = {s.id: self._cap(s) for s in drafting}
        length = self.block_size
        ada = [s for s in drafting if s.request.mode == "adaflash"]
        if ada:
            ada_length = self._plan_adaflash(active, ada, caps, drafts, copied)
            drafting = [s for s in drafting if s.id not in drafts]
            if all(s.request.mode == "adaflash" for s in drafting):
                length = ada_length  # the other modes draft full blocks
                caps.update((s.id, min(caps[s.id], length - 1)) for s in drafting)
        for s in active:
            drafts.setdefault(s.id, [])
        if drafting:
            self._draft(active, drafting, caps, length, drafts)
        return drafts, copied

    def _plan_adaflash(self, active: list[Sequence], ada: list[Sequence], caps: dict[int, int],
                       drafts: dict[int, list[int]], copied: dict[int, int]) -> int:
        """Decide the adaflash sequences that do not draft this step (filling `drafts`): those whose
        copy of the context is expected to do as well as the drafter verify it, the others draft if
        that pays and otherwise verify their copy as far as that pays. Returns the block length."""
        proposals = {s.id: ngram.lookup(s.tokens, caps[s.id]) if self.copies else ([], 0) for s in ada}
        prefer = self.policy.prefers_copy([s.policy for s in ada], [proposals[s.id][1] for s in ada],
                                          [len(proposals[s.id][0]) for s in ada], [caps[s.id] for s in ada])
        self._copy(active, [s for s, p in zip(ada, prefer) if p], proposals, caps, drafts, copied)
        rest = [s for s in ada if s.id not in drafts]
        if not rest:
            return self.block_size
        ids = {s.id for s in rest}
        n_drafting = len(rest) + sum(s.id in caps and s.id not in drafts and s.id not in ids for s in active)
        tokens, expected = self._others(active, ids, caps, drafts)
        chosen, length = self.policy.choose_drafters([s.policy for s in rest], [caps[s.id] for s in rest], len(active),
                                                     tokens, n_drafting, expected)
        self._copy(active, [s for s, c in zip(rest, chosen) if not c], proposals, caps, drafts, copied)
        return length

    def _copy(self, active: list[Sequence], seqs: list[Sequence], proposals: dict[int, tuple[list[int], int]],
              caps: dict[int, int], drafts: dict[int, list[int]], copied: dict[int, int]) -> None:
        if not seqs:
            return
        ks, expected = self.policy.copy_lengths([s.policy for s in seqs], [proposals[s.id][1] for s in seqs],
                                                [len(proposals[s.id][0]) for s in seqs], len(active),
                                                *self._others(active, {s.id for s in seqs}, caps, drafts))
        for s, k, e in zip(seqs, ks, expected):
            drafts[s.id] = proposals[s.id][0][:k]
            self._expected[s.id] = e
            if k:
                copied[s.id] = proposals[s.id][1]

    def _others(self, active: list[Sequence], ids: set[int], caps: dict[int, int],
                drafts: dict[int, list[int]]) -> tuple[int, float]:
        """Tokens the sequences outside `ids` put into the next verify (known drafts, full caps for the
        fixed-length drafter modes, one for adaflash sequences still undecided) and the tokens they are
        expected to commit (adaflash copies: their estimate; the others: one, a floor)."""
        def tokens(s: Sequence) -> int:
            if s.id in drafts:
                return len(drafts[s.id]) + 1
            return 1 + (caps.get(s.id, 0) if s.request.mode != "adaflash" else 0)
        others = [s for s in active if s.id not in ids]
        return sum(map(tokens, others)), sum(self._expected.get(s.id, 1.0) for s in others)

    def _draft(self, active: list[Sequence], drafting: list[Sequence], caps: dict[int, int], length: int,
               drafts: dict[int, list[int]]) -> None:
        """One drafter forward for `drafting`, each draft cut to its mode's length."""
        self.flush_context(drafting)
        t0 = time.perf_counter()
        draft = self.drafter.draft(self.target, [s.slot for s in drafting], [s.tokens[-1] for s in drafting], length)
        if self.cost is not None:
            self.cost.observe_draft(len(drafting), length, (time.perf_counter() - t0) * 1000)
        tokens, ratios = draft.tokens.tolist(), draft.accept_ratio
        ada_rows = []
        for i, seq in enumerate(drafting):
            cap = caps[seq.id]
            if seq.request.mode == "dflash":
                drafts[seq.id] = tokens[i][:cap]
            elif seq.request.mode == "adaflash-published":
                rates = self.policy.estimated_rates([seq.policy])[0]
                k = self.policy.published(rates, None if ratios is None else float(ratios[i]), cap)
                drafts[seq.id] = tokens[i][:k]
            else:
                ada_rows.append(i)
        if ada_rows:
            seqs = [drafting[i] for i in ada_rows]
            other_tokens, other_expected = self._others(active, {s.id for s in seqs}, caps, drafts)
            rates = self.policy.draft_rates(draft, ada_rows, self.policy.estimated_rates([s.policy for s in seqs]))
            ks = self.policy.lengths(rates, [caps[s.id] for s in seqs], len(active), other_tokens, len(drafting),
                                     other_expected)
            for seq, i, k in zip(seqs, ada_rows, ks):
                drafts[seq.id] = tokens[i][:k]

    def _verify(self, active: list[Sequence], drafts: dict[int, list[int]], copied: dict[int, int]) -> None:
        feeds = [[s.tokens[-1]] + drafts[s.id] for s in active]
        t0 = time.perf_counter()
        results = verify_batch(self.target, [s.slot for s in active], feeds, [s.request.sampling for s in active],
                               [s.generator for s in active], self.capture)
        if self.cost is not None:
            self.cost.observe_verify(len(active), sum(map(len, feeds)), (time.perf_counter() - t0) * 1000)
        for seq, feed, res in zip(active, feeds, results):
            self._queue_context(seq, res)
            self.policy.observe(seq.policy, len(feed) - 1, res.accepted, matched=copied.get(seq.id, 0))
            seq.steps.append(StepRecord(len(feed) - 1, res.accepted, seq.commit(res.committed), res.expected_accepted,
                                        copied=seq.id in copied))

    def _queue_context(self, seq: Sequence, res: StepResult) -> None:
        """Keep the target features of newly committed positions for the drafter (drafting modes only)."""
        if res.features is not None and seq.request.mode in DRAFTER_MODES:
            seq.pending_context.append(res.features)

    def flush_context(self, seqs: list[Sequence]) -> None:
        """Project queued features into the drafter's context cache, all sequences in one call."""
        todo = [s for s in seqs if s.pending_context]
        if not todo:
            return
        parts = [torch.cat(s.pending_context) for s in todo]
        self.drafter.append_context([s.slot for s in todo], torch.cat(parts), [p.shape[0] for p in parts])
        for s in todo:
            s.pending_context.clear()

    def _retire(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            if seq.slot >= 0 and self.running.get(seq.slot) is seq:
                del self.running[seq.slot]
                self.target.cache.truncate(seq.slot, 0)
                if self.drafter is not None:
                    self.drafter.truncate(seq.slot, 0)
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


def validate_request(r: Request, vocab_size: int, max_len: int, block_size: int, has_drafter: bool) -> None:
    """Raise ValueError naming the offending field."""
    if r.mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {r.mode!r}")
    if r.mode in DRAFTER_MODES and not has_drafter:
        raise ValueError(f"mode {r.mode!r} needs a drafter and none is loaded")
    if not r.prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if any(not 0 <= t < vocab_size for t in r.prompt_ids):
        raise ValueError("prompt_ids holds ids outside the vocabulary")
    if r.max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {r.max_tokens}")
    if len(r.prompt_ids) + r.max_tokens + block_size > max_len:
        raise ValueError(
            f"prompt length {len(r.prompt_ids)} + max_tokens {r.max_tokens} exceeds the context limit "
            f"{max_len - block_size}"
        )
    if r.max_draft is not None and r.max_draft < 0:
        raise ValueError(f"max_draft must be >= 0, got {r.max_draft}")
    r.sampling.validate()


def draft_cap(r: Request, produced: int, length: int, block_size: int, max_len: int) -> int:
    """Longest draft worth verifying: the mode's cap, the tokens still wanted, the cache room."""
    limit = block_size - 1 if r.max_draft is None else min(r.max_draft, block_size - 1)
    return max(0, min(limit, r.max_tokens - produced - 1, max_len - length - 1))
