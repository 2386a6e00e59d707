"""The orchestrator's Prometheus series, labelled by spec_mode, on Triton's metrics endpoint.

Transport-free: built with the metric family class of the server it reports to (Triton's
`pb_utils.MetricFamily`: `MetricFamily(name, description, kind)`, `.Metric(labels=..., buckets=...)`, kinds
COUNTER, GAUGE, HISTOGRAM). A family must outlive its series: both are kept. Counters are gathered in a `Tally`
and written by `flush` (each write is a round trip to the server process); gauges are written as they change (a
level read between two flushes must be the level, and a tally of +1 and -1 writes nothing).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable
from typing import Any

from adaflash.decoding.sequence import Sequence
from adaflash.serving.tally import Tally

WAIT_BUCKETS = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
FLUSH_S = 0.25  # counters reach the server at most this late


def _key(family: str, labels: dict[str, str]) -> tuple[str, tuple]:
    """A series' key: its family's attribute name and its labels in order."""
    return family, tuple(sorted(labels.items()))


class Metrics:
    def __init__(self, family: Any) -> None:
        fam = family
        self.requests = fam("adaflash_requests_total", "Finished generation requests", fam.COUNTER)
        self.tokens = fam("adaflash_tokens_total", "Tokens committed to outputs", fam.COUNTER)
        self.forwards = fam("adaflash_target_forwards_total", "Target forward passes (prefill and verify)", fam.COUNTER)
        self.active = fam("adaflash_active_sequences", "Sequences being generated", fam.GAUGE)
        # Per verify step, counted by value (at most one update per value a request met, not one per step: each
        # update is a round trip to the server process, and per-step histograms took the step loop's time).
        self.steps_by_accepted = fam("adaflash_verify_steps_total",
                                     "Verify steps, by the draft tokens they accepted (accepted)", fam.COUNTER)
        self.steps_by_draft_len = fam("adaflash_verify_steps_by_draft_len_total",
                                      "Verify steps, by the draft tokens they verified (draft_len)", fam.COUNTER)
        self.accepted = fam("adaflash_accepted_tokens_total", "Accepted draft tokens", fam.COUNTER)
        self.drafted = fam("adaflash_verified_draft_tokens_total", "Draft tokens sent to verification", fam.COUNTER)
        self.queued = fam("adaflash_queued_requests", "Requests waiting for a sequence slot", fam.GAUGE)
        self.queue_wait_family = fam("adaflash_queue_wait_seconds", "Time admitted requests waited for a sequence slot",
                                     fam.HISTOGRAM)
        self.queue_wait = self.queue_wait_family.Metric(labels={}, buckets=WAIT_BUCKETS)
        # The mean sequences per call is their ratio (a histogram's every observation would be a round trip).
        self.calls = fam("adaflash_model_calls_total", "Calls to the target and drafter models", fam.COUNTER)
        self.call_sequences = fam("adaflash_model_call_sequences_total",
                                  "Sequences the calls to the target and drafter models carried", fam.COUNTER)
        self._series: dict[Hashable, Any] = {}
        self.tally = Tally(FLUSH_S)
        self.series("queued")  # 0 from the start

    def series(self, family: str, **labels: str) -> Any:
        """`family`: the attribute naming it."""
        return self._series_of(_key(family, labels))

    def _series_of(self, key: tuple[str, tuple]) -> Any:
        if key not in self._series:
            family, labels = key
            self._series[key] = getattr(self, family).Metric(labels=dict(labels))
        return self._series[key]

    def _add(self, family: str, n: float, **labels: str) -> None:
        self.tally.add(_key(family, labels), n)

    def flush(self, when_due: bool = False) -> None:
        """Write the gathered updates; `when_due`: only when the last flush is FLUSH_S old."""
        now = time.monotonic()
        if not when_due or self.tally.due(now):
            self.tally.flush(lambda key, n: self._series_of(key).increment(n), now)

    def queued_now(self, n: int) -> None:
        self.series("queued").set(n)

    def waited(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def started(self, seq: Sequence) -> None:
        self.series("active", spec_mode=seq.request.mode.name).increment(1)

    def finished(self, seq: Sequence) -> None:
        mode = seq.request.mode.name
        self.series("active", spec_mode=mode).increment(-1)
        if seq.finish_reason == "error":
            return
        self._add("requests", 1, spec_mode=mode, finish_reason=seq.finish_reason or "")
        self._add("tokens", len(seq.output), spec_mode=mode)
        self._add("forwards", 1 + len(seq.steps), spec_mode=mode)
        self._add("accepted", sum(s.accepted for s in seq.steps), spec_mode=mode)
        self._add("drafted", sum(s.draft_len for s in seq.steps), spec_mode=mode)
        for accepted, n in Counter(s.accepted for s in seq.steps).items():
            self._add("steps_by_accepted", n, spec_mode=mode, accepted=str(accepted))
        for draft_len, n in Counter(s.draft_len for s in seq.steps).items():
            self._add("steps_by_draft_len", n, spec_mode=mode, draft_len=str(draft_len))

    def called(self, model: str, op: str, sequences: int) -> None:
        self._add("calls", 1, model=model, op=op)
        self._add("call_sequences", sequences, model=model, op=op)
