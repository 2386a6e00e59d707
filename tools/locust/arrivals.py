"""Open-loop arrivals for the Locust users: a Poisson process of requests at a chosen rate. Plain Python (no Locust,
no gevent), so tests import it.

Why not Locust's own pacing: `constant_throughput` and `constant_pacing` wait the rest of a fixed period after a task
ends, so a request slower than the period delays the next one (a closed loop with a floor), and neither draws
Poisson gaps; a LoadTestShape sets user counts, not arrival times. The locustfile keeps Locust's `wait_time`
mechanism but takes the gap from this schedule, and hands each request to a greenlet of its own, so arrivals never
wait for completions.
"""

from __future__ import annotations

import random


class PoissonArrivals:
    """Absolute arrival times at `rate` per second from `start`: exponential gaps, seeded. Times are absolute so
    that time lost by the client (scheduling, a slow spawn) does not lower the rate: a late arrival is followed by
    the next one on schedule, not a full gap later. The first arrival is at `start`."""

    def __init__(self, rate: float, start: float, seed: int | str | None = None) -> None:
        if rate <= 0:
            raise ValueError(f"request rate must be positive, got {rate}")
        self.rate = rate
        self.rng = random.Random(seed)
        self.next_time = start

    def advance(self) -> float:
        """The next arrival's time (after the one at `next_time`, which has been served)."""
        self.next_time += self.rng.expovariate(self.rate)
        return self.next_time

    def wait(self, now: float) -> float:
        """Seconds from `now` until the next arrival (0 when it is already due)."""
        return max(0.0, self.advance() - now)
