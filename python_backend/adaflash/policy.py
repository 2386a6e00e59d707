"""Draft-length policies: the cost-aware AdaFlash policy and the published threshold rule.

Speculation pays when the tokens it commits outweigh the extra verify cost. Alone, a
16-token verify costs about as much as a 1-token decode; under load the forward is
compute-bound and every verified draft token costs time. The cost-aware policy measures
T(batch, tokens) on the running machine and, each step, picks the per-sequence draft
lengths that maximise expected committed tokens per second for the whole batch; k = 0
(plain decoding) is always a candidate, so it never plans to be slower than `ar`.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from adaflash.drafter import DFlashDrafter, Draft
    from adaflash.target import Transformer


@dataclass
class CostModel:
    """Measured milliseconds: verify[b] = [(total_tokens, ms), ...] for b sequences; draft[b] =
    [(block_length, ms), ...] for one drafter forward of b sequences over blocks of that many
    positions (anchor included): a shorter block costs the drafter less."""

    verify: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    draft: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    def verify_ms(self, batch: int, total_tokens: float | np.ndarray) -> float | np.ndarray:
        """Interpolate linearly in tokens per sequence, then across the measured batch sizes."""
        sizes = sorted(self.verify)
        lo = max([b for b in sizes if b <= batch], default=sizes[0])
        hi = min([b for b in sizes if b >= batch], default=sizes[-1])
        per_seq = np.asarray(total_tokens, dtype=float) / batch
        t_lo = self._at(lo, per_seq * lo)
        if hi == lo:
            return t_lo * batch / lo if batch > lo else t_lo
        w = (batch - lo) / (hi - lo)
        return (1 - w) * t_lo + w * self._at(hi, per_seq * hi)

    def _at(self, batch: int, total: np.ndarray) -> np.ndarray:
        xs, ys = np.array(self.verify[batch], dtype=float).T
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else ys[-1] / xs[-1]
        beyond = ys[-1] + slope * (total - xs[-1])  # extrapolate with the last slope
        return np.where(total > xs[-1], beyond, np.interp(total, xs, ys))

    def draft_ms(self, n: int, length: int | None = None) -> float:
        """n sequences drafting blocks of `length` positions (None: the longest measured)."""
        if n == 0 or not self.draft:
            return 0.0
        sizes = sorted(self.draft)

        def at(b: int) -> float:
            xs, ys = np.array(self.draft[b], dtype=float).T
            return float(np.interp(xs[-1] if length is None else length, xs, ys))

        if n > sizes[-1]:
            return at(sizes[-1]) * n / sizes[-1]
        return float(np.interp(n, sizes, [at(b) for b in sizes]))

    def to_json(self) -> dict:
        return {"verify_ms": {str(b): pts for b, pts in self.verify.items()}, "draft_ms": {str(b): v for b, v in self.draft.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        return cls(
            verify={int(b): [tuple(p) for p in pts] for b, pts in d["verify_ms"].items()},
            draft={int(b): [tuple(p) for p in pts] for b, pts in d.get("draft_ms", {}).items()},
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))


def measure_costs(
    target: "Transformer",
    drafter: "DFlashDrafter | None",
    max_batch: int,
    context: int = 128,
    tokens_per_seq: tuple[int, ...] = (1, 2, 4, 8, 16),
    reps: int = 3,
) -> CostModel:
    """Time batched verify forwards (and drafts) on the idle caches; every slot is left empty afterwards."""
    cache = target.cache
    assert cache is not None and all(n == 0 for n in cache.lengths[:max_batch]), "measure on free slots"
    context = min(context, cache.max_len - max(tokens_per_seq) - 1)
    g = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    slots = list(range(max_batch))
    target.forward(slots, torch.randint(0, vocab, (max_batch, context), generator=g).tolist(), logit_rows=torch.tensor([0]))
    if drafter is not None:
        width = drafter.fc.weight.shape[1]
        drafter.append_context(slots, torch.randn(max_batch * context, width, generator=g), [context] * max_batch)
    batches = sorted({1, max_batch} | {2**i for i in range(20) if 2**i < max_batch})
    model = CostModel()
    for b in batches:
        model.verify[b] = []
        for k in tokens_per_seq:
            toks = torch.randint(0, vocab, (b, k), generator=g).tolist()

            def verify() -> None:
                target.forward(slots[:b], toks)
                for s in slots[:b]:
                    cache.truncate(s, context)

            model.verify[b].append((b * k, _median_ms(verify, reps)))
        if drafter is not None:
            anchors = [0] * b
            model.draft[b] = [(n, _median_ms(lambda: drafter.draft(target, slots[:b], anchors, length=n), reps))
                              for n in block_lengths(drafter.config.block_size)]
    for s in slots:
        cache.truncate(s, 0)
        if drafter is not None:
            drafter.truncate(s, 0)
    return model


def block_lengths(block_size: int) -> list[int]:
    """Block lengths (anchor included) the adaflash policy may draft: powers of two, and the full block."""
    return sorted({2**i for i in range(1, 8) if 2**i < block_size} | {block_size})


def _median_ms(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


class AcceptanceStats:
    """Counts of tries and hits per draft position: position j is tried only when 1..j-1 were accepted."""

    def __init__(self, size: int) -> None:
        self.tries = np.zeros(size)
        self.hits = np.zeros(size)
        self.version = 0  # bumped by every update: decisions computed from unchanged counts can be reused

    def update(self, draft_len: int, accepted: int) -> None:
        self.tries[: min(accepted + 1, draft_len)] += 1
        self.hits[:accepted] += 1
        self.version += 1

    def rates(self, prior: np.ndarray, weight: float) -> np.ndarray:
        """Conditional acceptance per position, shrunk toward `prior` with `weight` pseudo-tries."""
        return (self.hits + weight * prior) / (self.tries + weight)


def ratio_to_rates(ratio: torch.Tensor, block_size: int, iters: int = 40) -> np.ndarray:
    """Turn the published head's accepted fraction (a+1)/B into a constant per-position rate alpha,
    solving sum_{j=1}^{B-1} alpha^j = expected accepted tokens by bisection."""
    target = (ratio.double() * block_size - 1).clamp(min=0.0, max=block_size - 1.0 - 1e-6).numpy()
    lo, hi = np.zeros_like(target), np.ones_like(target)
    powers = np.arange(1, block_size)
    for _ in range(iters):
        mid = (lo + hi) / 2
        above = (mid[:, None] ** powers).sum(axis=1) > target
        hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
    return np.repeat(((lo + hi) / 2)[:, None], block_size - 1, axis=1)


def choose_lengths(
    rates: np.ndarray,
    caps: list[int],
    cost: CostModel,
    batch: int,
    other_tokens: int,
    draft_ms: float,
    sunk_ms: float = 0.0,
) -> tuple[list[int], float]:
    """Per-sequence draft lengths maximising expected committed tokens per millisecond.

    rates[i, j]: probability that draft position j+1 of sequence i is accepted given the ones
    before it. The expected gain of verifying a (j+1)-th token is the product of the first j+1
    rates, non-increasing in j, so the best allocation of S verified tokens takes the S
    largest gains over all sequences; every S is tried. `other_tokens` are tokens that other
    sequences put into the same forward. `draft_ms` is paid only if some k > 0 (deciding
    whether to draft at all); `sunk_ms` is time every option pays (a draft already made).
    Returns the lengths and the rate they promise.
    """
    n = len(caps)
    gains = np.cumprod(rates, axis=1)
    caps_a = np.asarray(caps, dtype=int)
    owner = np.repeat(np.arange(n), caps_a)
    value = gains[np.arange(gains.shape[1])[None, :] < caps_a[:, None]]  # row-major: matches `owner`
    order = np.argsort(-value, kind="stable")
    expected = n + np.concatenate([[0.0], np.cumsum(value[order])])
    s = np.arange(len(order) + 1)
    times = cost.verify_ms(batch, other_tokens + n + s) + sunk_ms + np.where(s > 0, draft_ms, 0.0)
    rates_per_ms = expected / times
    best = int(np.argmax(rates_per_ms))  # the first maximum: fewer tokens on ties
    ks = np.bincount(owner[order[:best]], minlength=n)
    return ks.tolist(), float(rates_per_ms[best])


def ratio_from_rates(rates: np.ndarray, block_size: int) -> float:
    """Expected (accepted + 1) / B of a full block given conditional per-position rates.

    Averaging observed (a+1)/B instead would be biased low once shorter blocks are verified.
    """
    return float(1 + np.cumprod(rates).sum()) / block_size


def published_length(ratio: float, block_size: int, cap: int) -> int:
    """AdaFlash paper rule: verify round(ratio * B * 1.3) draft tokens, at least 1."""
    return min(cap, max(1, round(ratio * block_size * 1.3)))


@dataclass
class SequencePolicy:
    """What the controller remembers of one sequence."""

    stats: AcceptanceStats
    probe_interval: int
    skipped: int = 0  # consecutive adaflash steps without drafting


class LengthController:
    """The length decisions of every draft mode, shared by the in-process engine and the Triton models.

    Before drafting (`choose_drafters`): from running per-position acceptance estimates, all
    adaflash sequences draft if drafting beats plain decoding once the draft's own cost is
    paid; otherwise only those due for a probe, so estimates follow the text. After drafting
    (`lengths`): per-sequence k from the length head's prediction or the estimates.
    """

    def __init__(self, cost: CostModel | None, block_size: int, prior_weight: float = 4.0, probe_every: int = 8) -> None:
        self.cost, self.block_size = cost, block_size
        self.prior_weight, self.probe_every = prior_weight, probe_every
        self.global_stats = AcceptanceStats(block_size - 1)
        self._decision: tuple[tuple, bool] | None = None  # (inputs, whether drafting pays) of the last choice

    def new_sequence(self) -> SequencePolicy:
        return SequencePolicy(AcceptanceStats(self.block_size - 1), self.probe_every)

    def estimated_rates(self, seqs: list[SequencePolicy]) -> np.ndarray:
        prior = self.global_stats.rates(np.full(self.block_size - 1, 0.5), 1.0)
        return np.stack([s.stats.rates(prior, self.prior_weight) for s in seqs])


    def choose_drafters(self, seqs: list[SequencePolicy], caps: list[int], batch: int, other_tokens: int,
                        n_drafting: int) -> tuple[list[bool], int]:
        """Which adaflash sequences draft this step, and the block length (anchor included) to draft;
        updates their skip counters.

        The choice is a function of the counts and the batch shape; while they stay the same (the
        common case when nothing is drafted) the last answer is reused: deciding must cost far
        less than the decode step it may save.
        """
        key = (batch, other_tokens, n_drafting, tuple(caps), self.global_stats.version,
               tuple(s.stats.version for s in seqs))
        if self._decision is None or self._decision[0] != key:
            self._decision = (key, *self._plan(self.estimated_rates(seqs), caps, batch, other_tokens, n_drafting))
        _, pays, length = self._decision
        chosen = [True] * len(seqs) if pays else [s.skipped >= s.probe_interval for s in seqs]
        for s, c in zip(seqs, chosen):
            s.skipped = 0 if c else s.skipped + 1
            if pays:
                s.probe_interval = self.probe_every
            elif c:  # a probe: each costs a drafter forward, so they come ever more rarely while drafting does not pay
                s.probe_interval = min(2 * s.probe_interval, 128)
        return chosen, length

    def _plan(self, rates: np.ndarray, caps: list[int], batch: int, other_tokens: int,
              n_drafting: int) -> tuple[bool, int]:
        """Whether drafting beats plain decoding, and the block length that does best: the drafter's
        cost grows with the block, so under load a short block can pay where a full one cannot.
        When nothing pays, probes draft the shortest block."""
        best_rate, best_length = 0.0, None
        for length in block_lengths(self.block_size):
            ks, rate = choose_lengths(rates, [min(c, length - 1) for c in caps], self.cost, batch, other_tokens,
                                      draft_ms=self.cost.draft_ms(n_drafting, length))
            if any(ks) and rate > best_rate:
                best_rate, best_length = rate, length
        return best_length is not None, best_length or min(block_lengths(self.block_size))

    def lengths(self, rates: np.ndarray, caps: list[int], batch: int, other_tokens: int, n_drafting: int) -> list[int]:
        """k per drafted adaflash sequence; the draft is made, so its cost is paid whatever k is."""
        ks, _ = choose_lengths(rates, caps, self.cost, batch, other_tokens, draft_ms=0.0,
                               sunk_ms=self.cost.draft_ms(n_drafting, rates.shape[1] + 1))
        return ks

    def draft_rates(self, draft: "Draft", rows: list[int], estimates: np.ndarray) -> np.ndarray:
        """Per-position rates of drafted sequences `rows`: the position head's when the drafter has one,
        else the published head's ratio spread over the block, else the running `estimates`."""
        width = draft.tokens.shape[1]
        if draft.accept_rates is not None:
            return draft.accept_rates[rows].double().numpy()
        if draft.accept_ratio is not None and width == self.block_size - 1:
            return ratio_to_rates(draft.accept_ratio[rows], self.block_size)
        return estimates[:, :width]

    def published(self, rates: np.ndarray, ratio: float | None, cap: int) -> int:
        """The published rule, with the head's ratio or, without a head, the one the estimates imply."""
        return published_length(ratio_from_rates(rates, self.block_size) if ratio is None else ratio, self.block_size, cap)

    def observe(self, seq: SequencePolicy, draft_len: int, accepted: int) -> None:
        """Record a verified draft. (adaflash probes back off in `choose_drafters`: what they find
        matters only once the estimates say drafting pays, which resets them.)"""
        if draft_len == 0:
            return
        seq.stats.update(draft_len, accepted)
        self.global_stats.update(draft_len, accepted)
