"""Stream pacing: the response rate is shared by the open streams, never below the stream interval."""

from __future__ import annotations

from adaflash.serving.pacing import AUTO, RESPONSES_PER_CORE_S, response_gap, response_rate


def test_the_rate_is_shared_by_the_streams():
    assert response_gap(1, 0.0, 50.0) == 0.02
    assert response_gap(32, 0.0, 50.0) == 0.64  # more streams: each waits longer, the total rate stays
    assert response_gap(32, 1.0, 50.0) == 1.0  # the stream interval when it is the longer
    assert response_gap(64, 0.2, 0.0) == 0.2  # no rate limit: the interval alone
    assert response_gap(64, 0.0, 0.0) == 0.0  # a response per step


def test_the_automatic_rate_follows_the_cores():
    assert response_rate(AUTO, cores=2) == 2 * RESPONSES_PER_CORE_S
    assert response_rate(AUTO, cores=16) == 16 * RESPONSES_PER_CORE_S
    assert response_rate(AUTO) > 0
    assert response_rate(0.0) == 0.0 and response_rate(120.0) == 120.0
