"""Measured costs of verify and draft forwards: what the length policy trades tokens against.

Speculation pays when the tokens it commits outweigh the extra verify cost. Alone, a
verify of many tokens costs about as much as a one-token decode; under load the forward is
compute-bound and every verified draft token costs time. So the costs are measured on the
running machine (`measure_costs`) and followed live (`CostModel.observe_*`).

Where the target's steps run padded (CUDA graphs, `models/graphs.py`), a verify costs what its padded shape costs:
every sequence as wide as the widest feed, rounded up to a power of two, and the sequences rounded up likewise
(`CostModel.padded`). The table's points are exactly those shapes, so a padded verify reads them directly.
"""

from __future__ import annotations

import bisect
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from adaflash.models.shapes import bucket
from adaflash.models.placement import Placement, place_of

if TYPE_CHECKING:
    from adaflash.models.drafter import DFlashDrafter
    from adaflash.models.target import Transformer


@dataclass
class CostModel:
    """Measured milliseconds: verify[b] = [(total_tokens, ms), ...] for b sequences; draft[b] =
    [(block_length, ms), ...] for one drafter forward of b sequences over blocks of that many
    positions (anchor included): a shorter block costs the drafter less."""

    verify: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    draft: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    verify_scale: float = 1.0  # live time / table time, learnt by `observe_*` (contexts grow, machines vary)
    draft_scale: float = 1.0
    step_ms: float = 0.0  # a step's time outside the model forwards (planning, commits, transport), learnt live
    padded: bool = False  # verifies run padded to power-of-two shapes (`padded_verify_ms`)
    _curves: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)
    _bounds: dict[int, tuple[int, int]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _drafts: dict[tuple[int, int | None], float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_total: dict[int, np.ndarray] = field(default_factory=dict, init=False, repr=False, compare=False)
    _listed: dict[int, list[float]] = field(default_factory=dict, init=False, repr=False, compare=False)  # as lists
    _shapes: dict[tuple[int, int], float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _held: tuple[tuple[int, int, int], tuple[float, ...]] | None = field(  # `scales`, and the figures they hold for
        default=None, init=False, repr=False, compare=False)

    def observe_step(self, ms: float) -> None:
        """Fold a step's time outside its forwards into `step_ms`. Every option of a step pays it alike, so it
        weighs as much as a forward's fixed cost against what more verified tokens add: without it a long
        verify looks dearer, relative to a one-token step, than it is."""
        ms = max(ms, 0.0)
        if self.step_ms == 0.0:
            self.step_ms = ms
            return
        bounded = min(max(ms, self.step_ms / 2), self.step_ms * 2)  # a stall (a page fault, a neighbour) moves it little
        self.step_ms = (1 - _FOLLOW_WEIGHT) * self.step_ms + _FOLLOW_WEIGHT * bounded

    def observe_verify(self, batch: int, total_tokens: int, ms: float, widest: int = 1) -> None:
        """Fold a timed verify forward into `verify_scale`; `widest`: its longest feed (what a padded one costs)."""
        table = self._table_padded_ms(batch, widest) if self.padded else self._table_verify_ms(batch, total_tokens)
        self.verify_scale = _follow(self.verify_scale, ms / float(table))

    def observe_draft(self, n: int, length: int, ms: float) -> None:
        """Fold a timed drafter forward into `draft_scale`."""
        table = self._table_draft_ms(n, length)
        if table > 0:
            self.draft_scale = _follow(self.draft_scale, ms / table)

    @property
    def scales(self) -> tuple[int, int, int]:
        """The scales in steps of 5% and the step time in ms, rounded, and held until one of them moves more than
        _SCALE_HOLD of a step from its held value: decisions taken under the same figures can be reused. Rounded
        afresh at every call, a scale that hovered about a step's edge retook the decision at a third of the steps
        of one sequence (docs/history.md, engine speed round 29)."""
        held = self._held
        if held is not None:
            v_lo, v_hi, d_lo, d_hi, s_lo, s_hi = held[1]
            if v_lo <= self.verify_scale <= v_hi and d_lo <= self.draft_scale <= d_hi and s_lo <= self.step_ms <= s_hi:
                return held[0]
        v, d = (round(math.log(x) / _LOG_5_PERCENT) for x in (self.verify_scale, self.draft_scale))
        s = round(self.step_ms)
        bounds = (*(1.05 ** (n + sign * _SCALE_HOLD) for n in (v, d) for sign in (-1, 1)), s - _SCALE_HOLD,
                  s + _SCALE_HOLD)
        self._held = ((v, d, s), bounds)
        return v, d, s

    def verify_ms(self, batch: int, total_tokens: float | np.ndarray) -> float | np.ndarray:
        if isinstance(total_tokens, np.ndarray) and total_tokens.dtype.kind in "iu":
            return self._whole_totals(batch, int(total_tokens.max(initial=0)))[total_tokens] * self.verify_scale
        return self._table_verify_ms(batch, total_tokens) * self.verify_scale

    def plain_rate(self, batch: int) -> float:
        """Tokens per ms of one plain decoding step of `batch` sequences (a one-token verify each) by the table, the
        live scale left out: the gate's yardstick for a call at that load (`PlanGate.observe`)."""
        table = self._table_padded_ms(batch, 1) if self.padded else self._table_verify_ms(batch, batch)
        return batch / float(table)

    def marginal_share(self, batch: int) -> float:
        """What one more verified token a sequence costs a plain decoding step of `batch` sequences, as a share of
        what the step costs a sequence, by the table: near 1 where the forward's arithmetic bounds it (a CPU under
        load), near 0 where it reads the weights once whatever it verifies (a GPU at small batches)."""
        if self.padded:
            one, two = self._table_padded_ms(batch, 1), self._table_padded_ms(batch, 2)
        else:
            one, two = float(self._table_verify_ms(batch, batch)), float(self._table_verify_ms(batch, 2 * batch))
        return (two - one) / one

    def verify_ms_run(self, batch: int, first: int, count: int) -> list[float]:
        """`verify_ms` of `batch` sequences at `first` tokens in all and at each of the `count` totals after, in Python
        floats: the figures `_whole_totals` keeps, kept as a list too. A plan at one sequence reads such a run at every
        step, and interpolating each total took about a fifth of its time under a profiler (docs/history.md, round
        28)."""
        self._whole_totals(batch, first + count)
        curve, scale = self._listed[batch], self.verify_scale
        return [t * scale for t in curve[first : first + count + 1]]

    def padded_verify_ms(self, batch: int, width: int) -> float:
        """A padded verify of `batch` sequences whose longest feed is `width` tokens: what every feed of it costs."""
        return self._table_padded_ms(batch, width) * self.verify_scale

    def _table_padded_ms(self, batch: int, width: int) -> float:
        """The table at the padded shape, kept: a plan reads a few widths for each block length it weighs, right
        after the forward, and the interpolation cost more than the choice."""
        key = (batch, width)
        if key not in self._shapes:
            rows = bucket(batch)
            self._shapes[key] = float(self._table_verify_ms(rows, rows * bucket(width)))
        return self._shapes[key]

    def _whole_totals(self, batch: int, most: int) -> np.ndarray:
        """`_table_verify_ms` of `batch` at every whole number of tokens up to `most` at least, worked out once: the
        planner reads runs of consecutive totals at every step, right after a forward, when interpolating them
        cost more than the decision it served (the same figures: numpy computes each element alike)."""
        curve = self._by_total.get(batch)
        if curve is None or len(curve) <= most:
            curve = self._table_verify_ms(batch, np.arange(max(2 * most, 64) + 1))
            self._by_total[batch], self._listed[batch] = curve, curve.tolist()
        return curve

    def draft_ms(self, n: int, length: int | None = None) -> float:
        """n sequences drafting blocks of `length` positions (None: the longest measured)."""
        return self._table_draft_ms(n, length) * self.draft_scale

    def _table_verify_ms(self, batch: int, total_tokens: float | np.ndarray) -> float | np.ndarray:
        """Interpolate linearly in tokens per sequence, then across the measured batch sizes. Every step reads it
        (the live scale, every plan), so a single total is worked out in Python floats."""
        lo, hi = self._neighbours(batch)
        if isinstance(total_tokens, np.ndarray):
            at = self._at
            per_seq = total_tokens.astype(float) / batch
        else:
            at = self._at_scalar
            per_seq = float(total_tokens) / batch
        t_lo = at(lo, per_seq * lo)
        if hi == lo:
            return t_lo * batch / lo if batch > lo else t_lo
        w = (batch - lo) / (hi - lo)
        return (1 - w) * t_lo + w * at(hi, per_seq * hi)

    def _neighbours(self, batch: int) -> tuple[int, int]:
        """The measured batch sizes either side of `batch` (the nearest one where it lies outside them)."""
        if batch not in self._bounds:
            sizes = sorted(self.verify)
            self._bounds[batch] = (max([b for b in sizes if b <= batch], default=sizes[0]),
                                   min([b for b in sizes if b >= batch], default=sizes[-1]))
        return self._bounds[batch]

    def _at(self, batch: int, total: np.ndarray) -> np.ndarray:
        xs, ys = self._curve(batch)
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]) if len(xs) > 1 else ys[-1] / xs[-1]
        beyond = ys[-1] + slope * (total - xs[-1])  # extrapolate with the last slope
        return np.where(total > xs[-1], beyond, np.interp(total, xs, ys))

    def _at_scalar(self, batch: int, total: float) -> float:
        """`_at` for one total, in Python floats (np.interp's arithmetic): a step reads it right after its forward,
        when numpy's code has left the caches."""
        points = self.verify[batch]
        i = bisect.bisect_left(points, total, key=itemgetter(0))
        if i == len(points):
            x_last, y_last = points[-1]
            if total == x_last:
                return float(y_last)
            if len(points) == 1:
                return y_last + y_last / x_last * (total - x_last)
            x_prev, y_prev = points[-2]
            return y_last + (y_last - y_prev) / (x_last - x_prev) * (total - x_last)
        x_hi, y_hi = points[i]
        if i == 0 or total == x_hi:
            return float(y_hi)
        x_lo, y_lo = points[i - 1]
        return (y_hi - y_lo) / (x_hi - x_lo) * (total - x_lo) + y_lo

    def _curve(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """The verify table's points for `batch` as arrays (tokens, ms): every plan reads them, so they are made
        once per table (a table is complete before it is used)."""
        if batch not in self._curves:
            self._curves[batch] = np.array(self.verify[batch], dtype=float).T
        return self._curves[batch]

    def _table_draft_ms(self, n: int, length: int | None) -> float:
        """Interpolated in the block length, then across the measured batch sizes; every plan reads it for each
        block length, so each answer is kept (a table is complete before it is used)."""
        if n == 0 or not self.draft:
            return 0.0
        key = (n, length)
        if key not in self._drafts:
            sizes = sorted(self.draft)

            def at(b: int) -> float:
                xs, ys = np.array(self.draft[b], dtype=float).T
                return float(np.interp(xs[-1] if length is None else length, xs, ys))

            if n > sizes[-1]:
                self._drafts[key] = at(sizes[-1]) * n / sizes[-1]
            else:
                self._drafts[key] = float(np.interp(n, sizes, [at(b) for b in sizes]))
        return self._drafts[key]

    def to_json(self) -> dict:
        return {"verify_ms": {str(b): pts for b, pts in self.verify.items()},
                "draft_ms": {str(b): v for b, v in self.draft.items()}, "padded": self.padded}

    @classmethod
    def from_json(cls, d: dict) -> "CostModel":
        return cls(
            verify={int(b): [tuple(p) for p in pts] for b, pts in d["verify_ms"].items()},
            draft={int(b): [tuple(p) for p in pts] for b, pts in d.get("draft_ms", {}).items()},
            padded=bool(d.get("padded", False)),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))


_FOLLOW_WEIGHT = 0.05  # of each new observation in the live figures
_LOG_5_PERCENT = math.log(1.05)
_SCALE_HOLD = 0.75  # of a step of `CostModel.scales`: how far a figure may move before it is rounded afresh


def _follow(scale: float, ratio: float, weight: float = _FOLLOW_WEIGHT) -> float:
    """Exponential average in log space of live/table time ratios, bounded to [1/4, 4]: a single
    stall (another process, a page fault) must not swing the policy."""
    ratio = min(max(ratio, 0.25), 4.0)
    return min(max(math.exp((1 - weight) * math.log(scale) + weight * math.log(ratio)), 0.25), 4.0)


def load_or_measure_costs(given: str | Path | None, target: "Transformer", drafter_dir: str | Path,
                          max_batch: int, drafter_backend: str = "torch") -> CostModel:
    """The table at `given`, else one measured now with the drafter loaded for the purpose (and dropped
    after), on the backend the drafter model runs. Called by the target's server process, so a server holds one
    copy of the target and the figures are those of the device that runs its forwards."""
    if given:
        return CostModel.from_json(json.loads(Path(given).read_text()))
    from adaflash.models.backends import on_backend
    from adaflash.models.drafter import DFlashDrafter

    drafter = on_backend(DFlashDrafter.from_pretrained(drafter_dir, place_of(target)), target, drafter_backend)
    return measure_costs(target, drafter, max_batch)


def measure_costs(
    target: "Transformer",
    drafter: "DFlashDrafter | None",
    max_batch: int,
    context: int = 128,
    tokens_per_seq: tuple[int, ...] = (1, 2, 4, 8, 16),
    reps: int = 5,
    max_len: int | None = None,
) -> CostModel:
    """Time batched verify forwards (and drafts) over `context` cached positions, on caches of their own as
    long as the caller's (`max_len`: attention reads the cache strided by it). The table is padded where the
    target's steps are (its cache has the scratch page graphed steps pad into)."""
    max_len = max_len or context + max(tokens_per_seq) + 1
    context = min(context, max_len - max(tokens_per_seq) - 1)
    cache = target.new_cache(max_batch, max_len)
    g = torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    slots = list(range(max_batch))
    place = place_of(target)
    target.forward(cache, slots, torch.randint(0, vocab, (max_batch, context), generator=g).tolist(),
                   logit_rows=torch.tensor([0], device=place.device))
    if drafter is not None:
        drafter_cache = drafter.new_cache(max_batch, max_len)
        width = drafter.fc.weight.shape[1]
        drafter.append_context(drafter_cache, slots, torch.randn(max_batch * context, width, generator=g),
                               [context] * max_batch)
    batches = sorted({1, max_batch} | {2**i for i in range(20) if 2**i < max_batch})
    model = CostModel(padded=cache.scratch is not None)
    points: list[tuple[dict, int, int, Callable[[], None]]] = []  # (its table, batch, tokens or block length, run)
    for b in batches:
        points += [(model.verify, b, b * k,
                    verify_fn(target, cache, slots[:b], context, ragged_tokens(b * k, b, vocab, g)))
                   for k in tokens_per_seq]
        if drafter is not None:
            points += [(model.draft, b, n, _draft_fn(drafter, target, drafter_cache, slots[:b], n))
                       for n in block_lengths(drafter.config.block_size)]
    for (table, b, x, _), ms in zip(points, typical_ms([p[3] for p in points], reps, place)):
        table.setdefault(b, []).append((x, ms))
    for points_of_b in (*model.verify.values(), *model.draft.values()):
        _monotone(points_of_b)
    return model


def verify_fn(target: "Transformer", cache, slots: list[int], context: int,
              tokens: list[list[int]]) -> Callable[[], None]:
    def verify() -> None:
        target.forward(cache, slots, tokens)
        for s in slots:
            cache.truncate(s, context)
    return verify


def ragged_tokens(total: int, batch: int, vocab: int, g: torch.Generator) -> list[list[int]]:
    """`total` random tokens over `batch` sequences, the first ones one token longer where it does not divide."""
    k, extra = divmod(total, batch)
    return [torch.randint(0, vocab, (k + (i < extra),), generator=g).tolist() for i in range(batch)]


def _draft_fn(drafter: "DFlashDrafter", target: "Transformer", cache, slots: list[int],
              length: int) -> Callable[[], None]:
    anchors = [0] * len(slots)
    return lambda: drafter.draft(target, cache, slots, anchors, length)


def _monotone(points: list[tuple[int, float]]) -> None:
    """More tokens never cost less: timing noise that says otherwise (a 2-token forward measured below
    a 1-token one) is levelled, so the policy does not chase it."""
    for i in range(1, len(points)):
        points[i] = (points[i][0], max(points[i][1], points[i - 1][1]))


def block_lengths(block_size: int) -> list[int]:
    """Block lengths (anchor included) the adaflash policy may draft: powers of two, and the full block."""
    return sorted({2**i for i in range(1, 8) if 2**i < block_size} | {block_size})


ROUND_LEAD_IN = 4  # untimed runs of the quickest function before each round of `typical_ms`


def typical_ms(fns: list[Callable[[], None]], reps: int, place: Placement) -> list[float]:
    """The median of `reps` timed runs of each function after a warm-up. The policy weighs expected tokens
    against expected time, and the machine's slow spells are part of it: a fastest run flatters short forwards
    most (long verifies then look dearer than they are), and the live scale corrects the table's level, not its
    shape (docs/history.md, round 6). The runs go in rounds over all the functions, so a slow spell lands on every point of the table
    alike rather than on the few measured during it. Each round runs them from the quickest to the slowest (as timed
    in the warm-up), after ROUND_LEAD_IN runs of the quickest: right after a forward of 64 sequences, the next few
    forwards of one sequence took up to twice their own time, and a table measured in the order of its batch sizes read
    at one sequence as if verifying sixteen tokens cost what one does (round 30). Each run is timed to the end of its
    device work."""
    order = sorted(range(len(fns)), key=[_run_ms(fn, place) for fn in fns].__getitem__)
    runs: list[list[float]] = [[] for _ in fns]
    for _ in range(reps):
        for _ in range(ROUND_LEAD_IN):
            fns[order[0]]()
        for i in order:
            runs[i].append(_run_ms(fns[i], place))
    return [statistics.median(r) for r in runs]


def _run_ms(fn: Callable[[], None], place: Placement) -> float:
    """One run's milliseconds, from the device's previous work done to its own."""
    place.synchronize()
    t0 = time.perf_counter()
    fn()
    place.synchronize()
    return (time.perf_counter() - t0) * 1000
