"""Metric updates gathered between flushes.

Why: a Python model's update of a Triton metric is a round trip to the server process, and the orchestrator
makes its updates on the step loop's thread between steps (with the target in its process). A finished request
touched about ten series and every model call one: at 32 sequences that was ~10% of the loop's time
(docs/results.md, round 15). Gathered, a series changed within an interval costs one update per flush.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable


class Tally:
    """Counter and gauge increments, and gauges' latest values, per series key, until `flush` writes them."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.increments: dict[Hashable, float] = {}
        self.values: dict[Hashable, float] = {}
        self.flushed_at = float("-inf")

    def add(self, series: Hashable, n: float) -> None:
        self.increments[series] = self.increments.get(series, 0.0) + n

    def set(self, series: Hashable, value: float) -> None:
        self.values[series] = value

    def due(self, now: float) -> bool:
        """Whether `interval_s` has passed since the last flush (a loop flushes then, and whenever it idles)."""
        return now - self.flushed_at >= self.interval_s

    def flush(self, increment: Callable[[Hashable, float], None], set_value: Callable[[Hashable, float], None],
              now: float) -> None:
        """Write what changed since the last flush: non-zero increments, then the gauges' values."""
        increments, values = self.increments, self.values
        self.increments, self.values, self.flushed_at = {}, {}, now
        for series, n in increments.items():
            if n:
                increment(series, n)
        for series, value in values.items():
            set_value(series, value)
