"""Admission: at most `max_active` requests generate at once; the next ones wait their turn, bounded.

A burst above capacity should cost latency, not errors, as in TensorRT-LLM's and vLLM's
schedulers; but an unbounded queue only turns overload into timeouts everywhere, so the queue
has a size and a longest wait, and a request past either is refused with a message naming the
limit. Transport-free (asyncio only): the orchestrator awaits `enter` before a request runs.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class AdmissionRefused(RuntimeError):
    """The queue is full or the wait too long; the message names the limit."""


class AdmissionCancelled(RuntimeError):
    """The client went away while its request waited."""


class Admission:
    """First come, first served: a freed slot goes to the oldest waiting request."""

    def __init__(self, max_active: int, max_queued: int, max_wait_s: float, poll_s: float = 0.05,
                 on_queue: Callable[[int], None] = lambda depth: None) -> None:
        self.max_active, self.max_queued, self.max_wait_s = max_active, max_queued, max_wait_s
        self.poll_s = poll_s  # how often a waiting request checks whether its client left
        self.on_queue = on_queue  # told the queue's depth whenever it changes (a metrics gauge)
        self.active = 0
        self.waiting: deque[asyncio.Future] = deque()

    @property
    def queued(self) -> int:
        return len(self.waiting)

    async def enter(self, cancelled: Callable[[], bool] = lambda: False) -> float:
        """Wait for a slot; returns the seconds waited. Raises AdmissionRefused past the queue's size or the
        longest wait, AdmissionCancelled when `cancelled()` turns true first; either way nothing is held."""
        if self.active < self.max_active and not self.waiting:
            self.active += 1
            return 0.0
        if len(self.waiting) >= self.max_queued:
            raise AdmissionRefused(f"queue full: {len(self.waiting)} requests waiting for one of {self.max_active} "
                                   f"sequence slots (max_queued {self.max_queued})")
        turn = asyncio.get_running_loop().create_future()
        self.waiting.append(turn)
        self.on_queue(len(self.waiting))
        start = time.monotonic()
        try:
            while not turn.done():
                left = self.max_wait_s - (time.monotonic() - start)
                if left <= 0:
                    raise AdmissionRefused(f"no sequence slot free after waiting {self.max_wait_s:g} s in the queue "
                                           f"(max_queue_wait_s {self.max_wait_s:g})")
                if cancelled():
                    raise AdmissionCancelled("cancelled while queued")
                await asyncio.wait({turn}, timeout=min(self.poll_s, left))
        except BaseException:  # refused, cancelled, or the waiting task itself cancelled: hold nothing
            self._withdraw(turn)
            raise
        return time.monotonic() - start

    def _withdraw(self, turn: asyncio.Future) -> None:
        if turn.done():
            self.leave()  # the slot was handed over as the wait ended: pass it on
        else:
            self.waiting.remove(turn)
            self.on_queue(len(self.waiting))

    def leave(self) -> None:
        """Free a slot: the oldest waiting request takes it at once (it stays counted as active)."""
        if self.waiting:
            self.waiting.popleft().set_result(None)
            self.on_queue(len(self.waiting))
        else:
            self.active -= 1
