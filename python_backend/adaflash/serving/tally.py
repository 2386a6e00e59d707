"""Counter updates gathered between flushes.

Why: a Python model's update of a Triton metric is a round trip to the server process, and the orchestrator
makes its updates on the step loop's thread between steps (with the target in its process). A finished request
touched about ten series and every model call one: at 32 sequences that was ~10% of the loop's time
(docs/history.md, round 15). Gathered, a counter changed within an interval costs one update per flush. Gauges
are not gathered: a level read between two flushes would be stale, and +1 and -1 within one would write nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Tally:
    """Counter increments per series key, until `flush` writes them."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.increments: dict[Hashable, float] = {}
        self.flushed_at = float("-inf")

    def add(self, series: Hashable, n: float) -> None:
        self.increments[series] = self.increments.get(series, 0.0) + n

    def due(self, now: float) -> bool:
        """Whether `interval_s` has passed since the last flush (a loop flushes then, and whenever it idles)."""
        return now - self.flushed_at >= self.interval_s

    def flush(self, increment: Callable[[Hashable, float], None], now: float) -> None:
        """Write each series' sum since the last flush, in the order the series were first added to."""
        increments, self.increments, self.flushed_at = self.increments, {}, now
        for series, n in increments.items():
            if n:
                increment(series, n)
