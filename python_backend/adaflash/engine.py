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

import numpy as np
import torch

from adaflash import ngram
from adaflash.drafter import DFlashDrafter
from adaflash.policy import AcceptanceStats, CostModel, choose_lengths, measure_costs, published_length, ratio_to_rates
from adaflash.sampling import SamplingParams, sample, target_probs, verify_greedy, verify_sampled
from adaflash.target import Transformer

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


@dataclass
class Sequence:
    id: int
    request: Request
    tokens: list[int]
    generator: torch.Generator
    stop_ids: frozenset[int]
    slot: int = -1
    output: list[int] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    finish_reason: str | None = None
    skipped_drafts: int = 0  # consecutive adaflash steps without drafting
    probe_interval: int = 8  # skipped steps before drafting anyway, to re-measure acceptance
    stats: AcceptanceStats | None = None
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
    ) -> None:
        self.target, self.drafter = target, drafter
        self.block_size = drafter.config.block_size if drafter else 16
        self.max_len = max_len
        self.prefill_tokens = prefill_tokens
        self.prior_weight, self.probe_every = prior_weight, probe_every
        self.capture = drafter.config.target_layer_ids if drafter else None
        if drafter is not None:
            drafter.check_target(target)
            drafter.allocate_cache(num_slots, max_len)
        target.allocate_cache(num_slots, max_len)
        self.cost = cost_model
        if self.cost is None and drafter is not None:
            self.cost = measure_costs(target, drafter, num_slots)
        self.num_slots = num_slots
        self.max_active = num_slots
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}
        self.global_stats = AcceptanceStats(self.block_size - 1)
        self._ids = count()

    # ---- admission -------------------------------------------------------------------------
    def submit(self, request: Request) -> Sequence:
        """Queue a request; raises ValueError naming the offending field."""
        self._validate(request)
        stops = self.target.config.eos_token_ids if request.stop_ids is None else request.stop_ids
        seq = Sequence(
            id=next(self._ids), request=request, tokens=list(request.prompt_ids),
            generator=torch.Generator().manual_seed(request.sampling.seed), stop_ids=frozenset(stops),
            stats=AcceptanceStats(self.block_size - 1), probe_interval=self.probe_every,
            submitted_at=time.perf_counter(),
        )
        self.waiting.append(seq)
        return seq

    def _validate(self, r: Request) -> None:
        if r.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {r.mode!r}")
        if r.mode in DRAFTER_MODES and self.drafter is None:
            raise ValueError(f"mode {r.mode!r} needs a drafter and none is loaded")
        if not r.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if any(not 0 <= t < self.target.config.vocab_size for t in r.prompt_ids):
            raise ValueError("prompt_ids holds ids outside the vocabulary")
        if r.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {r.max_tokens}")
        if len(r.prompt_ids) + r.max_tokens + self.block_size > self.max_len:
            raise ValueError(
                f"prompt length {len(r.prompt_ids)} + max_tokens {r.max_tokens} exceeds the context limit "
                f"{self.max_len - self.block_size}"
            )
        if r.max_draft is not None and r.max_draft < 0:
            raise ValueError(f"max_draft must be >= 0, got {r.max_draft}")
        r.sampling.validate()

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
            self._prefill(batch)
        return batch

    def _prefill(self, batch: list[Sequence]) -> None:
        counts = [len(s.tokens) for s in batch]
        last_rows = torch.tensor(np.cumsum(counts) - 1)
        out = self.target.forward([s.slot for s in batch], [s.tokens for s in batch], logit_rows=last_rows,
                                  capture_layers=self.capture)
        firsts = (np.cumsum(counts) - counts).tolist()
        self._queue_context(batch, out.hidden, counts, firsts)
        for i, seq in enumerate(batch):
            seq.commit([self._sample_one(seq, out.logits[i])])

    def _sample_one(self, seq: Sequence, logits: torch.Tensor) -> int:
        if seq.request.sampling.greedy:
            return int(logits.argmax())
        return sample(target_probs(logits[None], seq.request.sampling)[0], seq.generator)

    # ---- one decode step --------------------------------------------------------------------
    def step(self) -> list[Sequence]:
        """Admit what fits, then one draft + verify round for every running sequence.

        Returns the sequences that produced tokens in this call (newly admitted ones included).
        """
        touched = {s.id: s for s in self._admit()}
        active = [s for s in self.running.values() if not s.finished]
        if active:
            drafts = self._plan(active)
            self._verify(active, drafts)
            touched.update((s.id, s) for s in active)
        self._retire([s for s in self.running.values() if s.finished])
        return list(touched.values())

    def _cap(self, seq: Sequence) -> int:
        """Longest draft worth verifying: the mode's cap, the tokens still wanted, the cache room."""
        limit = self.block_size - 1 if seq.request.max_draft is None else min(seq.request.max_draft, self.block_size - 1)
        remaining = seq.request.max_tokens - len(seq.output) - 1
        room = self.max_len - len(seq.tokens) - 1
        return max(0, min(limit, remaining, room))

    def _plan(self, active: list[Sequence]) -> dict[int, list[int]]:
        drafts: dict[int, list[int]] = {}
        for seq in active:
            mode = seq.request.mode
            if mode == "ar":
                drafts[seq.id] = []
            elif mode == "ngram":
                drafts[seq.id] = ngram.propose(seq.tokens, self._cap(seq))
        drafting = [s for s in active if s.request.mode in DRAFTER_MODES and self._cap(s) > 0]
        ada = [s for s in drafting if s.request.mode == "adaflash"]
        ada_ids = {s.id for s in ada}
        other_tokens = sum(len(drafts[s.id]) + 1 if s.id in drafts else self._cap(s) + 1
                           for s in active if s.id not in ada_ids)
        if ada:
            chosen = {s.id for s in self._choose_drafters(ada, len(active), other_tokens, len(drafting))}
            for s in ada:
                s.skipped_drafts = 0 if s.id in chosen else s.skipped_drafts + 1
            drafting = [s for s in drafting if s.request.mode != "adaflash" or s.id in chosen]
        for s in active:
            drafts.setdefault(s.id, [])
        if not drafting:
            return drafts
        self.flush_context(drafting)
        draft = self.drafter.draft(self.target, [s.slot for s in drafting], [s.tokens[-1] for s in drafting])
        tokens = draft.tokens.tolist()
        ratios = draft.accept_ratio
        ada_rows = []
        for i, seq in enumerate(drafting):
            cap = self._cap(seq)
            if seq.request.mode == "dflash":
                drafts[seq.id] = tokens[i][:cap]
            elif seq.request.mode == "adaflash-published":
                r = float(ratios[i]) if ratios is not None else self._estimated_ratio(seq)
                drafts[seq.id] = tokens[i][: published_length(r, self.block_size, cap)]
            else:
                ada_rows.append(i)
        if ada_rows:
            seqs = [drafting[i] for i in ada_rows]
            rates = (ratio_to_rates(ratios[ada_rows], self.block_size) if ratios is not None
                     else self._estimated_rates(seqs))
            chosen = {s.id for s in seqs}
            fixed = sum(len(drafts[s.id]) + 1 for s in active if s.id not in chosen)
            ks, _ = choose_lengths(rates, [self._cap(s) for s in seqs], self.cost, len(active), fixed,
                                   draft_ms=0.0, sunk_ms=self.cost.draft_ms(len(drafting)))
            for seq, i, k in zip(seqs, ada_rows, ks):
                drafts[seq.id] = tokens[i][:k]
        return drafts

    def _estimated_rates(self, seqs: list[Sequence]) -> np.ndarray:
        prior = self.global_stats.rates(np.full(self.block_size - 1, 0.5), 1.0)
        return np.stack([s.stats.rates(prior, self.prior_weight) for s in seqs])

    def _estimated_ratio(self, seq: Sequence) -> float:
        """Expected (accepted + 1) / B of a full block, from the per-position estimates.

        Averaging observed (a+1)/B instead would be biased low once shorter blocks are verified.
        """
        rates = self._estimated_rates([seq])[0]
        return float(1 + np.cumprod(rates).sum()) / self.block_size

    def _choose_drafters(self, ada: list[Sequence], batch: int, other_tokens: int, n_drafting: int) -> list[Sequence]:
        """Before drafting, from running acceptance estimates: all adaflash sequences draft if drafting
        beats plain decoding once the draft's own cost is paid; otherwise only those due for a probe."""
        ks, _ = choose_lengths(self._estimated_rates(ada), [self._cap(s) for s in ada], self.cost, batch, other_tokens,
                               draft_ms=self.cost.draft_ms(n_drafting))
        if any(ks):
            return ada
        return [s for s in ada if s.skipped_drafts >= s.probe_interval]

    def _update_probe(self, seq: Sequence, accepted: int) -> None:
        """Probes that find nothing come ever more rarely (up to every 128 steps); one that finds text resets them."""
        if accepted:
            seq.probe_interval = self.probe_every
        else:
            seq.probe_interval = min(2 * seq.probe_interval, 128)

    def _verify(self, active: list[Sequence], drafts: dict[int, list[int]]) -> None:
        feeds = [[s.tokens[-1]] + drafts[s.id] for s in active]
        out = self.target.forward([s.slot for s in active], feeds, capture_layers=self.capture)
        greedy_ids = out.logits.argmax(-1).tolist()
        row = 0
        keep_rows, keep_counts, ctx_seqs = [], [], []
        for seq, feed in zip(active, feeds):
            n = len(feed)
            draft = feed[1:]
            expected = 0.0
            if seq.request.sampling.greedy:
                committed = verify_greedy(draft, greedy_ids[row : row + n])
            else:
                probs = target_probs(out.logits[row : row + n], seq.request.sampling)
                committed, expected = verify_sampled(draft, probs, seq.generator)
            accepted = len(committed) - 1
            anchor_pos = len(seq.tokens) - 1
            self.target.cache.truncate(seq.slot, anchor_pos + accepted + 1)
            keep_rows.append(row)
            keep_counts.append(accepted + 1)
            ctx_seqs.append(seq)
            if draft:
                seq.stats.update(len(draft), accepted)
                self.global_stats.update(len(draft), accepted)
                if seq.request.mode == "adaflash":
                    self._update_probe(seq, accepted)
            seq.steps.append(StepRecord(len(draft), accepted, seq.commit(committed), expected))
            row += n
        self._queue_context(ctx_seqs, out.hidden, keep_counts, keep_rows)

    def _queue_context(self, seqs: list[Sequence], hidden: torch.Tensor | None, counts: list[int],
                       first_rows: list[int]) -> None:
        """Keep the target features of newly committed positions for the drafter (drafting modes only)."""
        if self.drafter is None or hidden is None:
            return
        for seq, r, c in zip(seqs, first_rows, counts):
            if seq.request.mode in DRAFTER_MODES:
                seq.pending_context.append(hidden[r : r + c].clone())

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
