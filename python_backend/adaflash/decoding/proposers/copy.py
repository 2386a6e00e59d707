"""The copy proposer: prompt lookup, a copy of what followed the context's latest earlier match of its last tokens.

Model-free, so its proposal is known while the step is planned: the planner looks it up (`lookup`), weighs it
against a draft and keeps it as the plan's proposal for the sequence (`Plan.proposals`). `ngram` proposes it
whole; adaflash looks further back (`COPY_MATCH`) and verifies what pays of it.
"""

from __future__ import annotations

MAX_N = 3  # prompt lookup's (`ngram` mode's) longest match
# Cost-aware copies look for matches of up to this many tokens: a copy behind a 16-token match is accepted whole far
# more often than one behind a 3-token match, and the copy estimates tell them apart (`policy.copy_bucket`;
# docs/history.md, engine speed rounds 35 and 36).
COPY_MATCH = 16


def lookup(tokens: list[int], k: int, max_n: int = MAX_N, min_n: int = 1) -> tuple[list[int], int]:
    """The up-to-k tokens that followed the latest earlier occurrence of the last n tokens, longest n first.

    When that occurrence overlaps the end of the sequence, the continuation runs out early;
    the match then says the text is periodic, so the proposal continues the period. Also returns
    the n matched (0: no proposal): a longer match is far likelier to be copied right.

    Runs every step for every copying sequence, right after the step's forward: it walks the earlier
    occurrences of the last token from the latest back (list.index over a reversed copy, in C), stops at the
    first that matches max_n tokens, and touches no numpy (its calls cost ~10x there, cold in the caches)."""
    top = min(max_n, len(tokens) - 1)
    if k <= 0 or top < min_n:
        return [], 0
    last, end_of_text = tokens[-1], len(tokens) - 1
    earlier = tokens[-2::-1]  # earlier[i] is tokens[end_of_text - 1 - i]
    latest = [-1] * (top + 1)  # latest[n]: the latest occurrence matching at least n tokens
    i = _find(earlier, last, 0)
    while i >= 0:
        end = end_of_text - 1 - i
        n = 1
        while n < top and end - n >= 0 and tokens[end - n] == tokens[end_of_text - n]:
            n += 1
        for m in range(n, 0, -1):
            if latest[m] >= 0:
                break
            latest[m] = end
        if n == top:
            break
        i = _find(earlier, last, i + 1)
    for n in range(top, min_n - 1, -1):
        if latest[n] >= 0:
            start = latest[n] + 1
            period = len(tokens) - start
            return [tokens[start + j % period] for j in range(k)], n
    return [], 0


def _find(items: list[int], value: int, start: int) -> int:
    try:
        return items.index(value, start)
    except ValueError:
        return -1
