"""How often a stream gets a response: every streamed response costs the server a fixed amount of CPU (Triton's
gRPC frontend, the orchestrator's detokenising and send) and the client some more, whatever it carries. Where
those cores are the ones the target computes on, one response per sequence per step takes them from the
forwards under load; a response carrying the tokens of several steps costs the same as one.

So a server paces its streams: a stream's responses at most every `stream_interval_s`, and all streams
together at most `max_responses_per_s`, shared equally. The first response (the time to first token) and the
final one are never held. The measurements behind the default are in docs/history.md.
"""

from __future__ import annotations

import os

AUTO = -1.0  # the `max_responses_per_s` setting that sizes the rate to the machine's cores
RESPONSES_PER_CORE_S = 25.0


def response_rate(setting: float, cores: int | None = None) -> float:
    """Responses per second for all streams together; 0 means no limit."""
    if setting != AUTO:
        return max(setting, 0.0)
    return RESPONSES_PER_CORE_S * (cores or len(os.sched_getaffinity(0)))


def response_gap(streams: int, interval_s: float, rate: float) -> float:
    """Seconds between two responses of one of `streams` open streams."""
    return interval_s if rate <= 0 else max(interval_s, streams / rate)
