"""Round 31's A/B records share this: runs of one cell's prompts taking turns, each timed, every output held to the
first run's; and a wrapper that adds a function's time to a tally."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from cells import MAX_TOKENS

from adaflash.decoding.engine import Engine
from adaflash.decoding.sequence import Request


def in_turn(sides: Sequence[str], round_: int) -> list[str]:
    """The sides of round `round_` in the order they run, reversed every other round (a steady drift cancels)."""
    return list(sides) if round_ % 2 == 0 else list(sides)[::-1]


class Runs:
    """Runs of `ids` at `concurrency`; `rate` times one and checks its outputs against the first run's."""

    def __init__(self, ids: list[list[int]], concurrency: int) -> None:
        self.ids, self.concurrency = ids, concurrency
        self.reference: list[list[int]] | None = None

    def rate(self, engine: Engine, mode: str) -> float:
        """Tokens per second of one run of every prompt in `mode`."""
        t0 = time.perf_counter()
        seqs = engine.generate([Request(i, MAX_TOKENS, mode=mode) for i in self.ids], concurrency=self.concurrency)
        rate = sum(len(s.output) for s in seqs) / (time.perf_counter() - t0)
        self.reference = self.reference or [s.output for s in seqs]
        assert [s.output for s in seqs] == self.reference, "an output differs"
        return rate


def timed(obj: object, name: str, label: str, tally: dict[str, float], coroutine: bool = False) -> None:
    """Replace `obj.name` by a wrapper that adds its seconds to `tally[label]`."""
    f: Callable = getattr(obj, name)
    if coroutine:
        async def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = await f(*args, **kwargs)
            tally[label] = tally.get(label, 0.0) + time.perf_counter() - t0
            return out
    else:
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = f(*args, **kwargs)
            tally[label] = tally.get(label, 0.0) + time.perf_counter() - t0
            return out
    setattr(obj, name, wrapper)
