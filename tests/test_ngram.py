"""Prompt lookup proposals: longest n-gram first, latest occurrence, periodic continuation, at most k tokens."""

from __future__ import annotations

import random

import pytest

from adaflash.decoding.ngram import propose


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
    assert propose(tokens, 3) == [9, 3, 7]
    assert propose(tokens, 3, max_n=1) == [7, 1, 2]


def test_latest_occurrence_wins():
    tokens = [4, 1, 5, 4, 1, 6, 4, 1]
    assert propose(tokens, 2) == [6, 4]
    assert propose(tokens, 3) == [6, 4, 1]


def test_no_match_and_k_zero():
    assert propose([1, 2, 3, 4], 5) == []
    assert propose([7], 4) == []
    assert propose([1, 2, 1, 2], 0) == []
    assert propose([1, 2, 1, 2], -3) == []
    # Only a 1-gram matches; with min_n=2 there is no proposal.
    assert propose([5, 6, 7, 5], 3) == [6, 7, 5]
    assert propose([5, 6, 7, 5], 3, min_n=2) == []


def test_periodic_continuation():
    # [1, 2] occurred at index 1; what follows it is [1, 2] and then the end: period 2 continues.
    assert propose([5, 1, 2, 1, 2], 4) == [1, 2, 1, 2]
    assert propose([5, 1, 2, 1, 2], 7) == [1, 2, 1, 2, 1, 2, 1]
    assert propose([3, 3, 3, 3], 5) == [3, 3, 3, 3, 3]
    assert propose([8, 4, 4], 3) == [4, 4, 4]
    # Period 3 after a 3-gram match: [a b c a b c] -> continues a b c ...
    assert propose([0, 1, 2, 0, 1, 2], 5) == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("seed", range(4))
def test_matches_reference_and_never_exceeds_k(seed):
    rng = random.Random(seed)
    for _ in range(400):
        length = rng.randint(1, 25)
        tokens = [rng.randint(0, rng.choice([2, 3, 6])) for _ in range(length)]
        k = rng.randint(0, 16)
        max_n = rng.randint(1, 4)
        got = propose(tokens, k, max_n=max_n)
        assert len(got) <= k
        assert all(isinstance(t, int) and t in tokens for t in got)
        assert got == reference_propose(tokens, k, max_n=max_n), (tokens, k, max_n)
