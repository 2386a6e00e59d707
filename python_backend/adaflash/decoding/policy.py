"""Draft-length policies: the cost-aware AdaFlash policy and the published threshold rule.

The cost-aware policy picks, each step, the per-sequence draft lengths that maximise expected
committed tokens per second for the whole batch, from the measured costs (`costs.CostModel`);
k = 0 (plain decoding) is always a candidate, so it never plans to be slower than `ar`.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable
from itertools import accumulate
from operator import mul
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from adaflash.decoding.costs import CostModel, block_lengths
from adaflash.models.shapes import bucket

if TYPE_CHECKING:
    from adaflash.models.drafter import Draft

# The copy estimates are kept per match length, from these shortest matches up: a copy's acceptance keeps rising with
# the tokens its lookup matched, far past prompt lookup's 3 (docs/history.md, engine speed rounds 35 and 36), and
# the longer matches are pooled in ranges so that each range's estimates still see copies enough to learn from.
COPY_MATCH_BUCKETS = (1, 2, 3, 4, 8, 16)


def copy_bucket(matched: int) -> int:
    """The copy estimates that a copy whose lookup matched `matched` tokens reads and teaches (0: no match)."""
    return bisect_right(COPY_MATCH_BUCKETS, matched)


class AcceptanceStats:
    """Counts of tries and hits per draft position: position j is tried only when 1..j-1 were accepted.

    Kept in Python lists, and the estimates made from them too: at concurrency 1 every step reads a sequence's
    fifteen counts a few times right after its forward, when numpy's code has left the CPU's caches and each of
    its calls costs more than a loop over the counts."""

    def __init__(self, size: int) -> None:
        self.tries = [0.0] * size
        self.hits = [0.0] * size
        self.version = 0  # bumped by every update: decisions computed from unchanged counts can be reused
        self._rates: tuple[int, list[float], float, list[float]] | None = None  # (version, prior, weight, rates)
        self._chained: tuple[int, float, float, list[float]] | None = None  # (version, first, weight, rates)

    def update(self, draft_len: int, accepted: int) -> None:
        for j in range(min(accepted + 1, draft_len)):
            self.tries[j] += 1
        for j in range(accepted):
            self.hits[j] += 1
        self.version += 1

    def rates(self, prior: list[float], weight: float) -> list[float]:
        """Conditional acceptance per position, shrunk toward `prior` with `weight` pseudo-tries. The last answer is
        kept while the counts and the prior (the same list: priors are themselves kept answers) stay: a plan reads a
        sequence's rates more than once, and the engine-wide ones at every sequence. Callers do not change it."""
        kept = self._rates
        if kept is not None and kept[0] == self.version and kept[1] is prior and kept[2] == weight:
            return kept[3]
        out = [(h + weight * p) / (t + weight) for h, t, p in zip(self.hits, self.tries, prior)]
        self._rates = (self.version, prior, weight, out)
        return out

    def chained_rates(self, first: float, weight: float) -> list[float]:
        """Like `rates`, each position shrunk toward the estimate of the one before it (the first toward
        `first`). A position never tried then inherits its predecessor's rate: acceptance does not fall
        along a block (a draft that got this far is on track), and a fixed prior such as 0.5 would
        make the policy never verify past the positions it has already seen, so never learn them. Kept like
        `rates`'s."""
        kept = self._chained
        if kept is not None and kept[0] == self.version and kept[1] == first and kept[2] == weight:
            return kept[3]
        out, prior = [], first
        for hits, tries in zip(self.hits, self.tries):
            prior = (hits + weight * prior) / (tries + weight)
            out.append(prior)
        self._chained = (self.version, first, weight, out)
        return out


VECTOR_ROWS = 16  # from this many sequences a plan's sums run in numpy, below in Python floats (`_choose_many`)


def _rate_rows(stats: list[AcceptanceStats], priors: list[list[float]], which: list[int],
               weight: float) -> list[list[float]] | np.ndarray:
    """`AcceptanceStats.rates` of each sequence toward its prior row (`priors[which[i]]`), the same figures in lists
    or, from VECTOR_ROWS sequences, in one array."""
    if len(stats) < VECTOR_ROWS:
        return [s.rates(priors[w], weight) for s, w in zip(stats, which)]
    hits, tries = np.array([s.hits for s in stats]), np.array([s.tries for s in stats])
    return (hits + weight * np.array(priors)[which]) / (tries + weight)


def _prefix_sums(rows: list[list[float]] | np.ndarray, lengths: list[int]) -> list[float]:
    """Per row, the sum of its first `lengths[i]` gains (products of its rates). An array adds them in the order of
    Python's `sum` of `_products` (a cumulative sum adds in sequence; the positions past a length add zeros)."""
    if not isinstance(rows, np.ndarray):
        return [sum(_products(r[:k])) for r, k in zip(rows, lengths)]
    keep = np.arange(rows.shape[1]) < np.asarray(lengths)[:, None]
    return np.where(keep, np.cumprod(rows, axis=1), 0.0).cumsum(axis=1)[:, -1].tolist()


def _products(rates: list[float]) -> list[float]:
    """np.cumprod in Python floats: the same products in the same order."""
    return list(accumulate(rates, mul))


def ratio_to_rates(ratio: torch.Tensor, block_size: int, iters: int = 40) -> np.ndarray:
    """Turn the published head's accepted fraction (a+1)/B into a constant per-position rate alpha,
    solving sum_{j=1}^{B-1} alpha^j = expected accepted tokens by bisection."""
    target = (ratio.double() * block_size - 1).clamp(min=0.0, max=block_size - 1.0 - 1e-6).cpu().numpy()
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
    other_expected: float | None = None,
    other_width: int = 1,
) -> tuple[list[int], float]:
    """Per-sequence draft lengths maximising expected committed tokens per millisecond.

    rates[i, j]: probability that draft position j+1 of sequence i is accepted given the ones
    before it. The expected gain of verifying a (j+1)-th token is the product of the first j+1
    rates, non-increasing in j, so the best allocation of S verified tokens takes the S
    largest gains over all sequences; every S is tried. `other_tokens` are tokens that other
    sequences put into the same forward and `other_expected` the tokens they are expected to
    commit (default: one each): the rate is the whole batch's, else drafts that slow the others
    down would look cheap. `draft_ms` is paid only if some k > 0 (deciding whether to draft at
    all); `sunk_ms` is time every option pays (a draft already made), as is the step's time outside its
    forwards (`CostModel.step_ms`). `other_width`: the other sequences' longest feed, which a padded verify
    (`_choose_padded`) pays whatever these choose. Returns the lengths and the rate they promise.
    """
    if cost.padded:
        return _choose_padded(rates, caps, cost, batch, other_width, draft_ms, sunk_ms, other_expected)
    if len(caps) == 1:
        row = rates[0].tolist() if isinstance(rates, np.ndarray) else list(rates[0])
        return _choose_one(row, caps[0], cost, batch, other_tokens, draft_ms, sunk_ms, other_expected)
    return _choose_many(np.asarray(rates, dtype=float), caps, cost, batch, other_tokens, draft_ms, sunk_ms,
                        other_expected)


def _choose_padded(rates: np.ndarray | list[list[float]], caps: list[int], cost: CostModel, batch: int,
                   other_width: int, draft_ms: float, sunk_ms: float,
                   other_expected: float | None) -> tuple[list[int], float]:
    """`choose_lengths` where verifies run padded (`CostModel.padded`): a verify costs what its widest feed costs,
    rounded up to a power of two, for every sequence in it. Once a width is paid, verifying more of a proposal within
    it costs nothing and can only commit more, so each width's best choice with anything verified is every
    sequence's proposal cut to it (`draft_ms` is paid once); against those stands verifying nothing at the others'
    width. The widths from the others' up to the longest proposal's are tried, the fewest tokens winning a tie."""
    n = len(caps)
    committed = _committed_by_width(rates, caps)
    base = (batch - n if other_expected is None else other_expected) + n
    width, longest = bucket(other_width), max(caps, default=0)
    best = [0] * n, base / (cost.padded_verify_ms(batch, width) + cost.step_ms + sunk_ms)
    while True:
        ks = [min(cap, width - 1) for cap in caps]
        rate = (base + committed(ks)) / (cost.padded_verify_ms(batch, width) + cost.step_ms + sunk_ms + draft_ms)
        if any(ks) and rate > best[1]:
            best = ks, rate
        if width > longest:
            return best[0], float(best[1])
        width *= 2


def _committed_by_width(rates: np.ndarray | list[list[float]], caps: list[int]) -> Callable[[list[int]], float]:
    """The tokens verifying ks[i] of each proposal is expected to commit, from running sums made once (a padded choice
    reads them at every width): in lists below VECTOR_ROWS sequences, in an array from there."""
    if len(caps) >= VECTOR_ROWS:
        rates = np.asarray(rates, dtype=float)
        sums = np.concatenate([np.zeros((len(caps), 1)), np.cumsum(np.cumprod(rates, axis=1), axis=1)], axis=1)
        rows = np.arange(len(caps))
        return lambda ks: float(sums[rows, ks].sum())
    rows = rates.tolist() if isinstance(rates, np.ndarray) else rates
    sums = [list(accumulate(_products(row[:cap]), initial=0.0)) for row, cap in zip(rows, caps)]
    return lambda ks: sum(s[k] for s, k in zip(sums, ks))


def _choose_many(rates: np.ndarray, caps: list[int], cost: CostModel, batch: int, other_tokens: int, draft_ms: float,
                 sunk_ms: float, other_expected: float | None) -> tuple[list[int], float]:
    """Below VECTOR_ROWS sequences in Python floats over lists, like `_choose_one`: a step plans right after its
    forward, when numpy's code has left the CPU's caches, and its dozen calls on a few hundred numbers cost more than
    this loop (docs/history.md, engine speed round 10). From there in numpy: the loop over a thousand gains took
    most of a plan's milliseconds (round 20). Both add the same sums in the same order, so they choose alike."""
    n = len(caps)
    value, owner, _ = _sorted_gains(rates, caps)
    others = batch - n if other_expected is None else other_expected
    times = _verify_times(cost, batch, other_tokens + n, len(value))
    if isinstance(value, np.ndarray):
        best, best_rate = _best_prefix(value, times, others + n, cost.step_ms, sunk_ms, draft_ms)
        return np.bincount(owner[:best], minlength=n).tolist(), best_rate
    best, best_rate = _best_count(value, times.tolist(), others + n, cost.step_ms, sunk_ms, draft_ms)
    ks = [0] * n
    for i in owner[:best]:
        ks[i] += 1
    return ks, best_rate


def _best_count(gains: Iterable[float], times: list[float], base: float, step_ms: float, sunk_ms: float,
                draft_ms: float) -> tuple[int, float]:
    """How many of `gains` (largest first) to verify, and the rate that promises: (base + their sum) over the verify
    time of that many more tokens (`times[s]`) plus the step's time and what is sunk, and `draft_ms` once any is
    verified, added in this order by every length choice, so theirs are the same sums. The first maximum: fewer
    tokens on ties."""
    best, best_rate, committed = 0, base / (times[0] + step_ms + sunk_ms), 0.0
    for s, gain in enumerate(gains, 1):
        committed += gain
        rate = (base + committed) / (times[s] + step_ms + sunk_ms + draft_ms)
        if rate > best_rate:
            best, best_rate = s, rate
    return best, float(best_rate)


def _best_prefix(gains: np.ndarray, times: np.ndarray, base: float, step_ms: float, sunk_ms: float,
                 draft_ms: float) -> tuple[int, float]:
    """`_best_count` over an array of gains: the same sums in the same order, the same first maximum."""
    none = base / (times[0] + step_ms + sunk_ms)
    if not len(gains):
        return 0, float(none)
    rates = (base + np.cumsum(gains)) / (times[1 : len(gains) + 1] + step_ms + sunk_ms + draft_ms)
    s = int(np.argmax(rates))
    return (s + 1, float(rates[s])) if rates[s] > none else (0, float(none))


def _sorted_gains(rates: np.ndarray | list[list[float]],
                  caps: list[int]) -> tuple[list[float], list[int], list[int]] | tuple[np.ndarray, ...]:
    """Every draftable position's gain (the product of the rates up to it) within the caps, largest first, ties in
    row-major order, with the row and the position each came from: lists below VECTOR_ROWS sequences, arrays from
    there. Gains never rise along a row, so the S largest are the best S positions to verify, and one row's are in
    order already."""
    if len(caps) == 1:
        row = rates[0].tolist() if isinstance(rates, np.ndarray) else rates[0]
        gains = _products(row[: caps[0]])
        return gains, [0] * len(gains), list(range(len(gains)))
    if len(caps) >= VECTOR_ROWS:
        rates = np.asarray(rates, dtype=float)
        keep = np.arange(rates.shape[1]) < np.asarray(caps)[:, None]
        rows, positions = np.nonzero(keep)
        gains = np.cumprod(rates, axis=1)[keep]
        order = np.argsort(-gains, kind="stable")
        return gains[order], rows[order], positions[order]
    gains, rows, positions = [], [], []
    for i, (row, cap) in enumerate(zip(rates.tolist() if isinstance(rates, np.ndarray) else rates, caps)):
        row_gains = _products(row[:cap])
        gains += row_gains
        rows += [i] * len(row_gains)
        positions += range(len(row_gains))
    order = sorted(range(len(gains)), key=lambda j: -gains[j])
    return [gains[j] for j in order], [rows[j] for j in order], [positions[j] for j in order]


def _verify_times(cost: CostModel, batch: int, first: int, count: int) -> np.ndarray:
    """Verify milliseconds of `batch` sequences at `first` tokens in all and at each of the `count` totals after."""
    return cost.verify_ms(batch, np.arange(first, first + count + 1))


def _best_block(rates: np.ndarray | list[list[float]], caps: list[int], cost: CostModel, batch: int, other_tokens: int,
                lengths: list[int], drafts: list[float], other_expected: float | None) -> int | None:
    """The block length, of `lengths` (drafter forwards costing `drafts`), whose best choice (`choose_lengths`, with
    each cap lowered to the block) promises the highest rate with something drafted; None when none drafts. One
    sort serves every length: a shorter block's gains are the longer one's with later positions left out, in the
    same order, so each length's sums, and choice, are `choose_lengths`'s."""
    n = len(caps)
    value, _, position = _sorted_gains(rates, caps)
    others = batch - n if other_expected is None else other_expected
    vector = isinstance(value, np.ndarray)
    times = _verify_times(cost, batch, other_tokens + n, len(value)) if vector else cost.verify_ms_run(
        batch, other_tokens + n, len(value))
    best, best_rate = None, 0.0
    for length, draft_ms in zip(lengths, drafts):
        if vector:
            top, top_rate = _best_prefix(value[position < length - 1], times, others + n, cost.step_ms, 0.0, draft_ms)
        else:
            kept = (gain for gain, at in zip(value, position) if at < length - 1)
            top, top_rate = _best_count(kept, times, others + n, cost.step_ms, 0.0, draft_ms)
        if top and top_rate > best_rate:
            best, best_rate = length, top_rate
    return best


def _choose_one(rates: list[float], cap: int, cost: CostModel, batch: int, other_tokens: int, draft_ms: float,
                sunk_ms: float, other_expected: float | None) -> tuple[list[int], float]:
    """`_choose_many` for one sequence in Python floats, the same sums in the same order (so the same choice): a
    sequence's gains never rise along its block, so its S largest are its first S. At concurrency 1 every step
    plans so; its verify times are read as one run of Python floats (`CostModel.verify_ms_run`)."""
    gains = _products(rates[:cap])
    times = cost.verify_ms_run(batch, other_tokens + 1, len(gains))
    best, best_rate = _best_count(gains, times, (batch - 1 if other_expected is None else other_expected) + 1,
                                  cost.step_ms, sunk_ms, draft_ms)
    return [best], best_rate


def ratio_from_rates(rates: np.ndarray, block_size: int) -> float:
    """Expected (accepted + 1) / B of a full block given conditional per-position rates.

    Averaging observed (a+1)/B instead would be biased low once shorter blocks are verified.
    """
    return float(1 + np.cumprod(rates).sum()) / block_size


PUBLISHED_RATE = 1.3  # AdaFlash's threshold rate (THRESHOLD_RATE of its scripts/tools/benchmark.sh)
PUBLISHED_MIN_CANDIDATE = 1  # its CANDIDATE_LEN_MIN: the anchor alone, no draft token
ESTIMATED_MIN_CANDIDATE = 2  # without a head: at least one draft token (SpecForge's default minimum)


def published_length(ratio: float, block_size: int, cap: int, min_candidate: int = PUBLISHED_MIN_CANDIDATE) -> int:
    """AdaFlash's serving rule (SGLang, `thresh_head_direct_len`): the head's ratio is a candidate length over B,
    the block positions to verify with the anchor counted (its label is (a + 1) / B), so the candidate length is
    round(ratio * B * 1.3) (half to even, as torch rounds) within [min_candidate, B] and the draft tokens one
    fewer: 0 is a plain step."""
    candidate = min(block_size, max(min_candidate, round(ratio * block_size * PUBLISHED_RATE)))
    return min(cap, candidate - 1)


PROBE_SHARE_FLOOR = 1 / 16  # of the full share: drafter probes that keep finding nothing shrink their share to this
# Due sequences that probe in one drafter forward, the longest waiting first. A sequence's first draft projects its
# whole context into the drafter's cache, so a probe of a whole batch of 62 cost ~50 ms on the default models (~2.5% of
# a round at c=64; docs/history.md, round 20), while what a few find teaches the engine-wide estimates every
# sequence's are shrunk toward.
PROBE_SEQUENCES = 4


class ProbeBudget:
    """A share of the time for one kind of exploration: after a probe charged `ms`, the next waits until that is
    the share's part of the time since. Drafter probes' share halves with each probe (`shrink`, down to
    `PROBE_SHARE_FLOOR` of it) and is whole again once drafting pays: where the drafter never pays a fixed share was a
    fixed loss against the best fixed mode (docs/history.md, engine speed round 9). What a probe finds short of
    that does not bring the share back: it used to double with each accepted token, and a probe of many sequences
    nearly always finds a few, so under load the share never shrank (round 20). Copies verified whole keep theirs:
    they cost no drafter forward, and they are how long copies, prompt lookup's strength, are learnt."""

    def __init__(self, share: float, clock: Callable[[], float]) -> None:
        self.full, self.share, self.clock = share, share, clock
        self._after = -math.inf  # clock time before which no probe may run

    def open(self) -> bool:
        return self.clock() >= self._after

    def charge(self, ms: float) -> None:
        self._after = self.clock() + ms / 1000 / self.share

    def shrink(self) -> None:
        self.share = max(self.share / 2, self.full * PROBE_SHARE_FLOOR)

    def restore(self) -> None:
        self.share = self.full


@dataclass
class PolicyState:
    """What the controller remembers of one sequence."""

    stats: AcceptanceStats
    copy: list[AcceptanceStats]  # of drafts copied from the context, by the match's `copy_bucket`
    probe_interval: int
    skipped: int = 0  # consecutive adaflash steps without drafting
    copy_skipped: int = 0  # consecutive steps with a copy proposal declined or cut short


class LengthController:
    """The length decisions of every draft mode, shared by the in-process engine and the Triton models.

    Before drafting (`choose_drafters`): from running per-position acceptance estimates, all
    adaflash sequences draft if drafting beats plain decoding once the draft's own cost is
    paid; otherwise only those due for a probe, so estimates follow the text. After drafting
    (`draft_lens`): per-sequence k from the length head's prediction or the estimates. adaflash
    sequences may instead verify a copy of the context's continuation (`prefers_copy`,
    `copy_lengths`): on text that repeats itself a copy beats the drafter and costs no forward.
    """

    def __init__(self, cost: CostModel | None, block_size: int, prior_weight: float = 4.0, probe_every: int = 8,
                 probe_share: float = 0.05, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cost, self.block_size = cost, block_size
        self.prior_weight, self.probe_every = prior_weight, probe_every
        self._drafter_probes = ProbeBudget(probe_share, clock)
        self._copy_probes = ProbeBudget(probe_share, clock)
        self.global_stats = AcceptanceStats(block_size - 1)
        self.global_copy = self._copy_estimates()
        self._pooled_copy = AcceptanceStats(block_size - 1)  # global_copy's counts summed, kept with them
        self._decision: tuple[tuple, bool] | None = None  # (inputs, whether drafting pays) of the last choice

    def new_sequence(self) -> PolicyState:
        return PolicyState(AcceptanceStats(self.block_size - 1), self._copy_estimates(), self.probe_every)

    def _copy_estimates(self) -> list[AcceptanceStats]:
        """Copy estimates, one per `copy_bucket` (0, no match, unused)."""
        return [AcceptanceStats(self.block_size - 1) for _ in range(len(COPY_MATCH_BUCKETS) + 1)]

    def estimated_rates(self, seqs: list[PolicyState]) -> np.ndarray:
        return np.asarray(self._draft_rows(seqs))

    def _draft_rows(self, seqs: list[PolicyState]) -> list[list[float]] | np.ndarray:
        prior = self.global_stats.chained_rates(0.5, 1.0)  # the engine-wide estimates the sequences' are shrunk toward
        return _rate_rows([s.stats for s in seqs], [prior], [0] * len(seqs), self.prior_weight)

    def copy_rates(self, seqs: list[PolicyState], matched: list[int]) -> np.ndarray:
        """Acceptance estimates of copies whose lookup matched `matched[i]` tokens (see `ngram.lookup`).

        A copy's first token depends on the match (a 1-gram match is a guess, a 3-gram one rarely wrong), but once
        it is accepted the copy is in step with the text whatever matched. So the estimates of each match length
        are shrunk toward the copies of every length pooled, and a sequence's toward the whole engine's: positions
        that a length's copies rarely reach (a 1-gram copy is rarely verified past its first token) take what
        the others learnt there instead of inheriting their own first token's rate."""
        return np.asarray(self._copy_rows(seqs, matched))

    def _copy_rows(self, seqs: list[PolicyState], matched: list[int]) -> list[list[float]] | np.ndarray:
        pooled = self._pooled_copy.chained_rates(0.5, 1.0)  # each match length's priors: kept while their counts stand
        buckets = [copy_bucket(n) for n in matched]
        return _rate_rows([s.copy[b] for s, b in zip(seqs, buckets)], [s.rates(pooled, 1.0) for s in self.global_copy],
                          buckets, self.prior_weight)

    def prefers_copy(self, seqs: list[PolicyState], matched: list[int], proposal_lens: list[int],
                     caps: list[int]) -> list[bool]:
        """Which sequences verify the context's continuation instead of asking the drafter: a copy costs
        no drafter forward, so it wins whenever it is expected to commit at least as many tokens, except
        for sequences due for a drafter probe (else a drafter never tried would never be learnt). A
        sequence that copies counts the step as one without drafting, toward its next probe."""
        offered = [i for i, n in enumerate(proposal_lens) if n]  # a step without a copy on offer weighs nothing
        if not offered:
            return [False] * len(seqs)
        copied = _prefix_sums(self._copy_rows([seqs[i] for i in offered], [matched[i] for i in offered]),
                              [proposal_lens[i] for i in offered])
        drafted = _prefix_sums(self._draft_rows([seqs[i] for i in offered]), [max(caps[i], 1) for i in offered])
        out = [False] * len(seqs)
        for i, copy, draft in zip(offered, copied, drafted):
            out[i] = copy >= draft and seqs[i].skipped < seqs[i].probe_interval
            seqs[i].skipped += out[i]
        return out

    def copy_lengths(self, seqs: list[PolicyState], matched: list[int], proposal_lens: list[int], batch: int,
                     other_tokens: int, other_expected: float | None = None,
                     other_width: int = 1) -> tuple[list[int], list[float]]:
        """How much of each copy proposal to verify (cost-aware, nothing to draft), and the tokens each
        is expected to commit. A sequence whose copies have been declined or cut short for `probe_every` steps
        verifies its copy whole: positions past the cut are tried only then, so a few early misses there would
        otherwise cut every later copy for good. That whole copy is how positions rarely verified get learnt; the
        lengths themselves follow the estimates, not an optimistic bound of them: under load every verified token
        costs time, and a bound's optimism, paid on every copy of the batch, cost more than it learnt
        (docs/history.md, engine speed round 8)."""
        rates = self._copy_rows(seqs, matched)
        ks, _ = choose_lengths(rates, proposal_lens, self.cost, batch, other_tokens, draft_ms=0.0,
                               other_expected=other_expected, other_width=other_width)
        due = []
        for i, s in enumerate(seqs):
            if ks[i] < proposal_lens[i]:
                s.copy_skipped += 1
                if s.copy_skipped >= self.probe_every:
                    due.append(i)
        if due and self._may_probe(self._copy_probes, batch, other_tokens + len(seqs) + sum(ks),
                                   sum(proposal_lens[i] - ks[i] for i in due), draft_ms=0.0):
            for i in due:
                ks[i] = proposal_lens[i]
        for i, s in enumerate(seqs):
            if proposal_lens[i] and ks[i] == proposal_lens[i]:
                s.copy_skipped = 0
        return ks, [1.0 + s for s in _prefix_sums(rates, ks)]

    def choose_drafters(self, seqs: list[PolicyState], caps: list[int], batch: int, other_tokens: int,
                        n_drafting: int, other_expected: float | None = None,
                        other_width: int = 1) -> tuple[list[bool], int]:
        """Which adaflash sequences draft this step, and the block_length to draft;
        updates their skip counters.

        The choice is a function of the counts and the batch shape; while they stay the same (the
        common case when nothing is drafted) the last answer is reused: deciding must cost far
        less than the decode step it may save.
        """
        key = (batch, other_tokens, None if other_expected is None else round(other_expected, 1), n_drafting,
               other_width if self.cost.padded else 1, tuple(caps), self.cost.scales, self.global_stats.version,
               tuple(s.stats.version for s in seqs))
        if self._decision is None or self._decision[0] != key:
            self._decision = (key, *self._plan(self._draft_rows(seqs), caps, batch, other_tokens, n_drafting,
                                               other_expected, other_width))
        _, pays, block_length = self._decision
        if pays:
            self._drafter_probes.restore()
        chosen = [True] * len(seqs) if pays else self._probes(seqs, block_length, batch, other_tokens + len(seqs))
        for s, c in zip(seqs, chosen):
            s.skipped = 0 if c else s.skipped + 1
            if pays:
                s.probe_interval = self.probe_every
            elif c:  # a probe: each costs a drafter forward, so they come ever more rarely while drafting does not pay
                s.probe_interval = min(2 * s.probe_interval, 128)
        return chosen, block_length

    def _probes(self, seqs: list[PolicyState], block_length: int, batch: int, tokens: int) -> list[bool]:
        """Sequences due for a probe, if drafter probes keep to their share of the time (`ProbeBudget`): every
        probe costs a drafter forward and the verify of what it drafted (at least a token each, beside the step's
        `tokens`), and under load the sequences' schedules would together run one every step. Due sequences that
        have to wait probe together later, in one forward, at most PROBE_SEQUENCES of them. Each probe runs while
        drafting does not pay, so it halves the share left to the next ones; the whole share returns once drafting
        pays."""
        due = [i for i, s in enumerate(seqs) if s.skipped >= s.probe_interval]
        if not due:
            return [False] * len(seqs)
        due = set(sorted(due, key=lambda i: -seqs[i].skipped)[:PROBE_SEQUENCES])
        n = len(due)
        if not self._may_probe(self._drafter_probes, batch, tokens, n, self.cost.draft_ms(n, block_length)):
            return [False] * len(seqs)
        self._drafter_probes.shrink()
        return [i in due for i in range(len(seqs))]

    def _may_probe(self, budget: ProbeBudget, batch: int, tokens: int, extra_tokens: int, draft_ms: float) -> bool:
        """Whether probes (drafter probes, or copies verified whole past the cut) may run now within `budget`: each
        is charged what it adds to the step, a drafter forward and the verify of `extra_tokens` beside the step's
        `tokens`. Under load a batch's sequences would otherwise each come due in turn and probe on nearly every
        step."""
        if not budget.open():
            return False
        budget.charge(draft_ms + float(self.cost.verify_ms(batch, tokens + extra_tokens)
                                       - self.cost.verify_ms(batch, tokens)))
        return True

    def _plan(self, rates: np.ndarray | list[list[float]], caps: list[int], batch: int, other_tokens: int,
              n_drafting: int, other_expected: float | None, other_width: int = 1) -> tuple[bool, int]:
        """Whether drafting beats plain decoding, and the block_length that does best: the drafter's
        cost grows with the block, so under load a short block can pay where a full one cannot.
        When nothing pays, probes draft the shortest block."""
        lengths = block_lengths(self.block_size)
        drafts = [self.cost.draft_ms(n_drafting, length) for length in lengths]
        if not self.cost.padded:
            best = _best_block(rates, caps, self.cost, batch, other_tokens, lengths, drafts, other_expected)
        else:  # padded verifies (a few widths a length): each length's own choice
            best = None
            best_rate = 0.0
            for block_length, draft_ms in zip(lengths, drafts):
                ks, rate = choose_lengths(rates, [min(c, block_length - 1) for c in caps], self.cost, batch,
                                          other_tokens, other_expected=other_expected, draft_ms=draft_ms,
                                          other_width=other_width)
                if any(ks) and rate > best_rate:
                    best_rate, best = rate, block_length
        return best is not None, best or lengths[0]

    def draft_lens(self, rates: np.ndarray, caps: list[int], batch: int, other_tokens: int, n_drafting: int,
                   other_expected: float | None = None, other_width: int = 1) -> list[int]:
        """k per drafted adaflash sequence; the draft is made, so its cost is paid whatever k is."""
        ks, _ = choose_lengths(rates, caps, self.cost, batch, other_tokens, draft_ms=0.0, other_expected=other_expected,
                               sunk_ms=self.cost.draft_ms(n_drafting, rates.shape[1] + 1), other_width=other_width)
        return ks

    def draft_rates(self, draft: "Draft", rows: list[int], estimates: np.ndarray) -> np.ndarray:
        """Per-position rates of drafted sequences `rows`: the position head's when the drafter has one,
        else the published head's ratio spread over the block, else the running `estimates`."""
        width = draft.tokens.shape[1]
        if draft.accept_rates is not None:
            return draft.accept_rates[rows].double().cpu().numpy()
        if draft.accept_ratio is not None and width == self.block_size - 1:
            return ratio_to_rates(draft.accept_ratio[rows], self.block_size)
        return estimates[:, :width]

    def published(self, rates: np.ndarray, ratio: float | None, cap: int) -> int:
        """The published rule, with the head's ratio or, without a head, the one the estimates imply. Estimates
        learn only from verified drafts, so without a head at least one token is verified: a sequence whose
        estimates fell would otherwise never draft again."""
        if ratio is not None:
            return published_length(ratio, self.block_size, cap)
        return published_length(ratio_from_rates(rates, self.block_size), self.block_size, cap, ESTIMATED_MIN_CANDIDATE)

    def observe(self, seq: PolicyState, draft_len: int, accepted: int, matched: int = 0) -> None:
        """Record a verified draft: drafted, or copied after a lookup that `matched` tokens. (Probes back off in
        `choose_drafters` whatever they find, a sequence's own and the time share of all, until the estimates say
        drafting pays, see `ProbeBudget`.)"""
        if draft_len == 0:
            return
        if matched:
            b = copy_bucket(matched)
            seq.copy[b].update(draft_len, accepted)
            self.global_copy[b].update(draft_len, accepted)
            self._pooled_copy.update(draft_len, accepted)
            return
        seq.stats.update(draft_len, accepted)
        self.global_stats.update(draft_len, accepted)
