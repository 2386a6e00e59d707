"""What the step loop calls to run the models (`Backend`), and how it times a step's calls (`StepClock`).

Transport-free: the engine's backend holds the models in this process (`engine.LocalBackend`); the Triton
orchestrator's calls the `target` and `drafter` models (`serving/remote.py`). The methods are coroutines because
the orchestrator's calls are remote; the engine's never suspend, so it drives a step with `run_now`.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from adaflash.decoding.sequence import Sequence
from adaflash.decoding.steps import StepResult, StopEarly
from adaflash.models import graphs

if TYPE_CHECKING:
    from adaflash.models.drafter import Draft

T = TypeVar("T")


@dataclass
class Timed(Generic[T]):
    value: T
    ms: float  # the forward's time where it ran (no transport): what the cost model learns from


class BackendError(RuntimeError):
    """A model behind the backend failed or did not answer. A failed target call ends its sequences with
    this message; a failed draft only stops its sequences drafting (their output does not change)."""


class Backend(Protocol):
    async def forward(self, prefill: list[Sequence], verify: list[Sequence], feeds: list[list[int]],
                      runs: list[int] | None = None, stop_early: StopEarly | None = None
                      ) -> Timed[tuple[list[StepResult], list[StepResult]]]:
        """One target call: prefill the new sequences (a cache slot each) and verify the others, feeds[i] =
        [anchor] + the draft tokens verify[i] verifies. The time is the verify forward's. `runs` (no new
        sequences, feeds [anchor]): plain decoding of runs[i] steps for verify[i] (`steps.decode_run`), fewer
        where the target can ask `stop_early` between them and it says so."""

    async def draft(self, seqs: list[Sequence], block_length: int) -> Timed[Draft]:
        """Draft a block after each anchor; appends (and clears) each sequence's `pending_context` first."""

    async def release(self, seqs: list[Sequence]) -> None:
        """Free what the models keep of finished sequences (at once, or with the models' next call)."""

    async def idle(self) -> None:
        """No sequence is left: whatever `release` still owes is freed now."""


def run_now(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (the engine's backend) to its end, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("the coroutine suspended: it needs an event loop")


class StepClock:
    """A step's times: its model forwards as their backends timed them, the whole call from the previous step's end
    (what the caller does between steps, a server's responses and checks, is paid per call too), and whether the
    step's times are its own (`alone`)."""

    def __init__(self) -> None:
        self.forwards_ms = 0.0
        self._started = self._mark = None
        self._recorded = graphs.recordings()

    def start(self) -> None:
        self._started, self.forwards_ms, self._recorded = time.perf_counter(), 0.0, graphs.recordings()

    def add(self, ms: float) -> None:
        self.forwards_ms += ms

    def alone(self) -> bool:
        """Whether no graph was recorded in this step so far (a first recording takes tens of times a replay's), so
        that the cost model, the gate and the overhead estimates may learn from its times."""
        return graphs.recordings() == self._recorded

    def call_ms(self) -> float:
        """From the previous step's end (this one's start, for the first) to now."""
        return (time.perf_counter() - (self._mark or self._started)) * 1000

    def stop(self) -> None:
        self._mark = time.perf_counter()
