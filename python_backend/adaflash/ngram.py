"""Prompt lookup decoding: the model-free baseline drafter."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose(tokens: list[int], k: int, max_n: int = 3, min_n: int = 1) -> list[int]:
    """The up-to-k tokens that followed the latest earlier occurrence of the last n tokens, longest n first.

    When that occurrence overlaps the end of the sequence, the continuation runs out early;
    the match then says the text is periodic, so the proposal continues the period.
    """
    if k <= 0:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_n, len(arr) - 1), min_n - 1, -1):
        windows = sliding_window_view(arr[:-1], n)  # window i ends before the last token, so i + n is in range
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            period = len(arr) - start
            return [int(arr[start + j % period]) for j in range(k)]
    return []
