"""Draft-length policies: the cost-aware choice is optimal; the published rule and ratio conversion behave as stated."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
from helpers import fixed_costs

from adaflash.decoding.costs import ROUND_LEAD_IN, CostModel, block_lengths, typical_ms
from adaflash.decoding.engine import Engine
from adaflash_contract.modes import MODES
from adaflash.decoding.plan import Candidate, Load
from adaflash.decoding.planner import Planner
from adaflash.decoding.proposers.copy import COPY_MATCH
from adaflash.decoding.sequence import Request
from adaflash.models.placement import CPU
from adaflash.decoding import policy
from adaflash.decoding.policy import (PROBE_SEQUENCES, PROBE_SHARE_FLOOR, LengthController, PolicyState, _choose_many,
                                      _choose_one, choose_lengths, copy_bucket, published_length, ratio_to_rates)


def flat_costs(batch: int) -> CostModel:
    return CostModel(verify={batch: [(batch, 10.0), (batch * 16, 10.0)]}, draft={})


def steep_costs(batch: int) -> CostModel:
    return CostModel(verify={batch: [(batch, 10.0), (batch * 16, 10.0 + 15 * batch * 4.0)]}, draft={})


def objective(ks, rates, cost, batch, other_tokens, draft_ms, sunk_ms):
    """Expected committed tokens per ms of the whole batch for a draft-length vector, as choose_lengths
    defines it: the other sequences commit one token each."""
    n = len(ks)
    expected = batch + sum(float(np.prod(rates[i, : j + 1])) for i, k in enumerate(ks) for j in range(k))
    ms = cost.verify_ms(batch, other_tokens + n + sum(ks)) + sunk_ms + (draft_ms if any(ks) else 0.0)
    return expected / ms


def test_certain_acceptance_and_flat_cost_takes_the_caps():
    caps = [15, 7, 3, 0]
    ks, rate = choose_lengths(np.ones((4, 15)), caps, flat_costs(4), batch=4, other_tokens=0, draft_ms=2.0)
    assert ks == caps
    assert rate == pytest.approx((4 + sum(caps)) / 12.0)


def test_zero_acceptance_takes_nothing():
    ks, rate = choose_lengths(np.zeros((3, 15)), [15, 15, 15], flat_costs(3), batch=3, other_tokens=0, draft_ms=0.0)
    assert ks == [0, 0, 0]
    assert rate == pytest.approx(3 / 10.0)


def test_expensive_draft_is_not_worth_it():
    rates = np.full((2, 15), 0.9)
    ks, _ = choose_lengths(rates, [15, 15], flat_costs(2), batch=2, other_tokens=0, draft_ms=1000.0)
    assert ks == [0, 0]
    ks, _ = choose_lengths(rates, [15, 15], flat_costs(2), batch=2, other_tokens=0, draft_ms=1.0)
    assert ks == [15, 15]


def test_steep_verify_cost_shortens_drafts():
    rates = np.full((4, 15), 0.8)
    caps = [15] * 4
    flat, _ = choose_lengths(rates, caps, flat_costs(4), batch=4, other_tokens=0, draft_ms=0.5)
    steep, _ = choose_lengths(rates, caps, steep_costs(4), batch=4, other_tokens=0, draft_ms=0.5)
    assert flat == caps
    assert sum(steep) < sum(flat)
    assert all(s <= f for s, f in zip(steep, flat))


def test_better_sequences_get_longer_drafts():
    rates = np.stack([np.full(15, 0.95), np.full(15, 0.5), np.full(15, 0.1)])
    cost = CostModel(verify={3: [(3, 10.0), (48, 10.0 + 45 * 0.6)]}, draft={})  # 0.6 ms per verified token
    ks, _ = choose_lengths(rates, [15, 15, 15], cost, batch=3, other_tokens=0, draft_ms=0.5)
    assert ks[0] > ks[1] > ks[2] == 0


@pytest.mark.parametrize("seed", range(5))
def test_optimal_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        rates = rng.uniform(0.0, 1.0, size=(3, 3))
        ms = np.cumsum(rng.uniform(0.0, 4.0, size=4)) + rng.uniform(0.5, 3.0)
        cost = CostModel(verify={3: [(3 * (i + 1), float(m)) for i, m in enumerate(ms)]}, draft={})
        draft_ms, sunk_ms = float(rng.uniform(0, 3)), float(rng.uniform(0, 2))
        ks, rate = choose_lengths(rates, [3, 3, 3], cost, batch=3, other_tokens=0, draft_ms=draft_ms, sunk_ms=sunk_ms)
        assert all(0 <= k <= 3 for k in ks)
        best = max(objective(v, rates, cost, 3, 0, draft_ms, sunk_ms) for v in itertools.product(range(4), repeat=3))
        assert objective(ks, rates, cost, 3, 0, draft_ms, sunk_ms) == pytest.approx(best, rel=1e-9)
        assert rate == pytest.approx(best, rel=1e-9)


def test_optimal_against_brute_force_for_one_sequence_beside_others():
    """One sequence deciding beside others (every step at concurrency 1), with a step time outside the forwards."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        rates = rng.uniform(0.2, 1.0, size=(1, 6))
        cap = int(rng.integers(0, 7))
        cost = CostModel(verify={4: [(4, 3.0), (8, 3.5), (16, 5.0), (32, 9.0)]}, draft={})
        cost.step_ms = float(rng.uniform(0, 2))
        ks, rate = choose_lengths(rates, [cap], cost, batch=4, other_tokens=3, draft_ms=0.4)
        best = max(objective([k], rates, cost, 4, 3, 0.4, cost.step_ms) for k in range(cap + 1))
        assert 0 <= ks[0] <= cap and rate == pytest.approx(best, rel=1e-9)


def test_optimal_against_brute_force_with_unequal_caps_and_other_tokens():
    rng = np.random.default_rng(99)
    for _ in range(60):
        rates = rng.uniform(0.2, 1.0, size=(3, 4))
        caps = rng.integers(0, 5, size=3).tolist()
        cost = CostModel(verify={4: [(4, 3.0), (8, 3.5), (16, 5.0), (32, 9.0)]}, draft={})
        ks, rate = choose_lengths(rates, caps, cost, batch=4, other_tokens=2, draft_ms=0.7)
        assert all(0 <= k <= c for k, c in zip(ks, caps))
        best = max(objective(v, rates, cost, 4, 2, 0.7, 0.0)
                   for v in itertools.product(*[range(c + 1) for c in caps]))
        assert rate == pytest.approx(best, rel=1e-9)
        assert objective(ks, rates, cost, 4, 2, 0.7, 0.0) == pytest.approx(best, rel=1e-9)


def padded_objective(ks, rates, cost, batch, other_width, draft_ms, sunk_ms):
    """`objective` for padded verifies: every sequence of the forward costs what the widest feed costs."""
    expected = batch + sum(float(np.prod(rates[i, : j + 1])) for i, k in enumerate(ks) for j in range(k))
    width = max([other_width] + [k + 1 for k in ks])
    return expected / (cost.padded_verify_ms(batch, width) + cost.step_ms + sunk_ms + (draft_ms if any(ks) else 0.0))


def test_padded_verifies_are_chosen_optimally_against_brute_force():
    """Where verifies run padded to power-of-two shapes (CUDA graphs), a verify costs its widest feed's shape for
    every sequence: the choice must be the best of every length vector under that cost, the others' width included."""
    rng = np.random.default_rng(21)
    for _ in range(80):
        rates = rng.uniform(0.0, 1.0, size=(3, 7))
        caps = rng.integers(0, 8, size=3).tolist()
        per_token, fixed = float(rng.uniform(0.0, 0.5)), float(rng.uniform(0.5, 3.0))
        cost = CostModel(verify={b: [(b * w, fixed + per_token * b * w) for w in (1, 2, 4, 8, 16)] for b in (1, 2, 4)},
                         step_ms=float(rng.uniform(0, 1)), verify_scale=float(rng.uniform(0.5, 2)), padded=True)
        other_width, draft_ms, sunk_ms = int(rng.integers(1, 6)), float(rng.uniform(0, 3)), float(rng.uniform(0, 1))
        ks, rate = choose_lengths(rates, caps, cost, batch=4, other_tokens=other_width, draft_ms=draft_ms,
                                  sunk_ms=sunk_ms, other_width=other_width)
        assert all(0 <= k <= c for k, c in zip(ks, caps))
        best = max(padded_objective(v, rates, cost, 4, other_width, draft_ms, sunk_ms)
                   for v in itertools.product(*[range(c + 1) for c in caps]))
        assert rate == pytest.approx(best, rel=1e-9)
        assert padded_objective(ks, rates, cost, 4, other_width, draft_ms, sunk_ms) == pytest.approx(best, rel=1e-9)


def test_plain_decodings_rate_is_read_from_the_table_at_one_token_a_sequence_without_the_live_scale():
    """The gate's yardstick (`CostModel.plain_rate`): sequences per ms of a one-token verify each, between measured
    batch sizes as the table interpolates them, padded tables at a width of one; the live scale, which moves all
    figures alike, is left out."""
    cost = CostModel(verify={32: [(32, 8.0), (64, 12.0)], 64: [(64, 16.0), (128, 24.0)]}, verify_scale=3.0)
    assert cost.plain_rate(32) == pytest.approx(32 / 8.0)
    assert cost.plain_rate(64) == pytest.approx(64 / 16.0)
    assert cost.plain_rate(48) == pytest.approx(48 / 12.0)
    padded = CostModel(verify={4: [(4 * w, 1.0 + 0.5 * w) for w in (1, 2, 4)]}, padded=True, verify_scale=2.0)
    assert padded.plain_rate(4) == pytest.approx(4 / 1.5)


def test_a_padded_verify_fills_the_width_it_pays_for():
    """Once a width is paid, verifying within it costs nothing more: a good copy of 10 tokens is verified whole (a
    cut to 9 would run the same shape), and beside a sequence that feeds 8 tokens a weak proposal verifies 7, where
    beside one-token feeds it verifies none."""
    cost = CostModel(verify={1: [(w, 1.0 + 0.01 * w) for w in (1, 2, 4, 8, 16)],
                             2: [(2 * w, 1.0 + 0.1 * w) for w in (1, 2, 4, 8, 16)]}, padded=True)
    ks, _ = choose_lengths(np.full((1, 15), 0.9), [10], cost, batch=1, other_tokens=0, draft_ms=0.0)
    assert ks == [10]
    weak = np.full((1, 15), 0.02)
    assert choose_lengths(weak, [15], cost, batch=2, other_tokens=8, draft_ms=0.0, other_width=1)[0] == [0]
    assert choose_lengths(weak, [15], cost, batch=2, other_tokens=8, draft_ms=0.0, other_width=8)[0] == [7]


def test_padded_choices_of_a_large_batch_are_those_of_python_floats(monkeypatch):
    """From VECTOR_ROWS sequences the padded sums run in numpy; they choose as the lists would."""
    rng = np.random.default_rng(5)
    cost = CostModel(verify={b: [(b * w, 2.0 + 0.01 * b * w) for w in (1, 2, 4, 8, 16)] for b in (16, 32)},
                     padded=True)
    for _ in range(20):
        rates = rng.uniform(0.0, 1.0, size=(24, 15))
        caps = rng.integers(0, 16, size=24).tolist()
        vector = choose_lengths(rates, caps, cost, batch=30, other_tokens=6, draft_ms=0.5, other_width=2)
        monkeypatch.setattr(policy, "VECTOR_ROWS", 1000)
        lists = choose_lengths(rates, caps, cost, batch=30, other_tokens=6, draft_ms=0.5, other_width=2)
        monkeypatch.undo()
        assert vector[0] == lists[0] and vector[1] == pytest.approx(lists[1], rel=1e-12)


def test_a_padded_verify_teaches_the_scale_against_its_padded_shape():
    """A padded forward of 3 sequences whose widest feed is 3 tokens ran the shape of 4 x 4: timed as the table's
    figure for that shape, the live scale stays where it was."""
    cost = CostModel(verify={b: [(b * w, 1.0 + 0.1 * b * w) for w in (1, 2, 4, 8, 16)] for b in (1, 2, 4)},
                     padded=True)
    for _ in range(10):
        cost.observe_verify(3, 5, 1.0 + 0.1 * 16, widest=3)
    assert cost.verify_scale == pytest.approx(1.0)
    assert cost.padded_verify_ms(3, 3) == pytest.approx(1.0 + 0.1 * 16)


def test_one_sequence_chooses_as_a_batch_of_one_would():
    """At concurrency 1 every step plans one sequence in Python floats (numpy's calls cost more there, cold after
    the forward); it must choose exactly as the batch path, ties and rates included, also beside other sequences."""
    rng = np.random.default_rng(3)
    for i in range(300):
        rates = np.round(rng.uniform(0.0, 1.0, size=(1, 15)), int(rng.integers(1, 4)))  # rounded: ties happen
        cap, batch = int(rng.integers(0, 16)), int(rng.integers(1, 9))
        cost = CostModel(verify={1: [(1, 7.0), (2, 10.0), (4, 16.0), (8, 16.0), (16, 16.5)],
                                 4: [(4, 9.0), (8, 12.5), (16, 19.0), (64, 30.0)]},
                         verify_scale=float(rng.uniform(0.5, 2)), step_ms=float(rng.uniform(0, 2)))
        args = (cost, batch, int(rng.integers(0, 3 * batch)), float(rng.uniform(0, 3)), float(rng.uniform(0, 2)),
                None if i % 2 else float(rng.uniform(0, batch)))
        assert _choose_one(rates[0].tolist(), cap, *args) == _choose_many(rates, [cap], *args)


@pytest.mark.parametrize("seed", range(4))
def test_the_numpy_path_for_a_large_batch_decides_as_the_python_path_bit_for_bit(seed, monkeypatch):
    """From `VECTOR_ROWS` sequences a plan's estimates and length choices run in numpy, below in Python floats: on
    the same counts every decision and every estimate must be the same, bit for bit, at any batch."""
    rng = np.random.default_rng(seed)
    cost = CostModel(verify={4: [(4, 9.0), (8, 12.5), (16, 19.0), (64, 30.0)],
                             64: [(64, 40.0), (128, 60.0), (256, 90.0), (1024, 400.0)]},
                     draft={4: [(2, 1.0), (4, 1.5), (8, 2.5), (16, 4.5)], 64: [(2, 5.0), (4, 7.0), (8, 12.0), (16, 30.0)]},
                     step_ms=0.7)
    n = int(rng.integers(2, 70))
    clock = [0.0]
    controllers = [LengthController(cost, block_size=16, clock=lambda: clock[0]) for _ in range(2)]
    states = [[c.new_sequence() for _ in range(n)] for c in controllers]
    for i in range(n):
        for _ in range(int(rng.integers(0, 30))):
            draft_len, matched = int(rng.integers(1, 16)), int(rng.integers(0, 20))
            accepted = int(rng.integers(0, draft_len + 1)) if rng.random() < 0.5 else min(draft_len, int(rng.geometric(0.4)) - 1)
            for c, seqs in zip(controllers, states):
                c.observe(seqs[i], draft_len, accepted, matched)
    decided = []
    for step in range(12):
        matched, lens = rng.integers(1, 4, size=n).tolist(), rng.integers(0, 16, size=n).tolist()
        caps = rng.integers(0, 16, size=n).tolist()
        batch, others = n + int(rng.integers(0, 10)), int(rng.integers(0, 50))
        expected = None if step % 2 else float(rng.uniform(0, 40))
        out = []
        for rows, c, seqs in zip((10**9, 1), controllers, states):  # the Python path, then numpy's
            monkeypatch.setattr(policy, "VECTOR_ROWS", rows)
            rates = c.estimated_rates(seqs)
            out.append((c.prefers_copy(seqs, matched, lens, caps), c.copy_lengths(seqs, matched, lens, batch, others, expected),
                        c.choose_drafters(seqs, caps, batch, others, n, expected), rates.tolist(),
                        c.draft_lens(rates, caps, batch, others, n, expected), c.copy_rates(seqs, matched).tolist()))
        assert out[0] == out[1]
        decided.append(sum(out[0][1][0]) > 0)
        clock[0] += float(rng.uniform(0, 0.05))
    assert any(decided)  # copies were verified: the choices were not all empty
    flat = CostModel(verify={n: [(n, 10.0), (2 * n, 10.0), (16 * n, 10.0 + n)]}, draft={n: [(2, 1.0), (16, 2.0)]})
    for i in range(40):  # rounded rates and a flat stretch of the table: gains and rates tie
        rates = np.round(rng.uniform(0.0, 1.0, size=(n, 15)), int(rng.integers(0, 3))) * (i % 5 > 0)
        caps, sunk = rng.integers(0, 16, size=n).tolist(), float(rng.uniform(0, 2))
        chosen = []
        for rows in (10**9, 1):
            monkeypatch.setattr(policy, "VECTOR_ROWS", rows)
            chosen.append((choose_lengths(rates, caps, flat, n, i % 3, draft_ms=0.5 * (i % 2), sunk_ms=sunk),
                           LengthController(flat, block_size=16)._plan(rates, caps, n, i % 3, n, None)))
        assert chosen[0] == chosen[1]


def test_the_block_search_chooses_as_choose_lengths_does_for_each_block_length():
    """Under load the block length is searched with one sort for every length (a plan per step must cost far less
    than the step): it must pick exactly what `choose_lengths` per length picks, ties, unequal caps and the load
    of others included, drafting or not."""
    rng = np.random.default_rng(11)
    cost = CostModel(verify={4: [(4, 9.0), (8, 12.5), (16, 19.0), (64, 30.0)],
                             16: [(16, 14.0), (32, 20.0), (64, 31.0), (65, 36.0), (256, 90.0)]},
                     draft={4: [(2, 1.0), (4, 1.5), (8, 2.5), (16, 4.5)], 16: [(2, 2.0), (4, 3.5), (8, 6.5), (16, 12.0)]})
    controller = LengthController(cost, block_size=16)
    outcomes = set()
    for i in range(600):
        n = 1 if i % 5 == 0 else int(rng.integers(2, 20))
        rates = rng.uniform(0.0, 1.0, size=(n, 15)) ** float(rng.uniform(0.05, 2))
        if i % 3 == 0:
            rates = np.round(rates, 1)  # ties
        caps = rng.integers(0, 16, size=n).tolist()
        cost.step_ms = float(rng.uniform(0, 3))
        batch, others, drafting = n + int(rng.integers(0, 12)), int(rng.integers(0, 40)), int(rng.integers(1, 24))
        expected = None if i % 2 else float(rng.uniform(0, 30))
        best_rate, best = 0.0, None
        for length in block_lengths(16):
            ks, rate = choose_lengths(rates, [min(c, length - 1) for c in caps], cost, batch, others,
                                      draft_ms=cost.draft_ms(drafting, length), other_expected=expected)
            if any(ks) and rate > best_rate:
                best_rate, best = rate, length
        for rows in (rates, rates.tolist()):
            assert controller._plan(rows, caps, batch, others, drafting, expected) == (best is not None, best or 2)
        outcomes.add((best, n == 1))
    assert outcomes == {(b, alone) for b in (None, 2, 4, 8, 16) for alone in (False, True)}  # every answer was met


def test_the_cost_table_is_timed_in_rounds_over_all_its_points_quickest_first(monkeypatch):
    """A slow spell of the machine must land on every point alike, not bend the table's shape: after one warm-up
    pass, each round runs every point once. A run right after a slow one runs slow (after a forward of 64 sequences,
    one sequence's next few took up to twice their time), so each round runs from the quickest point to the slowest,
    after ROUND_LEAD_IN untimed runs of the quickest, and every point is timed at its own cost."""
    own = {"big": 10.0, "small": 1.0, "mid": 6.0}
    now, calls = [0.0], []

    def point(name: str) -> Callable[[], None]:
        def run() -> None:
            after_big = bool(calls) and calls[-1] == "big" and name != "big"
            now[0] += (own[name] + 3.0 * after_big) / 1000
            calls.append(name)
        return run

    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    assert typical_ms([point(n) for n in own], 4, CPU) == pytest.approx(list(own.values()))
    assert calls[len(own):] == (["small"] * ROUND_LEAD_IN + ["small", "mid", "big"]) * 4


def test_the_table_read_for_one_total_equals_the_read_for_many():
    rng = np.random.default_rng(5)
    for _ in range(200):
        xs = np.sort(rng.choice(np.arange(1, 200), size=int(rng.integers(1, 7)), replace=False)).tolist()
        cost = CostModel(verify={4: list(zip(xs, np.sort(rng.uniform(1, 50, size=len(xs))).tolist()))})
        for total in [0.5, *xs, *rng.uniform(0, 260, size=20).tolist()]:
            assert cost._at_scalar(4, total) == float(cost._at(4, np.asarray(total, dtype=float)))


def test_the_table_read_for_whole_totals_equals_the_interpolated_read():
    """The planner's reads of whole numbers of tokens come from a curve worked out once per batch size; it grows
    when a read goes past it, and gives what interpolating each read gives, bit for bit."""
    rng = np.random.default_rng(6)
    for _ in range(50):
        sizes = sorted(rng.choice([1, 2, 4, 8, 16, 32], size=int(rng.integers(1, 4)), replace=False).tolist())
        cost = CostModel(verify={b: [(b * t, float(ms)) for t, ms in zip((1, 2, 4, 8, 16),
                                                                      np.sort(rng.uniform(1, 50, size=5)))]
                                 for b in sizes}, verify_scale=float(rng.uniform(0.5, 2)))
        for batch in rng.integers(1, 40, size=4).tolist():
            for top in (10, 100, 600):
                totals = np.sort(rng.integers(0, top, size=30))
                expected = cost._table_verify_ms(batch, totals.astype(float)) * cost.verify_scale
                assert np.array_equal(cost.verify_ms(batch, totals), expected)


@pytest.mark.parametrize("block_size", [8, 16])
def test_ratio_to_rates_solves_the_geometric_sum(block_size):
    ratios = torch.tensor([1.0 / block_size, 0.15, 0.25, 0.5, 0.75, 0.9])
    rates = ratio_to_rates(ratios, block_size)
    assert rates.shape == (len(ratios), block_size - 1)
    assert np.all(rates == rates[:, :1])  # one constant rate per sequence
    alpha = rates[:, 0]
    assert np.all((alpha >= 0) & (alpha <= 1))
    powers = np.arange(1, block_size)
    for a, r in zip(alpha, ratios.tolist()):
        assert (a ** powers).sum() == pytest.approx(r * block_size - 1, abs=1e-3)
    assert np.all(np.diff(alpha) > 0)  # higher ratio, higher rate
    # The extremes: nothing accepted -> 0, everything accepted -> 1.
    ends = ratio_to_rates(torch.tensor([0.0, 1.0]), block_size)[:, 0]
    assert ends[0] == pytest.approx(0.0, abs=1e-6) and ends[1] == pytest.approx(1.0, abs=1e-3)


def test_published_length():
    """round(ratio x B x 1.3) block positions, the anchor among them, within [1, B]: one fewer draft tokens."""
    assert published_length(0.0, 16, 15) == 0  # the anchor alone: a plain step
    assert published_length(0.01, 16, 15) == 0
    assert published_length(0.2, 16, 15) == 3  # round(4.16) - 1
    assert published_length(0.3, 16, 15) == 5  # round(6.24) - 1
    assert published_length(0.5, 16, 15) == 9  # round(10.4) - 1
    assert published_length(0.5, 16, 7) == 7  # capped
    assert published_length(1.0, 16, 15) == 15  # round(20.8) capped at the block, minus the anchor
    assert published_length(0.5, 8, 7) == 4  # round(5.2) - 1


def test_probes_back_off_while_drafting_does_not_pay():
    """Each probe costs a drafter forward: while drafting does not pay they come ever more rarely,
    whatever they find; once the estimates say drafting pays, every sequence drafts and the
    interval starts over."""
    clock = itertools.count(step=1000.0)  # seconds between calls: probes never wait for their time share
    controller = LengthController(fixed_costs(), block_size=16, prior_weight=4.0, probe_every=4,
                                  clock=lambda: next(clock))
    seq = controller.new_sequence()
    for _ in range(40):  # hopeless history: plain decoding is the better choice from here on
        controller.observe(seq, draft_len=3, accepted=0)

    def steps_until_probe() -> int:
        n = 0
        while not controller.choose_drafters([seq], [15], batch=16, other_tokens=15, n_drafting=1)[0][0]:
            n += 1
        return n

    assert [steps_until_probe() for _ in range(4)] == [4, 8, 16, 32]
    controller.observe(seq, 3, 3)  # a probe that finds text does not by itself bring probes back
    assert steps_until_probe() == 64
    for _ in range(200):
        controller.observe(seq, draft_len=15, accepted=15)
    assert controller.choose_drafters([seq], [15], batch=16, other_tokens=15, n_drafting=1)[0] == [True]
    assert seq.probe_interval == 4


def test_under_load_a_short_block_pays_where_a_full_one_does_not():
    """The drafter's cost grows with the block. Sequences whose first 3 draft tokens are always
    accepted and the 4th never: with a costly drafter a 4-position block pays while the full block
    does not; with a free drafter and every position accepted, the full block is the plan."""
    def cost(draft_ms_per_position: float) -> CostModel:
        return CostModel(verify={8: [(8, 10.0), (128, 10.0 + 120 * 0.1)]},
                         draft={8: [(n, draft_ms_per_position * n) for n in (2, 4, 8, 16)]})

    def plan(c: CostModel, accepted: int) -> tuple[bool, int]:
        controller = LengthController(c, block_size=16)
        seqs = [controller.new_sequence() for _ in range(8)]
        for s in seqs:
            for _ in range(50):
                s.stats.update(draft_len=15, accepted=accepted)
        chosen, length = controller.choose_drafters(seqs, [15] * 8, batch=8, other_tokens=0, n_drafting=8)
        return all(chosen), length

    assert plan(cost(0.0), accepted=15) == (True, 16)
    assert plan(cost(2.0), accepted=3) == (True, 4)
    rates = np.tile(np.array([1.0, 1.0, 1.0] + [0.0] * 12), (8, 1))
    ks, _ = choose_lengths(rates, [15] * 8, cost(2.0), batch=8, other_tokens=0, draft_ms=cost(2.0).draft_ms(8, 16))
    assert ks == [0] * 8  # the full block's draft costs more than its tokens save


def test_live_timings_rescale_the_cost_table():
    """The table is measured once on short idle caches; live forwards at longer contexts cost more.
    Timed forwards pull the predictions toward what they measure, and one stall cannot swing them."""
    cost = CostModel(verify={4: [(4, 10.0), (64, 40.0)]}, draft={4: [(2, 4.0), (16, 8.0)]})
    for _ in range(200):
        cost.observe_verify(4, 4, 20.0)
        cost.observe_draft(4, 16, 4.0)
    assert cost.verify_ms(4, 4) == pytest.approx(20.0, rel=0.01)
    assert cost.verify_ms(4, 64) == pytest.approx(80.0, rel=0.01)
    assert cost.draft_ms(4, 2) == pytest.approx(2.0, rel=0.01)
    before = cost.scales
    cost.observe_verify(4, 4, 10_000.0)
    assert cost.verify_ms(4, 4) < 20.0 * 1.1
    assert cost.scales != before  # rounded scales change, so reused decisions are taken again
    for _ in range(500):
        cost.observe_verify(4, 4, 10_000.0)
    assert cost.verify_ms(4, 4) == pytest.approx(40.0)  # bounded at 4x the table


def test_a_scale_hovering_about_a_step_s_edge_keeps_its_rounded_figure():
    """Decisions are reused while the rounded scales stay (`CostModel.scales`): a live scale wandering about the edge
    between two 5% steps keeps its figure, and one that moves past the hold takes a new one."""
    cost = CostModel(verify={1: [(1, 1.0), (16, 2.0)]}, draft={1: [(2, 1.0), (16, 2.0)]})
    figures = []
    for steps in (2.4, 2.6, 2.4, 2.8, 2.4, 2.3, 2.2, 2.7):
        cost.verify_scale = 1.05**steps
        figures.append(cost.scales[0])
    assert figures == [2, 2, 2, 3, 3, 3, 2, 2]


def test_the_steps_time_outside_its_forwards_makes_long_verifies_relatively_cheaper():
    """A step pays planning and commits (and, served, transport) whatever it verifies. Seen on this CPU: a plain
    step took 12 ms and a 16-token one 22, where the forwards alone were 8.7 and 18.3: judged on the forwards
    alone, a second token costs 36% more, which a copy whose first token is right one time in five does not
    repay."""
    cost = CostModel(verify={1: [(1, 8.7), (2, 11.8), (4, 13.4), (8, 15.3), (16, 18.3)]})
    rates = np.array([[0.2] + [0.75] * 14])
    assert choose_lengths(rates, [15], cost, batch=1, other_tokens=0, draft_ms=0.0)[0] == [0]
    for _ in range(100):
        cost.observe_step(4.0)
    assert cost.step_ms == pytest.approx(4.0)
    assert choose_lengths(rates, [15], cost, batch=1, other_tokens=0, draft_ms=0.0)[0][0] > 0
    cost.observe_step(1000.0)  # one stall moves it a little
    assert cost.step_ms < 4.0 * 1.1


def test_the_engine_learns_its_steps_time_outside_the_forwards(trained_tiny):
    engine = Engine(trained_tiny.target, trained_tiny.drafter, num_slots=2, max_len=128,
                    cost_model=fixed_costs(2), plan_gate=False)
    assert engine.cost.step_ms == 0.0
    engine.generate([Request([1, 2, 3, 4], 24, mode="adaflash"), Request([5, 6, 7], 24, mode="adaflash")])
    assert 0.0 < engine.cost.step_ms < 1000.0


def test_copies_are_preferred_when_they_do_as_well_and_probed_when_they_do_not_pay():
    """A copy of the context needs no drafter forward, so it is taken whenever it is expected to commit
    as many tokens as a draft; copies that never pay are still verified whole every `probe_every` steps.
    Estimates are kept per n-gram length matched: a 3-gram match copies far better than a 1-gram one."""
    clock = itertools.count(step=1000.0)  # seconds between calls: probes never wait for their time share
    controller = LengthController(fixed_costs(), block_size=16, probe_every=4, clock=lambda: next(clock))
    seq = controller.new_sequence()
    for _ in range(50):
        seq.stats.update(draft_len=15, accepted=0)
    assert controller.prefers_copy([seq], [1], [15], [15]) == [True]  # untried copies against a drafter that never hits
    for _ in range(50):
        seq.stats.update(draft_len=15, accepted=6)
        controller.observe(seq, 15, 0, matched=1)
        controller.observe(seq, 15, 15, matched=3)
    seq.skipped = 0
    assert controller.prefers_copy([seq, seq], [1, 3], [15, 15], [15, 15]) == [False, True]
    seq.skipped = seq.probe_interval  # due for a drafter probe: drafts even where a copy looks better
    assert controller.prefers_copy([seq], [3], [15], [15]) == [False]
    assert [controller.copy_lengths([seq], [1], [15], batch=16, other_tokens=15)[0][0] for _ in range(8)] == [0, 0, 0, 15] * 2
    assert controller.copy_lengths([seq], [3], [15], batch=16, other_tokens=15)[0] == [15]
    fresh = controller.new_sequence()  # the other sequences' copies are its prior
    assert controller.copy_lengths([fresh, fresh], [3, 1], [15, 15], batch=16, other_tokens=14)[0] == [15, 0]


def test_copies_verified_whole_past_the_cut_keep_to_the_probe_share_too():
    """A copy cut short for `probe_every` steps is verified whole: a probe of the positions past the cut. Under load
    a batch's sequences come due in turn, and seen at c=32 on HumanEval (round 8) about four whole copies a step
    took a batch of 32 from 32 to ~66 verified tokens; so they share the probes' time budget, and due ones wait."""
    now = [0.0]
    controller = LengthController(fixed_costs(), block_size=16, probe_every=2, probe_share=0.1, clock=lambda: now[0])
    seqs = [controller.new_sequence() for _ in range(2)]
    for s in seqs:
        for _ in range(40):
            controller.observe(s, draft_len=15, accepted=0, matched=1)

    def lengths() -> list[int]:
        return controller.copy_lengths(seqs, [1, 1], [15, 15], batch=32, other_tokens=30)[0]

    assert lengths() == [0, 0] and lengths() == [15, 15]  # due on the second cut: both probe in one step
    cost = fixed_costs()
    window = (cost.verify_ms(32, 62) - cost.verify_ms(32, 32)) / 1000 / 0.1
    for _ in range(3):
        now[0] += window / 10
        assert lengths() == [0, 0]  # due again, but the budget is spent
    now[0] += window
    assert lengths() == [15, 15]


def probing_controller(n: int, clock: Callable[[], float]) -> tuple[LengthController, list[PolicyState]]:
    """A controller (probes every 4 steps, a tenth of the time) and `n` sequences whose drafts were never accepted:
    drafting does not pay, so they draft only as probes."""
    controller = LengthController(fixed_costs(), block_size=16, probe_every=4, probe_share=0.1, clock=clock)
    seqs = [controller.new_sequence() for _ in range(n)]
    for s in seqs:
        for _ in range(40):
            controller.observe(s, draft_len=3, accepted=0)
    return controller, seqs


def test_probes_keep_to_their_share_of_the_time():
    """Under load every sequence's probe schedule together would cost a drafter forward every step;
    probes run only while they stay within `probe_share` of the time, and due ones wait to go together."""
    now = [0.0]
    controller, seqs = probing_controller(3, lambda: now[0])
    seqs[0].skipped, seqs[1].skipped = 4, 1

    def choose() -> list[bool]:
        return controller.choose_drafters(seqs, [15] * 3, batch=16, other_tokens=13, n_drafting=3)[0]

    assert choose() == [True, False, False]
    cost = fixed_costs()  # one 2-position draft and a verified token more, at 10% of the time
    window = (cost.draft_ms(1, 2) + cost.verify_ms(16, 17) - cost.verify_ms(16, 16)) / 1000 / 0.1
    for _ in range(5):
        now[0] += window / 10
        assert choose() == [False, False, False]
    assert seqs[1].skipped > seqs[1].probe_interval and seqs[2].skipped > seqs[2].probe_interval
    now[0] += window
    assert choose() == [False, True, True]  # the two that waited probe in one forward


def test_one_early_miss_past_the_first_token_does_not_stop_long_copies():
    """A copy position is tried only when a copy is verified past it. On a cost curve like this CPU's (a second
    token costs 40% more, four to sixteen cost about the same), one early miss at position 2 made the estimates
    say 'verify one token' for good: seen in the default models' multilingual runs, copies of 3-gram matches
    stayed at one token while prompt lookup committed 5 per step. A copy cut short is verified whole within
    `probe_every` steps, so the position is tried again and learnt; a position tried often and missed stays cut
    between those probes."""
    cost = CostModel(verify={1: [(1, 7.0), (2, 10.0), (4, 16.0), (8, 16.0), (16, 16.5)]})
    clock = itertools.count(step=1000.0)  # seconds between calls: probes never wait for their time share
    controller = LengthController(cost, block_size=16, probe_every=4, clock=lambda: next(clock))
    seq = controller.new_sequence()
    for _ in range(19):
        controller.observe(seq, draft_len=1, accepted=1, matched=3)
    controller.observe(seq, draft_len=2, accepted=1, matched=3)  # the one try of position 2: missed
    ks = [controller.copy_lengths([seq], [3], [15], batch=1, other_tokens=0)[0][0] for _ in range(4)]
    assert ks == [1, 1, 1, 15]
    for _ in range(3):
        controller.observe(seq, draft_len=15, accepted=15, matched=3)  # the whole copies were right
    assert controller.copy_lengths([seq], [3], [15], batch=1, other_tokens=0)[0] == [15]
    for _ in range(200):
        controller.observe(seq, draft_len=15, accepted=1, matched=3)  # position 2 tried often, always missed
    ks = [controller.copy_lengths([seq], [3], [15], batch=1, other_tokens=0)[0][0] for _ in range(4)]
    assert sorted(ks) == [1, 1, 1, 15]


def test_copies_cut_short_are_verified_whole_every_probe_every_steps():
    """Seen on the default models' chat set: three early misses at a copy's 4th token cut every later copy to
    three tokens, so the 4th was never tried again and never learnt, while the copies so cut would have
    committed 5 to 15 tokens. A copy cut short counts toward a probe, which verifies it whole."""
    cost = CostModel(verify={1: [(1, 7.0), (2, 10.0), (4, 12.0), (8, 14.0), (16, 16.0)]})
    clock = itertools.count(step=1000.0)  # seconds between calls: probes never wait for their time share
    controller = LengthController(cost, block_size=16, probe_every=4, clock=lambda: next(clock))
    seq = controller.new_sequence()
    for _ in range(20):
        controller.observe(seq, draft_len=15, accepted=3, matched=3)
    ks = [controller.copy_lengths([seq], [3], [15], batch=1, other_tokens=0)[0][0] for _ in range(8)]
    assert ks == [3, 3, 3, 15] * 2
    ks = [controller.copy_lengths([seq], [3], [n], batch=1, other_tokens=0)[0][0] for n in (15, 15, 0, 15, 15)]
    assert ks == [3, 3, 0, 3, 15]  # a step with no copy on offer neither counts nor resets
    for _ in range(40):  # what the probes find: the text moved on, copies now run long
        controller.observe(seq, draft_len=15, accepted=15, matched=3)
    assert controller.copy_lengths([seq], [3], [15], batch=1, other_tokens=0)[0] == [15]


def test_a_short_match_takes_what_longer_matches_learnt_past_its_first_token():
    """Once a copy's first token is accepted it is in step with the text whatever matched, so positions that
    1-gram copies rarely reach take the estimates of the copies that do (here 3-gram ones), not their own
    first token's rate: with 1 in 3 first tokens right and long runs after, a 1-gram copy pays verified long."""
    cost = CostModel(verify={1: [(1, 7.0), (2, 10.0), (4, 12.0), (8, 14.0), (16, 16.0)]})
    controller = LengthController(cost, block_size=16)
    seq = controller.new_sequence()
    for i in range(30):
        controller.observe(seq, draft_len=1, accepted=int(i % 3 == 0), matched=1)
        controller.observe(seq, draft_len=15, accepted=15, matched=3)
    rates = controller.copy_rates([seq], [1])[0]
    assert rates[0] == pytest.approx(1 / 3, abs=0.05) and rates[1:].min() > 0.9
    assert controller.copy_lengths([seq], [1], [15], batch=1, other_tokens=0)[0] == [15]


def test_copies_behind_long_matches_are_learnt_apart_from_short_ones():
    """A copy's acceptance keeps rising with the tokens its lookup matched, far past 3 (seen on the default target's
    chat set at 32 sequences: 4.5 tokens of a 15-token copy accepted behind a 3-token match, 12.7 behind 16 or more),
    so the copy estimates keep matches of 4-7, 8-15 and 16 or more tokens apart: copies behind long matches are
    verified whole where those behind short ones are cut. Matches within a range share its estimates."""
    assert [copy_bucket(n) for n in (0, 1, 2, 3, 4, 7, 8, 15, 16, 40)] == [0, 1, 2, 3, 4, 4, 5, 5, 6, 6]
    cost = CostModel(verify={1: [(1, 7.0), (2, 10.0), (4, 12.0), (8, 14.0), (16, 16.0)]})
    controller = LengthController(cost, block_size=16)
    seq = controller.new_sequence()
    for _ in range(40):
        controller.observe(seq, draft_len=15, accepted=1, matched=3)
        controller.observe(seq, draft_len=15, accepted=15, matched=16)
    short, long, longer = controller.copy_rates([seq] * 3, [3, 16, 30])
    assert short[1] < 0.2 and long.min() > 0.9 and long.tolist() == longer.tolist()
    assert controller.copy_lengths([seq, seq], [3, 20], [15, 15], batch=2, other_tokens=0)[0] == [1, 15]
    assert controller.copy_rates([seq], [9])[0].tolist() == controller.copy_rates([seq], [15])[0].tolist()


def test_the_planner_copies_what_followed_the_longest_match_not_the_latest_short_one():
    """Prompt lookup (`ngram` mode) copies after the latest 3-token match; a cost-aware copy follows the longest
    match, up to `planner.COPY_MATCH` tokens, and is learnt under that length."""
    controller = LengthController(fixed_costs(), block_size=16)
    state = controller.new_sequence()
    for _ in range(20):
        controller.observe(state, draft_len=15, accepted=15, matched=COPY_MATCH)
    phrase = list(range(1, 21))
    tokens = phrase + [100, 101, 102] + [7, 8] + phrase[-3:] + [200, 201] + phrase
    plan = Planner(controller).plan([Candidate("s", MODES["adaflash"], tokens, 15, state, can_draft=False)])
    assert plan.proposals["s"][:3] == [100, 101, 102] and plan.copied["s"] == COPY_MATCH
    prompt_lookup = Planner(controller).plan([Candidate("s", MODES["ngram"], tokens, 15, state)])
    assert prompt_lookup.proposals["s"][:2] == [200, 201] and prompt_lookup.copied["s"] == 3


def test_a_probe_is_charged_its_verify_too():
    """On this CPU a second verified token costs half a drafter forward (7 -> 10 ms beside a 6 ms draft): a
    limiter that charged only the draft let probes take about twice their share at concurrency 1."""
    now = [0.0]
    cost = CostModel(verify={1: [(1, 7.0), (2, 10.0), (4, 16.0), (8, 16.0), (16, 16.5)]},
                     draft={1: [(2, 6.0), (4, 9.0), (8, 9.0), (16, 9.5)]})
    controller = LengthController(cost, block_size=16, probe_every=1, probe_share=0.1, clock=lambda: now[0])
    seq = controller.new_sequence()
    for _ in range(50):
        seq.stats.update(draft_len=15, accepted=0)  # drafting never pays: only probes draft

    def probes() -> bool:
        seq.skipped = seq.probe_interval = 1
        return controller.choose_drafters([seq], [15], batch=1, other_tokens=0, n_drafting=1)[0] == [True]

    assert probes()
    now[0] = 0.080  # past the draft's 60 ms at 10% of the time, within the probe's 90 ms
    assert not probes()
    now[0] = 0.095
    assert probes()


def test_a_probe_drafts_the_few_longest_waiting_due_sequences_and_the_others_probe_later():
    """A sequence's first draft projects its whole context for the drafter, so a probe of a whole batch under load
    cost a round's worth of steps; the estimates pool what a few find. At most PROBE_SEQUENCES due sequences probe
    in one forward, the longest waiting first; the others stay due for the next probe."""
    now = [0.0]
    controller, seqs = probing_controller(10, lambda: now[0])
    for i, s in enumerate(seqs):
        s.skipped = 4 + i % 5  # all due, some waiting longer

    def choose() -> list[bool]:
        return controller.choose_drafters(seqs, [15] * 10, batch=16, other_tokens=6, n_drafting=10)[0]

    first = choose()
    assert sum(first) == PROBE_SEQUENCES == 4
    assert {i for i, c in enumerate(first) if c} == {3, 4, 8, 9}  # the longest waiting (skipped 7 and 8)
    now[0] += 1000.0
    second = choose()
    assert sum(second) == 4 and not any(a and b for a, b in zip(first, second))


def test_drafter_probes_that_do_not_make_drafting_pay_come_ever_more_rarely_until_it_does():
    """Where the drafter never pays (multilingual at c=1, chat at c=8 on the default models) a fixed share of the
    time in probes was a fixed loss against the best fixed mode. Each probe halves the share left to the next,
    down to `PROBE_SHARE_FLOOR` of it; tokens a probe finds short of making drafting pay do not bring it back
    (a probe of many sequences nearly always finds some); once drafting pays the whole share returns."""
    now = [0.0]
    cost = CostModel(verify={1: [(1, 7.0), (2, 10.0), (4, 16.0), (8, 16.0), (16, 16.5)]},
                     draft={1: [(2, 6.0), (4, 9.0), (8, 9.0), (16, 9.5)]})
    controller = LengthController(cost, block_size=16, probe_every=1, probe_share=0.1, clock=lambda: now[0])
    hopeless, promising = controller.new_sequence(), controller.new_sequence()
    for _ in range(50):
        hopeless.stats.update(draft_len=15, accepted=0)
    for _ in range(60):
        promising.stats.update(draft_len=15, accepted=15)

    def drafts(seq: PolicyState, at: float) -> bool:
        now[0] = at
        seq.skipped = seq.probe_interval = 1
        return controller.choose_drafters([seq], [15], batch=1, other_tokens=0, n_drafting=1)[0] == [True]

    probe_s = 0.009  # a 2-position draft (6 ms) and a second verified token (3 ms)
    t = 0.0
    for share in [0.1, 0.05, 0.025, 0.0125, 0.1 * PROBE_SHARE_FLOOR, 0.1 * PROBE_SHARE_FLOOR]:
        assert drafts(hopeless, t)
        assert not drafts(hopeless, t + 0.99 * probe_s / share)
        t += probe_s / share
    for _ in range(64):
        controller.observe(controller.new_sequence(), draft_len=1, accepted=1)  # a probe of 64 found a token each
    assert drafts(hopeless, t)
    assert not drafts(hopeless, t + 0.99 * probe_s / (0.1 * PROBE_SHARE_FLOOR))
    t += probe_s / (0.1 * PROBE_SHARE_FLOOR)
    assert drafts(promising, t)  # drafting pays: the whole share is back
    assert drafts(hopeless, t + 0.001)
    assert not drafts(hopeless, t + 0.001 + 0.99 * probe_s / 0.1)
    assert drafts(hopeless, t + 0.001 + probe_s / 0.1)


@pytest.mark.parametrize("seed", range(6))
def test_one_sequence_is_planned_as_the_general_path_plans_it_beside_a_plain_one(seed):
    """A lone cost-aware sequence takes a shorter path through `Planner.plan` (`_plan_one`); beside a plain
    decoding sequence it takes the general one. With that sequence counted as the lone one's outside load, both must
    make the same plan, and leave the same counters, step after step, on counts, caps, copies and probes that vary."""
    rng = np.random.default_rng(seed)
    clock = [0.0]
    cost = CostModel(verify={b: [(b * k, 2.0 + 0.2 * b * k) for k in (1, 2, 4, 8, 16)] for b in (1, 2)},
                     draft={b: [(n, 0.2 + 0.05 * b * n) for n in (2, 4, 8, 16)] for b in (1, 2)})  # cuts, drafts may pay
    planners = [Planner(LengthController(cost, block_size=16, clock=lambda: clock[0])) for _ in range(2)]
    states = [p.controller.new_sequence() for p in planners]
    text = rng.integers(0, 6, size=40).tolist()  # a few token kinds: lookups match a few tokens, or not
    plans = []
    for step in range(60):
        draft_len, matched = int(rng.integers(1, 16)), int(rng.integers(0, 20))
        accepted = int(rng.integers(0, draft_len + 1))
        for p, s in zip(planners, states):
            p.controller.observe(s, draft_len, accepted, matched)
        tokens, cap, can_draft = text[: int(rng.integers(2, 41))], int(rng.integers(1, 16)), bool(rng.random() < 0.8)
        lone = Candidate("s", MODES["adaflash"], tokens, cap, states[0], can_draft)
        besides = [Candidate("s", MODES["adaflash"], tokens, cap, states[1], can_draft),
                   Candidate("plain", MODES["ar"], tokens, 0, planners[1].controller.new_sequence())]
        one, general = planners[0].plan([lone], Load(1, 1, 1.0, 0)), planners[1].plan(besides)
        assert (one.proposals["s"], one.copied, one.expected, one.block_length) == \
            (general.proposals["s"], general.copied, general.expected, general.block_length)
        assert [(d.key, d.cap, d.block_length, d.rates.tolist()) for d in one.drafts] == \
            [(d.key, d.cap, d.block_length, d.rates.tolist()) for d in general.drafts]
        assert (states[0].skipped, states[0].copy_skipped, states[0].probe_interval) == \
            (states[1].skipped, states[1].copy_skipped, states[1].probe_interval)
        plans.append("draft" if one.drafts else "copy" if one.copied else "none")
        clock[0] += float(rng.uniform(0, 0.05))
    assert len(set(plans)) > 1  # the steps did not all plan alike
