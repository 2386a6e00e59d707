"""Prompt lookup decoding: the model-free baseline drafter (and adaflash's copy proposals)."""

from __future__ import annotations

import numpy as np

MAX_N = 3


def lookup(tokens: list[int], k: int, max_n: int = MAX_N, min_n: int = 1) -> tuple[list[int], int]:
    """The up-to-k tokens that followed the latest earlier occurrence of the last n tokens, longest n first.

    When that occurrence overlaps the end of the sequence, the continuation runs out early;
    the match then says the text is periodic, so the proposal continues the period. Runs every
    step for every adaflash sequence, so it only extends the matches of the last token. Also returns
    the n matched (0: no proposal): a longer match is far likelier to be copied right.
    """
    if k <= 0:
        return [], 0
    arr = np.asarray(tokens, dtype=np.int64)
    ends = np.flatnonzero(arr[:-1] == arr[-1])  # earlier occurrences of the last token: 1-gram matches end here
    matched = np.ones(len(ends), dtype=bool)
    best = np.zeros(len(ends), dtype=np.int64)  # longest n (up to max_n) each occurrence matches
    for j in range(min(max_n, len(arr) - 1)):
        if j:
            back = ends - j
            matched &= back >= 0
            matched[matched] &= arr[back[matched]] == arr[-1 - j]
        best[matched] = j + 1
    for n in range(min(max_n, len(arr) - 1), min_n - 1, -1):
        hits = ends[best >= n]
        if hits.size:
            start = int(hits[-1]) + 1
            period = len(arr) - start
            return [int(arr[start + j % period]) for j in range(k)], n
    return [], 0
