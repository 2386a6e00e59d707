"""Prompt lookup proposals: longest n-gram first, latest occurrence, periodic continuation, at most k tokens."""

from __future__ import annotations

import random

import pytest

from adaflash.decoding.proposers.copy import lookup


def reference_propose(tokens: list[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """The docstring, spelled out with plain loops."""
    if k <= 0:
        return []
    for n in range(max_n, min_n - 1, -1):
        if n > len(tokens) - 1:
            continue
        suffix = tokens[-n:]
        for i in range(len(tokens) - n - 1, -1, -1):  # occurrences starting before the suffix itself, latest first
            if tokens[i : i + n] == suffix:
                start = i + n
                out = list(tokens[start:])[:k]
                while len(out) < k:  # the copy ran into the end: the text repeats with this period
                    out.append(out[len(out) - (len(tokens) - start)])
                return out
    return []


def test_longest_ngram_first():
    # 3-gram [1, 2, 3] occurred at the start (followed by 9); the 1-gram [3] occurred later (followed by 7).
    tokens = [1, 2, 3, 9, 3, 7, 1, 2, 3]
    assert lookup(tokens, 3)[0] == [9, 3, 7]
    assert lookup(tokens, 3, max_n=1)[0] == [7, 1, 2]


def test_latest_occurrence_wins():
    tokens = [4, 1, 5, 4, 1, 6, 4, 1]
    assert lookup(tokens, 2)[0] == [6, 4]
    assert lookup(tokens, 3)[0] == [6, 4, 1]


def test_no_match_and_k_zero():
    assert lookup([1, 2, 3, 4], 5)[0] == []
    assert lookup([7], 4)[0] == []
    assert lookup([1, 2, 1, 2], 0)[0] == []
    assert lookup([1, 2, 1, 2], -3)[0] == []
    # Only a 1-gram matches; with min_n=2 there is no proposal.
    assert lookup([5, 6, 7, 5], 3)[0] == [6, 7, 5]
    assert lookup([5, 6, 7, 5], 3, min_n=2)[0] == []


def test_periodic_continuation():
    # [1, 2] occurred at index 1; what follows it is [1, 2] and then the end: period 2 continues.
    assert lookup([5, 1, 2, 1, 2], 4)[0] == [1, 2, 1, 2]
    assert lookup([5, 1, 2, 1, 2], 7)[0] == [1, 2, 1, 2, 1, 2, 1]
    assert lookup([3, 3, 3, 3], 5)[0] == [3, 3, 3, 3, 3]
    assert lookup([8, 4, 4], 3)[0] == [4, 4, 4]
    # Period 3 after a 3-gram match: [a b c a b c] -> continues a b c ...
    assert lookup([0, 1, 2, 0, 1, 2], 5)[0] == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("seed", range(4))
def test_matches_reference_and_never_exceeds_k(seed):
    """Proposals and the n matched (the longest n with a proposal of its own) on random texts, frequent tokens
    and long ones included."""
    rng = random.Random(seed)
    for _ in range(800):
        length = rng.randint(1, rng.choice([25, 60]))
        tokens = [rng.randint(0, rng.choice([2, 3, 6, 40])) for _ in range(length)]
        k = rng.randint(0, 16)
        max_n, min_n = rng.choice([1, 2, 3, 4, 16]), rng.choice([1, 1, 2])
        got, matched = lookup(tokens, k, max_n=max_n, min_n=min_n)
        assert len(got) <= k
        assert all(isinstance(t, int) and t in tokens for t in got)
        assert got == reference_propose(tokens, k, max_n=max_n, min_n=min_n), (tokens, k, max_n)
        assert matched == next((n for n in range(max_n, min_n - 1, -1) if reference_propose(tokens, k, n, n)), 0)

