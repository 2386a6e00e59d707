"""The checks the reliability suite applies, each shown failing on the outcome it must catch (its short scale
against a real server: tests/integration/test_reliability_served.py)."""

from __future__ import annotations

import json
import math

from adaflash_tools import probes, reliability
from adaflash_tools.reliability import Malformed


def test_the_malformed_corpus_has_thirty_kinds_on_both_protocols():
    corpus = reliability.malformed_corpus(reliability.repository_config(reliability.SHORT))
    assert len({c.kind for c in corpus}) >= 30
    assert sum(c.grpc is not None for c in corpus) >= 30 and sum(c.http is not None for c in corpus) >= 30


def test_a_refusal_by_our_models_must_be_a_client_error_naming_the_field():
    case = Malformed("top_p 0", "top_p")
    row = reliability._malformed_row
    assert row(case, "http", True, 400, "INVALID_ARGUMENT: top_p: must be in (0, 1]")["passed"]
    assert not row(case, "http", True, 500, "INVALID_ARGUMENT: top_p: must be in (0, 1]")["passed"]
    assert not row(case, "grpc", True, None, "INVALID_ARGUMENT: temperature: bad")["passed"]
    assert not row(case, "http", False, 200, '{"text_output": "accepted"}')["passed"]
    assert row(case, "http", True, 500, "Unable to parse 'data'")["refused_by"] == "triton"


def test_ready_while_failing_counts_failures_the_server_said_it_was_ready_for():
    polls = [(0.0, True), (1.0, True), (2.0, False), (5.0, False), (6.0, True), (9.0, True)]
    assert probes.ready_while_failing_s(polls, [0.5, 1.9, 3.0], since=0.5) == 1.4
    assert probes.ready_while_failing_s(polls, [3.0, 4.0], since=0.0) == 0.0
    assert probes.ready_while_failing_s(polls, [8.0], since=0.0) == 2.0


def test_ready_while_failing_equals_walking_back_through_the_polls():
    """The linear-time version against the plain reading of its definition, on random runs of readiness."""
    import random

    def walking_back(polls, failures, since):
        longest = 0.0
        for t in failures:
            before = [(pt, ok) for pt, ok in polls if pt <= t]
            if not before or not before[-1][1]:
                continue
            start = since
            for pt, ok in reversed(before):
                if not ok:
                    break
                start = max(pt, since)
            longest = max(longest, t - start)
        return round(longest, 2)

    rng = random.Random(0)
    for _ in range(200):
        polls = [(i * 0.5, rng.random() < 0.7) for i in range(rng.randint(0, 30))]
        failures = sorted(rng.uniform(-1, 16) for _ in range(rng.randint(0, 10)))
        since = rng.uniform(0, 10)
        assert probes.ready_while_failing_s(polls, failures, since) == walking_back(polls, failures, since)


def test_histogram_quantile_is_the_bucket_holding_it():
    before = {0.1: 5, 1.0: 5, math.inf: 5}
    after = {0.1: 95, 1.0: 104, math.inf: 105}
    assert reliability.histogram_quantile(before, after, 0.5) == 0.1
    assert reliability.histogram_quantile(before, after, 0.99) == 1.0
    assert reliability.histogram_quantile(before, after, 0.995) == math.inf
    assert reliability.histogram_quantile(after, after, 0.5) is None


def test_memory_growth_is_measured_after_the_warmup():
    samples = [(0.0, {"target": 100}), (10.0, {"target": 200}), (20.0, {"target": 204}), (30.0, {"target": 212})]
    growth = reliability.memory_growth(samples, warmup_s=10.0)
    assert growth == {"target": {"after_warmup": 200, "end": 212, "growth": 0.06}}


def test_the_fuzz_counts_server_faults_not_refusals():
    """A refusal of the request (Triton's or ours) is what a fuzzed request should get; an internal error, a failed
    generation or no answer is the server's fault."""
    from adaflash_tools.fuzz import server_error_over_grpc

    assert not server_error_over_grpc(True, "INVALID_ARGUMENT: top_p: must be in (0, 1], got 0.0")
    assert not server_error_over_grpc(True, "[StatusCode.INVALID_ARGUMENT] unexpected datatype INT32 for top_p")
    assert not server_error_over_grpc(False, "accepted")
    assert server_error_over_grpc(True, "generation failed: internal error: boom")
    assert server_error_over_grpc(True, "[StatusCode.INTERNAL] Traceback (most recent call last)")
    assert server_error_over_grpc(False, "no answer")


def test_fuzzed_requests_keep_their_load_small_and_their_bodies_sendable():
    """Generated gRPC requests never ask for more than MAX_TOKENS tokens (the fuzz is about input, not load); OpenAI
    bodies are bytes, JSON objects with a model and a prompt or messages unless they are junk on purpose."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from adaflash_tools.fuzz import MAX_TOKENS, grpc_requests, openai_requests

    seen = {"json": 0, "junk": 0}

    @settings(max_examples=200, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data):
        tensors = data.draw(grpc_requests())
        max_tokens = tensors.get("max_tokens")
        if max_tokens is not None and max_tokens[0] == "INT32":
            assert max_tokens[1].flat[0] <= MAX_TOKENS
        route, body = data.draw(openai_requests("m"))
        assert route in ("completions", "chat/completions") and isinstance(body, bytes)
        try:
            parsed = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            seen["junk"] += 1
            return
        if isinstance(parsed, dict) and parsed.get("model") == "m":
            seen["json"] += 1
            assert ("messages" if route == "chat/completions" else "prompt") in parsed

    check()
    assert seen["json"] > 100 and seen["junk"] > 0


def test_chaos_counts_a_failure_outside_every_fault_and_only_that():
    """Requests failing while a killed process is down are the fault's; one failing while the server had been back
    for more than a second is not explained by any kill."""
    from adaflash_tools.chaos import Kill, Request, unexplained_failures

    kills = [Kill("adaflash", at_s=10.0, pid=1, to_not_ready_s=0.1, to_ready_s=3.0, to_served_s=4.0)]

    def failed(start: float, end: float) -> Request:
        return Request("grpc", True, "ar", started=100 + start, ended=100 + end, ok=False, error="UNAVAILABLE")

    inside = [failed(9.0, 10.2), failed(12.0, 12.1), failed(14.5, 14.9)]
    outside = [failed(2.0, 3.0), failed(15.2, 15.3)]
    ok = Request("grpc", True, "ar", started=120.0, ended=121.0, ok=True)
    assert unexplained_failures([*inside, *outside, ok], kills, began=100.0) == outside


def test_chaos_requires_recovery_in_time_and_readiness_to_turn_false():
    """A kill passes when service is back within RECOVERED_S and readiness turned false, except the drafter's (the
    server decodes without it, exactly, so it may rightly stay ready)."""
    from adaflash_tools.chaos import RECOVERED_S, Kill

    assert Kill("tritonserver", 1.0, 1, 0.0, 5.0, 6.0).passed()
    assert not Kill("tritonserver", 1.0, 1, 0.0, 5.0, RECOVERED_S + 1).passed()
    assert not Kill("adaflash", 1.0, 1, None, 5.0, 6.0).passed()
    assert Kill("drafter", 1.0, 1, None, 5.0, 6.0).passed()
    assert not Kill("drafter", 1.0, 1, 0.1, None, None).passed()


def test_chaos_counts_a_request_past_its_deadline_as_hung_and_a_refusal_not():
    from adaflash_tools.chaos import Request

    assert Request("grpc", True, "ar", 0.0, error="StatusCode.DEADLINE_EXCEEDED").hung
    assert Request("openai", True, "ar", 0.0, error="TimeoutError: ").hung
    assert not Request("openai", False, "ar", 0.0, error="HTTP 503: unavailable").hung
