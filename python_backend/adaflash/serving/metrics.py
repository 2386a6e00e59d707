"""The orchestrator's Prometheus series, labelled by spec_mode, on Triton's metrics endpoint.

Transport-free: built with the metric family class of the server it reports to (Triton's
`pb_utils.MetricFamily`: `MetricFamily(name, description, kind)`, `.Metric(labels=..., buckets=...)`, kinds
COUNTER, GAUGE, HISTOGRAM). A family must outlive its series: both are kept. Counters are gathered in a `Tally`
and written by `flush` (each write is a round trip to the server process); gauges are written as they change (a
level read between two flushes must be the level, and a tally of +1 and -1 writes nothing). A finished request's
latencies are a few histogram observations, made once from its timestamps (`request_latencies`), never one per
token or step. `CacheGauges` are a model's cache gauges, which its `slots.OccupancyReporter` writes from a thread.
The series, their vLLM and TensorRT-LLM counterparts and PromQL: docs/metrics.md.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable
from typing import Any

from adaflash.decoding.sequence import Sequence
from adaflash.serving.slots import CacheUsage
from adaflash.serving.tally import Tally

WAIT_BUCKETS = [0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
# vLLM's buckets, with finer ones below theirs where a small model or a speculative step is faster than they reach.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0]
E2E_BUCKETS = [0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
TOKEN_GAP_BUCKETS = [0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                     2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]
BUCKETS = {"ttft": TTFT_BUCKETS, "e2e": E2E_BUCKETS, "tpot": TOKEN_GAP_BUCKETS, "itl": TOKEN_GAP_BUCKETS}
COMPLETED = ("stop", "length")  # finish reasons whose latencies describe the server (not a client leaving)
FLUSH_S = 0.25  # counters reach the server at most this late


def request_latencies(seq: Sequence) -> dict[str, float]:
    """A finished request's observations, by histogram (`BUCKETS`' keys).

    Time to first token for every request whose first token was committed, however it ended (as vLLM observes it
    when the token comes; a client that left because it came late still counts); the others for completed requests
    only (a cancelled request's end is its client's choice). `tpot`: the mean gap per output token after the first;
    `itl`: the mean gap between its verify steps (each commits one or more tokens), so a per-request mean, not one
    observation per gap (each observation is a round trip to the server process).
    """
    if seq.first_token_at is None:
        return {}
    out = {"ttft": seq.first_token_at - seq.submitted_at}
    if seq.finish_reason not in COMPLETED or seq.finished_at is None:
        return out
    out["e2e"] = seq.finished_at - seq.submitted_at
    decoding = seq.finished_at - seq.first_token_at
    if len(seq.output) > 1:
        out["tpot"] = decoding / (len(seq.output) - 1)
    if seq.steps:
        out["itl"] = decoding / len(seq.steps)
    return out


def _key(family: str, labels: dict[str, str]) -> tuple[str, tuple]:
    """A series' key: its family's attribute name and its labels in order."""
    return family, tuple(sorted(labels.items()))


class Metrics:
    def __init__(self, family: Any) -> None:
        fam = family
        self.requests = fam("adaflash_requests_total", "Finished generation requests", fam.COUNTER)
        self.tokens = fam("adaflash_tokens_total", "Tokens committed to outputs", fam.COUNTER)
        self.prompt_tokens = fam("adaflash_prompt_tokens_total", "Prompt tokens of finished requests", fam.COUNTER)
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
        # Per request, from its timestamps (`request_latencies`); series per spec_mode, made as modes appear.
        self.ttft = fam("adaflash_time_to_first_token_seconds",
                        "Time from a request's arrival (its queue wait included) to its first committed token",
                        fam.HISTOGRAM)
        self.e2e = fam("adaflash_e2e_request_latency_seconds",
                       "Time from a completed request's arrival (its queue wait included) to its end", fam.HISTOGRAM)
        self.tpot = fam("adaflash_request_time_per_output_token_seconds",
                        "A completed request's mean time per output token after its first", fam.HISTOGRAM)
        self.itl = fam("adaflash_inter_token_latency_seconds",
                       "A completed request's mean time between its verify steps (one observation per request)",
                       fam.HISTOGRAM)
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
            buckets = {"buckets": BUCKETS[family]} if family in BUCKETS else {}
            self._series[key] = getattr(self, family).Metric(labels=dict(labels), **buckets)
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
        self._add("prompt_tokens", len(seq.request.prompt_ids), spec_mode=mode)
        self._add("forwards", 1 + len(seq.steps), spec_mode=mode)
        self._add("accepted", sum(s.accepted for s in seq.steps), spec_mode=mode)
        self._add("drafted", sum(s.draft_len for s in seq.steps), spec_mode=mode)
        for accepted, n in Counter(s.accepted for s in seq.steps).items():
            self._add("steps_by_accepted", n, spec_mode=mode, accepted=str(accepted))
        for draft_len, n in Counter(s.draft_len for s in seq.steps).items():
            self._add("steps_by_draft_len", n, spec_mode=mode, draft_len=str(draft_len))
        for family, seconds in request_latencies(seq).items():
            self.series(family, spec_mode=mode).observe(seconds)

    def called(self, model: str, op: str, sequences: int) -> None:
        self._add("calls", 1, model=model, op=op)
        self._add("call_sequences", sequences, model=model, op=op)


class CacheGauges:
    """One model's cache gauges (label `model`), in TensorRT-LLM's block terms and vLLM's usage fraction: the writer
    its `slots.OccupancyReporter` calls. Sets only the gauges whose value changed since the last write (each set
    is a round trip to the server process)."""

    # CacheUsage's field -> (attribute of the family, extra labels)
    GAUGES = {"open_slots": ("open_slots", {}),
              "max_blocks": ("blocks", {"kv_cache_block_type": "max"}),
              "free_blocks": ("blocks", {"kv_cache_block_type": "free"}),
              "used_blocks": ("blocks", {"kv_cache_block_type": "used"}),
              "tokens_per_block": ("blocks", {"kv_cache_block_type": "tokens_per"}),
              "used_bytes": ("bytes", {"kind": "used"}),
              "total_bytes": ("bytes", {"kind": "total"}),
              "usage": ("usage", {})}

    def __init__(self, family: Any, model: str) -> None:
        fam = family
        self.open_slots = fam("adaflash_open_slots", "Sequences holding a cache slot of the model", fam.GAUGE)
        self.blocks = fam("adaflash_kv_cache_blocks",
                          "Cache blocks (pages; unpaged: one of max_len positions per slot) by kv_cache_block_type: "
                          "max, free, used, and tokens_per (positions per block)", fam.GAUGE)
        self.bytes = fam("adaflash_kv_cache_bytes", "Cache memory by kind: used (blocks held), total (allocated)",
                         fam.GAUGE)
        self.usage = fam("adaflash_kv_cache_usage_perc", "Fraction of the cache's blocks held (0 to 1)", fam.GAUGE)
        self.series = {field: getattr(self, attr).Metric(labels={"model": model, **labels})
                       for field, (attr, labels) in self.GAUGES.items()}
        self.last: dict[str, float] = {}

    def write(self, usage: CacheUsage) -> None:
        for field, series in self.series.items():
            value = getattr(usage, field)
            if self.last.get(field) != value:
                series.set(value)
                self.last[field] = value
